"""The reload frontends end to end: Clash PATCH/PUT /configs, SIGHUP, honkctl reload, the
shutdown boundary and the ``honk check`` dry run, each driving the one reconciler on loopback.

What is pinned here is what a caller of each frontend sees (status, body, exit code, printed
line, log line) and what the reconciler promises them: one command at a time, SIGHUPs merged,
an accepted edit applied even when its caller has left, nothing bound by a dry run."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner, Result
from helpers.apidaemon import api_base, api_block, bearer, metric_samples, quiet_global, running_daemon
from helpers.engines import poll
from helpers.reloading import Flow
from helpers.servers import EchoServer, free_port

from honk.cli.ctl import cli as honkctl
from honk.control.errors import STOPPED_TEXT, Stopped
from honk.daemon.app import Daemon

SOON = 5.0  # seconds: the bound for an expected event on loopback
SECRET = "s3cret"
REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT = 60.0  # seconds for a cold interpreter to import honk and finish a dry run
NO_ENV = {
    "HONK_API": None,
    "HONK_API_SECRET": None,
    "HONK_SECRET": None,
}  # the caller's shell must not leak in
EXIT_CONFIG, EXIT_USAGE = 1, 2  # honk check: a refused configuration; click's usage error
OUT_OF_RANGE_PORT = 70000


def config(
    data_dir: Path,
    *,
    port: int = 0,
    nodes: str = "",
    rules: str = "",
    fallback: str = "direct",
    inbounds: str = "",
    api: bool = True,
    controller: str = "127.0.0.1:0",
) -> str:
    """A daemon's file: the mixed inbound ``lan`` (plus ``inbounds``), nodes, routing, the API."""
    text = quiet_global(data_dir) + f"inbound {{\n    lan: 'mixed://127.0.0.1:{port}'\n{inbounds}}}\n"
    if nodes:
        text += f"node {{\n{nodes}}}\n"
    text += f"routing {{\n{rules}    fallback: {fallback}\n}}\n"
    if api:
        text += api_block(SECRET).replace("127.0.0.1:0", controller)
    return text


@pytest.fixture(autouse=True)
def _honk_log_level():
    """PATCH log-level moves the ``honk`` logger's level: give later tests the one they had."""
    logger = logging.getLogger("honk")
    level = logger.level
    yield
    logger.setLevel(level)


@contextlib.asynccontextmanager
async def api_session(daemon: Daemon) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    async with aiohttp.ClientSession(headers=bearer(SECRET)) as http:
        yield http, api_base(daemon)


async def patch(http: aiohttp.ClientSession, base: str, body: dict) -> tuple[int, dict | None]:
    async with http.patch(f"{base}/configs", json=body) as resp:
        return resp.status, (await resp.json() if resp.status != 204 else None)


async def get_configs(http: aiohttp.ClientSession, base: str) -> dict:
    async with http.get(f"{base}/configs") as resp:
        assert resp.status == 200
        return await resp.json()


async def refuses(port: int) -> bool:
    """Whether a connect to 127.0.0.1:``port`` is refused within SOON."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SOON
    while loop.time() < deadline:
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            return True
        writer.close()
        await asyncio.sleep(0.01)
    return False


def reload_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "config reloaded: " in line]


class Commits:
    """``daemon.applier.commit`` wrapped: counts commits, records the most that ever ran at
    once and which reconciler command ran each; while ``held`` each commit waits for
    :meth:`release` (a reload command kept running)."""

    def __init__(self, daemon: Daemon, *, held: bool) -> None:
        self.entered = 0
        self.active = 0
        self.most = 0
        self.commands: list[str | None] = []
        self._open = asyncio.Event()
        if not held:
            self._open.set()
        commit = daemon.applier.commit

        async def watched(prepared):  # noqa: ANN001, ANN202 - the Applier.commit signature
            self.entered += 1
            self.active += 1
            self.most = max(self.most, self.active)
            self.commands.append(daemon.reconciler.running)
            try:
                await self._open.wait()
                return await commit(prepared)
            finally:
                self.active -= 1

        daemon.applier.commit = watched

    def release(self) -> None:
        self._open.set()


def watch_updates(daemon: Daemon) -> list[str]:
    """Record each ``daemon.update`` call as it is queued (the API's PATCH reaches the daemon)."""
    calls: list[str] = []
    update = daemon.update

    async def watched(edit, allow_disruptive=False, runtime=None):  # noqa: ANN001, ANN202
        calls.append("update")  # the command is queued in this same step, before any await returns
        return await update(edit, allow_disruptive, runtime)

    daemon.update = watched  # type: ignore[method-assign]
    return calls


async def barrier(daemon: Daemon) -> None:
    """Return once every command queued before it has run (a no-op reconciler command)."""
    await daemon.update(None, runtime=lambda: None)


# --- 1. PATCH /configs mixed-port ----------------------------------------------------------------


async def test_patch_mixed_port_rebinds_the_inbound_and_keeps_its_open_flow(tmp_path, caplog):
    caplog.set_level(logging.INFO, "honk")
    first, second = free_port(), free_port()
    with EchoServer() as echo:
        async with (
            running_daemon(tmp_path, config(tmp_path / "var", port=first)) as daemon,
            api_session(daemon) as (http, base),
        ):
            flow = await Flow.open(first, echo.port)
            assert await flow.echoes()
            epoch = daemon.epoch

            assert await patch(http, base, {"mixed-port": second}) == (204, None)
            moved = await Flow.open(second, echo.port)  # the new port speaks SOCKS5
            assert await moved.echoes()
            assert await refuses(first), f"the old port {first} still accepts"
            assert await flow.echoes()  # the session belongs to the tag, not the socket
            assert (await get_configs(http, base))["mixed-port"] == second
            (line,) = reload_lines(caplog.text)  # the PATCH went through the reconciler, no POST /v1/reload
            assert "rebound [lan]" in line and "removed" not in line, line
            assert daemon.epoch == epoch  # an inbound change publishes no plane

            assert await patch(http, base, {"mixed-port": 0}) == (204, None)
            assert await flow.ended() and await moved.ended()  # the tag left: its sessions closed
            assert await refuses(second)
            assert "removed [lan]" in reload_lines(caplog.text)[-1]
            assert "lan" not in daemon.inbounds
            assert (await get_configs(http, base))["mixed-port"] == 0
            await flow.close()
            await moved.close()


@pytest.mark.parametrize("value", ["7890", OUT_OF_RANGE_PORT, -1, True, 1.5])
async def test_patch_mixed_port_with_a_bad_value_is_400_with_a_message_and_changes_nothing(tmp_path, value):
    port = free_port()
    async with (
        running_daemon(tmp_path, config(tmp_path / "var", port=port)) as daemon,
        api_session(daemon) as (http, base),
    ):
        executed = daemon.reconciler.executed
        status, body = await patch(http, base, {"mixed-port": value})
        assert status == 400
        assert body["message"] == "mixed-port must be a port number (0 removes the mixed inbound)"
        assert daemon.reconciler.executed == executed  # refused before it reached the reconciler
        assert daemon.inbounds["lan"].bound.port == port
        assert (await get_configs(http, base))["mixed-port"] == port


async def test_patch_mixed_port_onto_a_taken_port_is_400_with_the_bind_error_and_keeps_the_old_port(tmp_path):
    port = free_port()
    with EchoServer() as echo, socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        async with (
            running_daemon(tmp_path, config(tmp_path / "var", port=port)) as daemon,
            api_session(daemon) as (http, base),
        ):
            flow = await Flow.open(port, echo.port)
            refusals = daemon.stats.reloads[("refused", "bind")]
            status, body = await patch(http, base, {"mixed-port": taken})
            assert status == 400
            assert body["message"].startswith(f"inbound lan: binding 127.0.0.1:{taken} failed: ")
            assert daemon.stats.reloads[("refused", "bind")] == refusals + 1
            assert await flow.echoes()
            again = await Flow.open(port, echo.port)  # the running listener was left as it was
            assert await again.echoes()
            assert (await get_configs(http, base))["mixed-port"] == port
            await flow.close()
            await again.close()


async def test_a_refused_patch_leaves_the_mode_and_log_level_it_carried_unapplied(tmp_path):
    """RL-63 puts mode in the route spec and log-level in the desired state, and a refused
    apply changes nothing: a PATCH answered 400 must not have moved either."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        async with (
            running_daemon(tmp_path, config(tmp_path / "var")) as daemon,
            api_session(daemon) as (http, base),
        ):
            status, _body = await patch(
                http, base, {"mode": "global", "log-level": "debug", "mixed-port": taken}
            )
            assert status == 400
            configs = await get_configs(http, base)
            assert (configs["mode"], configs["log-level"]) == ("rule", "info")


# --- 2. serialization ------------------------------------------------------------------------------


async def test_concurrent_patches_and_a_sighup_run_one_at_a_time_and_all_land(tmp_path):
    async with (
        running_daemon(tmp_path, config(tmp_path / "var")) as daemon,
        api_session(daemon) as (http, base),
    ):
        before = await get_configs(http, base)
        assert (before["mode"], before["log-level"]) == ("rule", "info")
        commits = Commits(daemon, held=True)
        updates = watch_updates(daemon)
        daemon.config_path.write_text(config(tmp_path / "var", fallback="block"))
        daemon.reload_on_signal()
        await poll(lambda: commits.entered == 1, "the SIGHUP reload to reach its commit")
        patches = [
            asyncio.ensure_future(patch(http, base, body))
            for body in ({"mode": "global"}, {"log-level": "debug"})
        ]
        await poll(lambda: len(updates) == 2, "both PATCHes to be queued")
        held = await get_configs(http, base)  # reads do not queue; the writes wait for the commit
        assert (held["mode"], held["log-level"]) == ("rule", "info")
        commits.release()
        assert await asyncio.gather(*patches) == [(204, None), (204, None)]
        after = await get_configs(http, base)
        assert (after["mode"], after["log-level"]) == ("global", "debug")
        assert daemon.spec.routing.fallback == "block"  # the SIGHUP reload was applied too
        # the log level is a desired-state field: its PATCH commits (without steps); the mode is not
        assert commits.most == 1 and commits.commands == ["sighup-reload", "update"]


async def test_a_patch_whose_client_left_before_the_answer_is_still_applied(tmp_path):
    moved = free_port()
    async with (
        running_daemon(tmp_path, config(tmp_path / "var")) as daemon,
        api_session(daemon) as (http, base),
    ):
        commits = Commits(daemon, held=True)
        updates = watch_updates(daemon)
        daemon.reload_on_signal()  # a running command the PATCH queues behind
        await poll(lambda: commits.entered == 1, "the SIGHUP reload to reach its commit")
        async with aiohttp.ClientSession(headers=bearer(SECRET)) as leaving:
            request = asyncio.ensure_future(patch(leaving, base, {"mixed-port": moved, "mode": "direct"}))
            await poll(lambda: len(updates) == 1, "the PATCH to be queued")
            request.cancel()  # the client gives up and its connection closes
            with pytest.raises(asyncio.CancelledError):
                await request
        commits.release()
        await barrier(daemon)
        configs = await get_configs(http, base)
        assert configs["mixed-port"] == moved and configs["mode"] == "direct"
        assert daemon.inbounds["lan"].bound.port == moved
        assert commits.commands == ["sighup-reload", "update"]


async def test_a_patch_keeps_the_log_level_an_earlier_patch_set(tmp_path):
    """RL-62/RL-63: log-level is a desired-state field, and an update edits the state the
    previous command left, so a later PATCH that applies (a port move) must not undo it."""
    async with (
        running_daemon(tmp_path, config(tmp_path / "var")) as daemon,
        api_session(daemon) as (http, base),
    ):
        assert await patch(http, base, {"log-level": "debug"}) == (204, None)
        assert (await get_configs(http, base))["log-level"] == "debug"
        assert await patch(http, base, {"mixed-port": free_port()}) == (204, None)
        assert (await get_configs(http, base))["log-level"] == "debug"


async def test_one_patch_with_log_level_and_mixed_port_applies_both(tmp_path):
    moved = free_port()
    async with (
        running_daemon(tmp_path, config(tmp_path / "var")) as daemon,
        api_session(daemon) as (http, base),
    ):
        assert await patch(http, base, {"log-level": "debug", "mixed-port": moved}) == (204, None)
        configs = await get_configs(http, base)
        assert configs["mixed-port"] == moved
        assert configs["log-level"] == "debug"


# --- 3. SIGHUP merging -----------------------------------------------------------------------------


async def test_sighups_during_a_running_reload_queue_exactly_one_more_which_reads_the_file_late(tmp_path):
    var = tmp_path / "var"
    async with running_daemon(tmp_path, config(var)) as daemon:
        commits = Commits(daemon, held=True)
        executed = daemon.reconciler.executed
        daemon.config_path.write_text(config(var, nodes="    extra: 'socks5://127.0.0.1:9'\n"))
        daemon.reload_on_signal()
        await poll(lambda: commits.entered == 1, "the first SIGHUP reload to reach its commit")
        assert daemon.reconciler.running == "sighup-reload"
        for _ in range(3):  # the first queues one more reload; the next two find it waiting
            daemon.reload_on_signal()
        # the queued reload reads the file when it starts, so it sees this later edit
        daemon.config_path.write_text(
            config(var, nodes="    extra: 'socks5://127.0.0.1:9'\n", fallback="block")
        )
        commits.release()
        await poll(lambda: daemon.reconciler.executed == executed + 2, "the two reloads to run")
        await barrier(daemon)
        assert commits.entered == 2 and commits.most == 1
        assert commits.commands == ["sighup-reload", "sighup-reload"]
        assert daemon.reconciler.executed == executed + 3  # the two reloads and the barrier
        assert "extra" in daemon.plane.outbounds and daemon.spec.routing.fallback == "block"


async def test_a_sighup_while_one_waits_unstarted_is_merged_into_it(tmp_path):
    async with running_daemon(tmp_path, config(tmp_path / "var", api=False)) as daemon:
        commits = Commits(daemon, held=False)
        executed = daemon.reconciler.executed
        daemon.reload_on_signal()
        daemon.reload_on_signal()  # the first has not started yet (not even queued): merged
        await barrier(daemon)
        assert commits.entered == 1
        assert daemon.reconciler.executed == executed + 2  # one reload and the barrier


# --- 4. after shutdown -----------------------------------------------------------------------------


async def test_after_shutdown_reload_update_and_select_raise_stopped_and_shutdown_returns_at_once(tmp_path):
    path = tmp_path / "honk.dae"
    path.write_text(
        config(tmp_path / "var", nodes="    a: 'socks5://127.0.0.1:9'\n", api=False)
        + "group {\n    sel {\n        filter: name(direct, a)\n    }\n}\n"
    )
    daemon = Daemon(path)
    await daemon.start()
    await daemon.shutdown(0.0)
    for call in (
        daemon.reload(),
        daemon.reload(allow_disruptive=True),
        daemon.select("sel", "a"),
        daemon.update(None, runtime=lambda: None),
    ):
        with pytest.raises(Stopped) as caught:
            await asyncio.wait_for(call, SOON)
        assert str(caught.value) == STOPPED_TEXT == "the reconciler has shut down"
    executed = daemon.reconciler.executed
    daemon.reload_on_signal()  # a SIGHUP after shutdown is dropped, never raised into the loop
    await asyncio.wait_for(daemon.shutdown(0.0), SOON)
    assert daemon.reconciler.executed == executed


# --- 5. honk check ---------------------------------------------------------------------------------


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "honk.cli.daemon", "check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=CLI_TIMEOUT,
    )


def can_bind(port: int) -> bool:
    """Whether honk could bind 127.0.0.1:``port`` now: with SO_REUSEADDR, as its listeners do, so
    a connection of another process lingering in TIME_WAIT on the port does not count; a
    listening socket does."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def test_check_binds_nothing_so_a_held_port_passes_and_free_ports_stay_free(tmp_path):
    extra, controller = free_port(), free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        cfg = tmp_path / "honk.dae"
        cfg.write_text(
            config(
                tmp_path / "var",
                port=taken,
                inbounds=f"    extra: 'mixed://127.0.0.1:{extra}'\n",
                controller=f"127.0.0.1:{controller}",
            )
        )
        busy: list[int] = []  # a configured free port found bound while check ran
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                busy.extend(p for p in (extra, controller) if not can_bind(p))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            positional = run_check(str(cfg))
        finally:
            done.set()
            watcher.join()
        dash_c = run_check("-c", str(cfg))
        for out in (positional, dash_c):
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith(f"{cfg}: ok: 2 inbound(s)")
        assert busy == []
        assert can_bind(extra) and can_bind(controller)


def test_check_refuses_what_planning_refuses_with_the_apply_error_text(tmp_path):
    """The loader accepts the API and an inbound on one address; the plan's validation does not,
    so check (like a start) refuses it before anything could be bound."""
    port = free_port()
    cfg = tmp_path / "honk.dae"
    cfg.write_text(config(tmp_path / "var", port=port, controller=f"127.0.0.1:{port}"))
    for args in ((str(cfg),), ("-c", str(cfg))):
        out = run_check(*args)
        assert out.returncode == EXIT_CONFIG
        assert (
            out.stderr.strip() == f"configuration invalid: inbound api: inbound lan is already bound to "
            f"127.0.0.1:{port}"
        )
        assert out.stdout == ""
    assert can_bind(port)


def test_check_of_a_file_that_does_not_load_exits_1_and_without_a_file_is_a_usage_error(tmp_path):
    cfg = tmp_path / "honk.dae"
    cfg.write_text(config(tmp_path / "var", rules="    dport(9) -> nope\n"))
    for args in ((str(cfg),), ("-c", str(cfg))):
        out = run_check(*args)
        assert out.returncode == EXIT_CONFIG
        assert f"{cfg}:" in out.stderr and "unknown-outbound" in out.stderr
        assert out.stderr.strip().endswith(f"{cfg}: invalid (1 error(s))")
    missing = run_check()
    assert missing.returncode == EXIT_USAGE
    assert "give the configuration file as FILE or -c" in missing.stderr


# --- 6. honkctl reload -----------------------------------------------------------------------------


async def ctl(daemon: Daemon, *args: str) -> Result:
    """honkctl in a worker thread, so the daemon's loop keeps serving meanwhile."""
    head = ["--api", api_base(daemon), "--secret", SECRET]
    return await asyncio.to_thread(CliRunner().invoke, honkctl, [*head, *args], env=NO_ENV)


async def test_honkctl_reload_prints_the_new_version_of_a_moved_node_and_json_has_the_report(tmp_path):
    var = tmp_path / "var"

    def node_at(port: int) -> str:
        return config(var, nodes=f"    proxy: 'socks5://127.0.0.1:{port}'\n", rules="    dport(9) -> proxy\n")

    async with running_daemon(tmp_path, node_at(9)) as daemon:
        daemon.config_path.write_text(node_at(19))
        printed = await ctl(daemon, "reload")
        assert printed.exit_code == 0, printed.stderr
        assert printed.stdout.startswith(
            "config reloaded: built [outbound proxy@v2]; drained [proxy@v1]; reused [dns, outbound direct@v1"
        ), printed.stdout
        daemon.config_path.write_text(node_at(29))
        scripted = await ctl(daemon, "--json", "reload")
        assert scripted.exit_code == 0, scripted.stderr
        body = json.loads(scripted.stdout)
        assert body["applied"] is True and body["generation"] == daemon.generation == body["epoch"]
        assert body["built"] == ["outbound proxy@v3"] and body["drained"] == ["proxy@v2"]
        assert body["swapped"] == body["rebound"] == body["restarted"] == body["removed"] == []
        assert body["reused"][:3] == ["dns", "outbound direct@v1", "outbound block@v1"]
        assert "route" in body["reused"] and "inbound lan" in body["reused"]
        assert body["summary"].startswith("built [outbound proxy@v3]; drained [proxy@v2]; reused [dns")


# --- 7. PUT /configs refused -----------------------------------------------------------------------


def reloads(metrics: dict, result: str, error: str) -> float:
    return metrics[("honk_reloads_total", frozenset({("result", result), ("error", error)}))]


async def test_put_configs_with_an_unknown_outbound_is_400_with_the_located_error_and_counted(tmp_path):
    var = tmp_path / "var"
    async with running_daemon(tmp_path, config(var)) as daemon, api_session(daemon) as (http, base):
        epoch, plane = daemon.epoch, daemon.plane

        async def scrape() -> dict:
            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                return metric_samples(await resp.text())

        counted = reloads(await scrape(), "refused", "config")
        text = config(var, rules="    dport(9) -> nope\n")
        daemon.config_path.write_text(text)
        line = text.splitlines().index("    dport(9) -> nope") + 1
        async with http.put(f"{base}/configs?force=true", json={"path": "", "payload": ""}) as resp:
            assert resp.status == 400
            body = await resp.json()
        assert set(body) == {"message"}
        assert body["message"].startswith(f"{daemon.config_path}:{line}: routing.rules[0]: "), body
        assert daemon.epoch == epoch and daemon.plane is plane
        after = await scrape()
        assert reloads(after, "refused", "config") == counted + 1
        assert reloads(after, "applied", "") == 0
