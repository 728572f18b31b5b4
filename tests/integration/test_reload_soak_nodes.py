"""A hundred reloads of a real honk daemon while fifty flows ride four kinds of node: none is
dropped, and the daemon's descriptors and tasks come back to their baseline (issue 33, item 6).

The flows are spread over a direct route, a Shadowsocks node (ss-server), a Trojan/TLS node and
a VMess node with Mux.Cool (v2ray servers); each group targets its own loopback echo port and a
``dport`` rule sends it to its node. The reloads alternate SIGHUP and the API (``PUT
/configs?force=true`` and ``POST /v1/reload`` in turn) and cycle the nodes through a change of
their dial shape (VMess cipher, Trojan CA file: new NodeIds; Shadowsocks renamed: a new version on
the same runtime) and their removal, under the default ``keep`` drain. Every flow echoes
throughout; the daemon runs through a launcher that reports its live asyncio tasks on a signal,
and its /proc/<pid>/fd is counted.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import shutil
import signal
import urllib.parse
from pathlib import Path

import aiohttp
import pytest
from helpers.apidaemon import bearer
from helpers.peerservers import ShadowsocksPeer, V2rayPeer, ss_server, v2ray_server
from helpers.proc import HonkProcess
from helpers.reloading import Flow

GROUPS = ("direct", "ss", "trojan", "vmess")
FLOWS = 50  # spread over GROUPS in turn
RELOADS = 100
# the config cycle: dial shape 0, nodes removed, dial shape 1, nodes removed; RELOADS and
# WARMUP_RELOADS are multiples of it, so the soak ends on the baseline's configuration
CYCLE = ("shape0", "removed", "shape1", "removed")
WARMUP_RELOADS = len(CYCLE)  # first applies import and cache; the baselines are taken after them
CHUNK = b"x" * 1024  # bytes per echo round: enough to cross every relay, cheap on two cores
ROUND_PAUSE = 0.05  # seconds a mover waits between rounds, so fifty movers leave the CPU to honk
SETTLE = 10.0  # seconds fds and tasks may take to come back (the last flow's end, API connections)
SETTLE_POLL = 0.05  # seconds between looks at a settling daemon
RELOAD_TIMEOUT = 20.0  # seconds one reload may take on a loaded two-core machine
SECRET = "soak-secret"
SS_METHOD = "aes-128-gcm"
SS_PASSWORD = "soak-password"
VMESS_CIPHERS = ("aes-128-gcm", "chacha20-poly1305")  # v2ray's server takes whichever the client asks
SS_NAMES = ("ss-a", "ss-b")  # a rename: a new version of the same node (same NodeId)
# the API's connection handlers: they come and go with the test's own requests
TRANSIENT_TASKS = frozenset({"RequestHandler.start", "RequestHandler._handle_request"})
# a new plane wakes warm-up's passes, which end on their own: a baseline waits until they have
WARM_PASSES = frozenset({"WarmUp.pin_pass", "WarmUp.udp_pass"})


class Echo:
    """A loopback echo server that can end its connections itself (a FIN from the server side)."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> Echo:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def end_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    async def aclose(self) -> None:
        self.end_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _ss_link(peer: ShadowsocksPeer) -> str:
    userinfo = base64.urlsafe_b64encode(f"{peer.method}:{peer.password}".encode()).decode().rstrip("=")
    return f"ss://{userinfo}@{peer.host}:{peer.port}"


def _trojan_link(peer: V2rayPeer, ca: Path) -> str:
    return (
        f"trojan://{peer.password}@{peer.host}:{peer.port}?security=tls&sni=localhost&type=tcp"
        f"&ca={urllib.parse.quote(str(ca), safe='')}"
    )


def _vmess_link(peer: V2rayPeer, cipher: str) -> str:
    fields = {
        "v": "2",
        "ps": "vmess",
        "add": peer.host,
        "port": str(peer.port),
        "id": peer.uuid,
        "aid": "0",
        "scy": cipher,
        "net": "tcp",
        "tls": "",
        "mux": "1",
    }
    return "vmess://" + base64.b64encode(json.dumps(fields).encode()).decode()


class Soak:
    """The peers, the echo ports and the config of each CYCLE state."""

    def __init__(
        self, tmp: Path, ss: ShadowsocksPeer, trojan: V2rayPeer, vmess: V2rayPeer, echoes: dict[str, Echo]
    ) -> None:
        self.ss, self.trojan, self.vmess, self.echoes = ss, trojan, vmess, echoes
        self.config = tmp / "honk.dae"
        assert trojan.ca_path is not None
        # two copies of the Trojan server's CA: the node's `ca` differs, so its NodeId does
        self.cas = tuple(shutil.copy(trojan.ca_path, tmp / f"trojan-ca-{i}.pem") for i in range(2))

    def text(self, state: str) -> str:
        nodes = rules = ""
        if state != "removed":
            shape = CYCLE.index(state) // 2
            ss_name = SS_NAMES[shape]
            nodes = (
                f"node {{\n    {ss_name}: '{_ss_link(self.ss)}'\n"
                f"    trojan: '{_trojan_link(self.trojan, Path(self.cas[shape]))}'\n"
                f"    vmess: '{_vmess_link(self.vmess, VMESS_CIPHERS[shape])}'\n}}\n"
            )
            rules = "".join(
                f"    dport({self.echoes[group].port}) -> {name}\n"
                for group, name in (("ss", ss_name), ("trojan", "trojan"), ("vmess", "vmess"))
            )
        return (
            "global {\n    data_dir: ./var\n    tcp_check_url: ''\n    check_interval: 3600s\n"
            "    preconnect_node_count: 0\n}\n"
            "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
            f"{nodes}routing {{\n{rules}    fallback: direct\n}}\n"
            "experimental {\n    clash_api {\n        external_controller: '127.0.0.1:0'\n"
            f"        secret: '{SECRET}'\n    }}\n}}\n"
        )

    def write(self, state: str) -> None:
        self.config.write_text(self.text(state))


class Reloader:
    """Reload number n: SIGHUP when n is even, else the API (its two routes in turn)."""

    def __init__(self, honk: HonkProcess, soak: Soak, http: aiohttp.ClientSession, api: str) -> None:
        self.honk, self.soak, self.http, self.api = honk, soak, http, api
        self.done = 0

    async def next(self) -> None:
        self.done += 1
        self.soak.write(CYCLE[self.done % len(CYCLE)])
        if self.done % 2 == 0:
            after = self.honk.mark()
            self.honk.signal(signal.SIGHUP)
            line = await asyncio.to_thread(
                self.honk.wait_for, r"config reloaded|reload refused", RELOAD_TIMEOUT, after
            )
            assert line.group(0) == "config reloaded", f"SIGHUP reload {self.done} refused"
        elif self.done % 4 == 1:
            async with self.http.put(f"{self.api}/configs?force=true", data=b"") as resp:
                assert resp.status == 204, f"PUT /configs {self.done}: {resp.status} {await resp.text()}"
        else:
            async with self.http.post(f"{self.api}/v1/reload") as resp:
                assert resp.status == 200, f"POST /v1/reload {self.done}: {resp.status} {await resp.text()}"
                assert (await resp.json())["applied"]


class Movers:
    """Each flow echoes round after round; ``pause`` holds them all between rounds, so the
    daemon is counted with no transfer half-done."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.running.set()
        self.stop = asyncio.Event()
        self.waiting = 0
        self.rounds: list[int] = []
        self.failures: list[str] = []

    async def move(self, flow: Flow, group: str) -> None:
        index = len(self.rounds)
        self.rounds.append(0)
        while not self.stop.is_set():
            if not self.running.is_set():
                self.waiting += 1
                await self.running.wait()
                self.waiting -= 1
                continue
            if not await flow.echoes(CHUNK):
                self.failures.append(
                    f"flow {index} ({group}) stopped echoing after {self.rounds[index]} rounds"
                )
                return
            self.rounds[index] += 1
            await asyncio.sleep(ROUND_PAUSE)

    async def pause(self) -> None:
        self.running.clear()
        await _settle(lambda: self.waiting == len(self.rounds) - len(self.failures), "every mover to pause")


async def _settle(condition, what: str) -> None:  # noqa: ANN001 - () -> bool
    """Wait (bounded, real time: another process settles) until ``condition()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(SETTLE_POLL)


def _steady(tasks: collections.Counter[str]) -> collections.Counter[str]:
    return collections.Counter({name: n for name, n in tasks.items() if name not in TRANSIENT_TASKS})


async def _quiet(honk: HonkProcess, what: str) -> tuple[int, collections.Counter[str]]:
    """The daemon's fds and steady tasks once no warm-up pass runs: a baseline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE
    while True:
        fds, tasks = honk.open_fds(), _steady(await asyncio.to_thread(honk.tasks))
        if not WARM_PASSES & set(tasks):
            return fds, tasks
        assert loop.time() < deadline, (
            f"warm-up passes still running when taking the {what} baseline: {tasks}"
        )
        await asyncio.sleep(SETTLE_POLL)


async def _back_to(honk: HonkProcess, fds: int, tasks: collections.Counter[str], when: str) -> None:
    """Poll until the daemon's fds and steady tasks equal the baseline; fail naming the difference."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE
    while True:
        now_fds, now_tasks = honk.open_fds(), _steady(await asyncio.to_thread(honk.tasks))
        if now_fds == fds and now_tasks == tasks:
            return
        if loop.time() > deadline:
            grown, shrunk = now_tasks - tasks, tasks - now_tasks
            pytest.fail(f"{when}: fds {fds} -> {now_fds}; tasks added {dict(grown)}, gone {dict(shrunk)}")
        await asyncio.sleep(SETTLE_POLL)


async def test_a_hundred_reloads_over_four_node_kinds_drop_no_flow_and_leak_nothing(tmp_path):
    echoes = {group: await Echo().start() for group in GROUPS}
    try:
        with (
            ss_server(SS_METHOD, SS_PASSWORD, udp=False) as ss,
            v2ray_server("trojan") as trojan,
            v2ray_server("vmess", mux=True) as vmess,
        ):
            soak = Soak(tmp_path, ss, trojan, vmess, echoes)
            soak.write(CYCLE[0])
            # One fast-path worker: the second, which the first TLS handshake would start for the
            # daemon's life, is no leak but would move the descriptor baseline this soak compares.
            with HonkProcess(soak.config, introspect=True, env={"HONK_FASTPATH_WORKERS": "1"}) as honk:
                await _soak(honk, soak)
    finally:
        for echo in echoes.values():
            await echo.aclose()


async def _soak(honk: HonkProcess, soak: Soak) -> None:
    _, lan = await asyncio.to_thread(honk.inbound, "lan")
    api_host, api_port = await asyncio.to_thread(honk.bound, "api")
    api = f"http://{api_host}:{api_port}"
    # force_close: no keep-alive connection of the test's is counted among the daemon's fds
    async with aiohttp.ClientSession(
        headers=bearer(SECRET), connector=aiohttp.TCPConnector(force_close=True)
    ) as http:
        reloader = Reloader(honk, soak, http, api)
        for _ in range(WARMUP_RELOADS):
            await reloader.next()
        idle_fds, idle_tasks = await _quiet(honk, "idle")

        groups = [GROUPS[i % len(GROUPS)] for i in range(FLOWS)]
        flows = [await Flow.open(lan, soak.echoes[group].port) for group in groups]
        async with http.get(f"{api}/v1/connections") as resp:
            connections = (await resp.json())["connections"]
        ridden = collections.Counter((c["target"].rpartition(":")[2], c["chain"][-1]) for c in connections)
        expected = collections.Counter(
            (str(soak.echoes[g].port), {"ss": SS_NAMES[0]}.get(g, g)) for g in groups
        )
        assert ridden == expected, "each flow rides the node its destination port routes to"

        movers = Movers()
        tasks = [
            asyncio.ensure_future(movers.move(flow, group)) for flow, group in zip(flows, groups, strict=True)
        ]
        await _settle(lambda: all(movers.rounds) and len(movers.rounds) == FLOWS, "every flow's first round")
        await movers.pause()
        busy_fds, busy_tasks = await _quiet(honk, "busy")
        movers.running.set()

        for _ in range(RELOADS):
            await reloader.next()
            assert movers.failures == []
        before = list(movers.rounds)
        await _settle(
            lambda: all(now > then for now, then in zip(movers.rounds, before, strict=True)),
            "every flow to move again after the last reload",
        )
        await movers.pause()
        assert movers.failures == []
        await _back_to(honk, busy_fds, busy_tasks, f"after {RELOADS} reloads with {FLOWS} flows open")

        movers.stop.set()
        movers.running.set()
        await asyncio.gather(*tasks)
        # the servers end the flows, then the clients: every kind of flow ends cleanly this way.
        # A client's close alone would leave a bridged Trojan/TLS flow waiting on its server (TLS
        # cannot half-close, and the bridge takes the relay's close for a half-close), which is
        # not what this soak measures.
        for echo in soak.echoes.values():
            echo.end_all()
        for flow in flows:
            assert await flow.ended(), "the server's end reached the client"
            await flow.close()
        await _back_to(honk, idle_fds, idle_tasks, "after the last flow ended")
        assert soak.vmess.carriers() == 0, "the retired mux carrier closed after its last stream"
        assert movers.failures == [] and min(movers.rounds) > 1
    print(
        f"\nnode soak: {FLOWS} flows, {RELOADS} reloads; daemon fds idle {idle_fds} busy {busy_fds}, "
        f"steady tasks idle {sum(idle_tasks.values())} busy {sum(busy_tasks.values())}; "
        f"rounds per flow {min(movers.rounds)}..{max(movers.rounds)}"
    )
