"""honkctl against a live daemon over real HTTP: every command's --json output parses and holds
what the daemon has, writes reach the daemon, and failures exit with the documented codes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner, Result
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, api_port, quiet_global, running_daemon
from helpers.engines import poll
from helpers.origins import generate_204
from helpers.servers import EchoServer, free_port

from honk import __version__
from honk.cli import ctl as ctl_module
from honk.cli import tables
from honk.cli.ctl import EXIT_CODES, UNAUTHORIZED_MESSAGE, Spinner, cli
from honk.core.net import Network
from honk.daemon.app import Daemon

SECRET = "s3cret"
NON_ASCII = "香港 fast"  # a group name with a space and wide characters, sent as one encoded segment
NO_ENV = {
    "HONK_API": None,
    "HONK_API_SECRET": None,
    "HONK_SECRET": None,
}  # the caller's shell must not leak in
ENTRY_POINT = Path(sys.executable).with_name("honkctl")

ROUTED = """node {{
    a: 'socks5://127.0.0.1:9'
    b: 'socks5://127.0.0.1:19'
}}
group {{
    pick {{
        filter: name(direct, a)
    }}
    auto {{
        filter: name(a, b)
        policy: min_moving_avg
    }}
    spread {{
        filter: name(a, b)
        policy: round_robin
    }}
    {non_ascii} {{
        filter: name(a, b)
    }}
}}
routing {{
    fallback: {fallback}
}}
"""
GROUPS = ["pick", "auto", "spread", NON_ASCII]


def config_text(fallback: str = "direct") -> str:
    routed = ROUTED.format(non_ascii=NON_ASCII, fallback=fallback)
    return quiet_global() + LAN_INBOUND + routed + api_block(SECRET)


@dataclass
class Live:
    daemon: Daemon
    url: str
    port: int
    config: Path

    async def ctl(
        self, *args: str, secret: str | None = SECRET, env: dict | None = None, stdin: str | None = None
    ) -> Result:
        """Run honkctl in a worker thread (the daemon's loop keeps serving meanwhile)."""
        head = ["--api", self.url] + (["--secret", secret] if secret is not None else [])
        return await invoke(*head, *args, env=env, stdin=stdin)

    async def json(self, *args: str) -> dict:
        result = await self.ctl("--json", *args)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return json.loads(result.stdout)


async def invoke(*args: str, env: dict | None = None, stdin: str | None = None) -> Result:
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, cli, list(args), env={**NO_ENV, **(env or {})}, input=stdin)


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Live]:
    async with running_daemon(tmp_path, config_text()) as daemon:
        yield Live(daemon, api_base(daemon), api_port(daemon), daemon.config_path)


# --- reading ------------------------------------------------------------------------------------


async def test_status_and_version_json_describe_the_running_daemon(tmp_path):
    async with running(tmp_path) as live:
        status = await live.json("status")
        assert status["generation"] == 1 and status["mode"] == "rule"
        assert status["groups"] == len(GROUPS) and status["nodes"]["total"] == 2
        assert status["api"] == {"address": f"127.0.0.1:{live.port}"}
        version = await live.json("version")
        assert version["version"] == __version__ and version["pid"] == os.getpid()

        human = await live.ctl("status")
        assert human.exit_code == 0
        assert "generation" in human.stdout and f"127.0.0.1:{live.port}" in human.stdout
        human = await live.ctl("version")
        assert human.stdout.splitlines()[0] == f"honkctl {__version__}"


async def test_groups_and_group_json_hold_the_daemons_groups_in_config_order(tmp_path):
    async with running(tmp_path) as live:
        groups = await live.json("groups")
        assert [g["name"] for g in groups["groups"]] == GROUPS
        pick = await live.json("group", "pick")
        assert pick["policy"] == "selector" and sorted(pick["members"]) == ["a", "direct"]
        odd = await live.json("group", NON_ASCII)
        assert odd["name"] == NON_ASCII and odd["members"] == ["a", "b"]

        table = await live.ctl("groups")
        assert table.exit_code == 0
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["NAME", "POLICY", "TCP", "UDP", "MEMBERS"]
        assert [line.split("  ")[0].strip() for line in lines[1:]] == GROUPS


async def test_nodes_and_node_json_hold_the_daemons_nodes(tmp_path):
    async with running(tmp_path) as live:
        nodes = {n["name"]: n for n in (await live.json("nodes"))["nodes"]}
        assert {"a", "b"} <= set(nodes)
        assert nodes["a"]["protocol"] == "socks5" and nodes["a"]["server"] == "127.0.0.1:9"
        a = await live.json("node", "a")
        assert a["name"] == "a" and a["id"] == nodes["a"]["id"]

        table = await live.ctl("nodes")
        assert table.exit_code == 0
        assert table.stdout.splitlines()[0].split() == ["NAME", "PROTOCOL", "TCP4", "TCP6", "UDP", "LAST"]
        missing = await live.ctl("node", "nope")
        assert missing.exit_code == 1 and missing.stderr.startswith("error: node_not_found: ")


# --- writes -------------------------------------------------------------------------------------


async def test_select_changes_the_daemons_choice_per_network(tmp_path):
    async with running(tmp_path) as live:
        got = await live.json("select", "pick", "a", "--network", "tcp")
        assert got["group"] == "pick" and got["member"] == "a" and got["changed"] == ["tcp"]
        assert live.daemon.plane.groups.choices()["pick"] == {Network.TCP: "a"}

        human = await live.ctl("select", NON_ASCII, "b")
        assert human.exit_code == 0, human.stderr
        assert human.stdout.strip() == f"{NON_ASCII}: b selected for tcp, udp"
        assert live.daemon.plane.groups.choices()[NON_ASCII] == {Network.TCP: "b", Network.UDP: "b"}
        shown = await live.json("group", NON_ASCII)
        assert shown["selection"] == {"tcp": "b", "udp": "b"}


async def test_select_and_unpin_on_a_urltest_group_set_and_clear_the_pin(tmp_path):
    async with running(tmp_path) as live:
        await live.json("select", "auto", "b")
        assert live.daemon.plane.groups.pinned("auto") == {Network.TCP: "b", Network.UDP: "b"}
        cleared = await live.json("unpin", "auto", "--network", "udp")
        assert cleared == {"group": "auto", "cleared": ["udp"]}
        assert live.daemon.plane.groups.pinned("auto") == {Network.TCP: "b"}
        human = await live.ctl("unpin", "auto")
        assert human.exit_code == 0 and human.stdout.strip() == "auto: pin cleared for tcp"
        assert live.daemon.plane.groups.pinned("auto") == {}


async def test_a_refused_write_exits_1_with_the_code_and_message(tmp_path):
    async with running(tmp_path) as live:
        spread = await live.ctl("select", "spread", "a")
        assert spread.exit_code == 1 and spread.stderr.startswith("error: not_a_selector: ")
        member = await live.ctl("select", "pick", "b")
        assert member.exit_code == 1 and member.stderr.startswith("error: member_not_found: ")
        assert "pick" not in live.daemon.plane.groups.choices()


async def test_an_unknown_group_exits_1_with_group_not_found(tmp_path):
    async with running(tmp_path) as live:
        human = await live.ctl("group", "nope")
        assert human.exit_code == 1
        assert human.stderr.startswith("error: group_not_found: ") and human.stdout == ""
        scripted = await live.ctl("--json", "select", "nope", "a")
        assert scripted.exit_code == 1
        assert json.loads(scripted.stdout)["error"]["code"] == "group_not_found"


# --- delay, connections, reload, check, logs ----------------------------------------------------


async def test_delay_on_a_group_measures_each_member_without_a_spinner_off_a_terminal(tmp_path):
    async with running(tmp_path) as live, generate_204() as origin:
        url = f"http://127.0.0.1:{origin.port}/generate_204"
        got = await live.json("delay", "pick", "--url", url, "--timeout", "3000")
        assert got["target"] == "pick" and got["kind"] == "group"
        assert got["results"]["direct"]["delay_ms"] > 0 and origin.requests >= 1
        assert got["results"]["a"]["delay_ms"] is None and got["results"]["a"]["error"]

        human = await live.ctl("delay", "direct", "--url", url)
        assert human.exit_code == 0, human.stderr
        assert human.stderr == ""  # stderr is not a terminal: no spinner frames
        assert human.stdout.splitlines()[1].split()[0] == "direct"
        assert human.stdout.splitlines()[1].endswith(" ms")


async def test_connections_lists_a_live_flow_and_close_by_id_or_node_ends_it(tmp_path):
    async with running(tmp_path) as live:
        with EchoServer() as echo:
            port = live.daemon.inbounds["lan"].bound.port
            reader, writer, rep, _ = await socks5_open(port, "127.0.0.1", echo.port)
            assert rep == 0
            try:
                await poll(lambda: len(live.daemon.tracker.snapshot()) == 1, "the flow to be tracked")
                listing = await live.json("connections")
                (conn,) = listing["connections"]
                assert conn["target"] == f"127.0.0.1:{echo.port}" and conn["chain"][-1] == "direct"

                table = await live.ctl("connections")
                assert table.exit_code == 0 and conn["id"] in table.stdout

                closed = await live.json("connections", "close", conn["id"])
                assert closed == {"closed": 1}
                await poll(lambda: not live.daemon.tracker.snapshot(), "the flow to be closed")
                assert await asyncio.wait_for(reader.read(), 5) == b""

                none = await live.ctl("connections", "close", "--all")
                assert none.exit_code == 0 and none.stdout.strip() == "closed 0 connection(s)"

                again, again_writer, rep, _ = await socks5_open(port, "127.0.0.1", echo.port)
                assert rep == 0
                try:
                    await poll(lambda: len(live.daemon.tracker.snapshot()) == 1, "the second flow")
                    by_node = await live.ctl("connections", "close", "--node", "direct")
                    assert by_node.exit_code == 0 and by_node.stdout.strip() == "closed 1 connection(s)"
                    assert await asyncio.wait_for(again.read(), 5) == b""
                finally:
                    await close_writer(again_writer)
                gone = await live.ctl("connections", "close", conn["id"])
                assert gone.exit_code == 1 and gone.stderr.startswith("error: connection_not_found: ")
                usage = await live.ctl("connections", "close")
                assert usage.exit_code == 2 and "exactly one of" in usage.stderr
            finally:
                await close_writer(writer)


async def test_reload_prints_what_the_apply_did_and_a_rejected_file_exits_1(tmp_path):
    async with running(tmp_path) as live:
        unchanged = await live.json("reload")
        assert unchanged["applied"] and unchanged["built"] == [] and unchanged["generation"] == 1
        live.config.write_text(config_text(fallback="block"))
        printed = await live.ctl("reload")
        assert printed.exit_code == 0, printed.stderr
        assert printed.stdout.startswith("config reloaded: built [route]; reused [dns, outbound direct@v1")
        assert live.daemon.generation == 2
        live.config.write_text(config_text(fallback="no-such-outbound"))
        rejected = await live.ctl("reload")
        assert rejected.exit_code == 1
        assert rejected.stderr.startswith(f"error: reload_config: {live.config}:31: routing.fallback: ")
        assert live.daemon.generation == 2


async def test_users_put_and_remove_change_an_inbounds_users_without_a_reload(tmp_path):
    async with running(tmp_path) as live:
        live.config.write_text(config_text().replace("mixed://127.0.0.1:0", "mixed://alice:pa@127.0.0.1:0"))
        await live.daemon.reload()
        epoch = live.daemon.epoch
        put = await live.ctl("users", "put", "lan", "bob", "--password-stdin", stdin="pb\n")
        assert put.exit_code == 0 and put.stdout.strip() == "user bob of lan set", put.stderr
        assert [(u.username, u.password) for u in live.daemon.spec.inbounds[0].users] == [
            ("alice", "pa"),
            ("bob", "pb"),
        ]
        gone = await live.ctl("users", "remove", "lan", "alice")
        assert gone.exit_code == 0 and gone.stdout.strip() == "user alice removed from lan"
        again = await live.ctl("users", "remove", "lan", "alice")
        assert again.exit_code == 0 and again.stdout.strip() == "lan has no user alice; nothing changed"
        unknown = await live.ctl("users", "remove", "nosuch", "x")
        assert unknown.exit_code == 1
        assert unknown.stderr.strip() == "error: reload_invalid: user set nosuch: no such user set"
        assert live.daemon.epoch == epoch  # user edits never plan or publish


async def test_check_prints_the_summary_or_the_located_errors_with_exit_5(tmp_path):
    async with running(tmp_path) as live:
        ok = await live.ctl("check", str(live.config))
        assert ok.exit_code == 0, ok.stderr
        assert ok.stdout.startswith(f"{live.config}: ok: ")
        bad = tmp_path / "bad.dae"
        bad.write_text(config_text(fallback="no-such-outbound"))
        invalid = await live.ctl("check", str(bad))
        assert invalid.exit_code == 5
        line = 31  # `fallback:` in config_text()
        assert f"{bad}:{line}" in invalid.stderr and "unknown-outbound" in invalid.stderr
        assert invalid.stderr.strip().endswith(f"{bad}: invalid (1 error(s))")
        scripted = await live.ctl("--json", "check", str(bad))
        assert scripted.exit_code == 5
        body = json.loads(scripted.stdout)
        assert body["error"]["code"] == "config_invalid" and body["diagnostics"][0]["line"] == line
        other = tmp_path / "honk.yaml"
        other.write_text("a: 1\n")
        assert (await live.ctl("check", str(other))).exit_code == 2


async def test_logs_follow_streams_until_the_daemon_goes_away_which_exits_3(tmp_path, monkeypatch):
    printed = threading.Event()  # set once honkctl has formatted the reload line
    format_line = ctl_module._log_line

    def watched(line: str) -> str:
        text = format_line(line)
        if "config reloaded" in text:
            printed.set()
        return text

    monkeypatch.setattr(ctl_module, "_log_line", watched)
    async with running(tmp_path) as live:
        task = asyncio.ensure_future(live.ctl("logs", "-f"))
        await poll(lambda: live.daemon.logs.readers > 0, "honkctl to subscribe to the log stream")
        live.config.write_text(config_text(fallback="block"))
        assert await live.daemon.reload()
        assert await asyncio.to_thread(printed.wait, 10), "honkctl never printed the reload line"
    result = await asyncio.wait_for(task, 30)
    assert result.exit_code == 3, (result.stdout, result.stderr)
    assert "the stream broke" in result.stderr
    assert any(
        " INFO  honk.daemon: config reloaded: built [route]" in line for line in result.stdout.splitlines()
    )


async def test_logs_without_follow_prints_what_arrives_and_exits_once_the_stream_is_quiet(tmp_path):
    async with running(tmp_path) as live:
        readers = live.daemon.logs.readers
        task = asyncio.ensure_future(live.ctl("logs", "--json", "--level", "info"))
        await poll(lambda: live.daemon.logs.readers > readers, "honkctl to subscribe to the log stream")
        assert await live.daemon.reload()
        result = await asyncio.wait_for(task, 30)
        assert result.exit_code == 0, result.stderr
        events = [json.loads(line) for line in result.stdout.splitlines()]
        assert any(e["message"].startswith("config reloaded: ") for e in events)
        assert all(set(e) >= {"time", "level", "logger", "message"} for e in events)
        bad = await live.ctl("logs", "--level", "loud")
        assert bad.exit_code == 2


# --- address, secret, failures ------------------------------------------------------------------


async def test_a_wrong_or_missing_secret_exits_4_with_the_documented_message(tmp_path):
    async with running(tmp_path) as live:
        for secret in ("wrong", None):
            result = await live.ctl("groups", secret=secret)
            assert result.exit_code == 4
            assert result.stderr.strip() == UNAUTHORIZED_MESSAGE
        assert UNAUTHORIZED_MESSAGE == (
            "error: unauthorized: the API secret was rejected (set --secret or HONK_API_SECRET)"
        )


async def test_the_secret_comes_from_honk_api_secret_or_the_old_honk_secret(tmp_path):
    async with running(tmp_path) as live:
        for var in ("HONK_API_SECRET", "HONK_SECRET"):
            result = await live.ctl("status", secret=None, env={var: SECRET})
            assert result.exit_code == 0, (var, result.stderr)
        result = await invoke("--json", "status", env={"HONK_API": live.url, "HONK_API_SECRET": SECRET})
        assert result.exit_code == 0 and json.loads(result.stdout)["generation"] == 1


async def test_the_address_and_secret_come_from_a_config_file(tmp_path):
    async with running(tmp_path) as live:
        client_cfg = tmp_path / "client.dae"
        block = (
            f"experimental {{\n    clash_api {{\n        external_controller: '0.0.0.0:{live.port}'\n"
            f"        secret: '{SECRET}'\n    }}\n}}\n"
        )
        client_cfg.write_text("global {\n    data_dir: ./var\n}\n" + block)
        result = await invoke("-c", str(client_cfg), "--json", "status")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["api"]["address"] == f"127.0.0.1:{live.port}"

        # a file being edited (an error elsewhere) still names the API
        client_cfg.write_text("routing {\n    fallback: no-such-outbound\n}\n" + block)
        assert (await invoke("-c", str(client_cfg), "status")).exit_code == 0

        # the running file itself says port 0: the address is unknowable from it
        usage = await invoke("-c", str(live.config), "status")
        assert usage.exit_code == 2 and "port 0" in usage.stderr


async def test_an_unreachable_api_exits_3():
    url = f"http://127.0.0.1:{free_port()}"
    result = await invoke("--api", url, "--secret", SECRET, "status")
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: cannot reach the daemon at {url}: ")
    assert "refused" in result.stderr


def test_the_installed_entry_point_documents_its_exit_codes_and_exits_3_when_unreachable():
    assert ENTRY_POINT.exists(), f"{ENTRY_POINT} missing: install honk into the venv (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k not in NO_ENV}
    shown = subprocess.run([str(ENTRY_POINT), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0
    assert "Inspect and steer a running honk daemon" in shown.stdout
    for code, text in EXIT_CODES.items():
        assert f"{code}  {text}" in shown.stdout
    down = subprocess.run(
        [str(ENTRY_POINT), "--api", f"http://127.0.0.1:{free_port()}", "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert down.returncode == 3 and "cannot reach the daemon" in down.stderr


def test_the_spinner_draws_only_on_a_terminal_and_erases_itself():
    class Terminal(io.StringIO):
        def __init__(self, tty: bool) -> None:
            super().__init__()
            self.tty = tty
            self.drawn = threading.Event()

        def isatty(self) -> bool:
            return self.tty

        def write(self, text: str) -> int:
            self.drawn.set()
            return super().write(text)

    tty = Terminal(True)
    with Spinner("testing pick", tty):
        assert tty.drawn.wait(5)
    frames = tty.getvalue()
    assert "\r| testing pick" in frames
    assert frames.endswith("\r" + " " * len("| testing pick") + "\r")  # the line is blank again
    pipe = Terminal(False)
    with Spinner("testing pick", pipe):
        pass
    assert pipe.getvalue() == ""


def test_human_tables_align_wide_characters_by_terminal_cells():
    text = tables.table(("NAME", "POLICY"), [("香港 fast", "selector"), ("pick", "urltest")])
    starts = {
        tables.width(line[: line.index(word)])
        for line, word in zip(text.splitlines(), ("POLICY", "selector", "urltest"), strict=True)
    }
    assert starts == {len("香港 fast") + 2 + 2}  # 2 wide characters count twice, then the gap


def test_honkctl_imports_neither_aiohttp_nor_the_daemon():
    code = (
        "import sys, honk.cli.ctl; "
        "print(sorted(m for m in ('aiohttp', 'honk.daemon.app', 'uvloop') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
