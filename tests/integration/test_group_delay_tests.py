"""Group delay tests (GH-L-11, suggested test 7): every member measured, unchosen ones
included, at most 10 at a time, under the caller's timeout, keyed by member tag, and recorded
as history only: no strike, no liveness change."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, quiet_global, running_daemon
from helpers.engines import poll

from honk.alive.checkurl import DEFAULT_DELAY_URL
from honk.alive.outcome import Domain, Family
from honk.api.delay import GROUP_DELAY_CONCURRENCY
from honk.group.filter import node_id_of

SECRET = "s"
MEMBERS = 25  # more than two rounds of the concurrency cap
TIMEOUT_MS = 1500
SLACK = 1.0  # seconds an answer may come after its timeout
HTTP_CONNECT = b"CONNECT "


class HoldingServer:
    """An HTTP CONNECT proxy that never answers (a node whose handshake hangs), counting how
    many CONNECTs are open at once. The health check's plain TCP connects (``tcp_check_url:
    ''``) send nothing and are not counted; HTTP CONNECT nodes get no UDP probe."""

    def __init__(self) -> None:
        self.open = 0
        self.peak = 0
        self.connects = 0
        self._writers: list[asyncio.StreamWriter] = []

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            if await reader.readexactly(len(HTTP_CONNECT)) != HTTP_CONNECT:
                return
            self.open += 1
            self.connects += 1
            self.peak = max(self.peak, self.open)
            try:
                await reader.read()  # until the client gives up
            finally:
                self.open -= 1
        except asyncio.IncompleteReadError:
            pass  # a health check's connect, closed without a byte
        finally:
            writer.close()

    async def __aenter__(self) -> HoldingServer:
        self.server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._writers:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


def config(port: int) -> str:
    nodes = "".join(f"    m{i:02d}: 'http://127.0.0.1:{port}?n={i}'\n" for i in range(MEMBERS))
    groups = "group {\n    pick {\n        filter: name(keyword: m)\n    }\n}\nrouting {\n    fallback: direct\n}\n"
    return quiet_global() + LAN_INBOUND + "node {\n" + nodes + "}\n" + groups + api_block(SECRET)


async def test_a_group_delay_test_measures_every_member_ten_at_a_time_and_adds_no_strike(tmp_path):
    async with HoldingServer() as holder, running_daemon(tmp_path, config(holder.port)) as daemon:
        alive = daemon.health.alive
        ids = {
            name: node_id_of(leaf) for name, leaf in daemon.plane.outbounds.items() if name.startswith("m")
        }
        assert len(set(ids.values())) == MEMBERS  # distinct nodes (the n= parameter differs)
        runner = daemon.health.runner
        await poll(lambda: runner.in_flight == 0 and runner.queued == 0, "the startup health checks")

        def liveness() -> dict:
            return {(i, d, f): alive.status(i, d, f) for i in ids.values() for d in Domain for f in Family}

        before = liveness()
        async with aiohttp.ClientSession(headers=bearer(SECRET)) as http:
            started = time.monotonic()
            async with http.post(
                f"{api_base(daemon)}/v1/delay", json={"target": "pick", "timeout_ms": TIMEOUT_MS}
            ) as response:
                assert response.status == 200
                body = await response.json()
            elapsed = time.monotonic() - started
            assert elapsed < TIMEOUT_MS / 1000 + SLACK
            assert holder.peak == GROUP_DELAY_CONCURRENCY  # never more at once, and the cap is used
            assert holder.connects == GROUP_DELAY_CONCURRENCY  # the rest found the deadline passed
            assert set(body["results"]) == set(ids)  # the Selector's unchosen members too
            assert all(r["delay_ms"] is None and r["error"] for r in body["results"].values())

            async with http.get(
                f"{api_base(daemon)}/group/pick/delay", params={"timeout": str(TIMEOUT_MS)}
            ) as response:
                assert response.status == 504  # no member succeeded: the Clash answer
        assert liveness() == before  # a delay test changes no liveness
        for node_id in ids.values():
            node = alive.node(node_id)
            assert (node.strikes, node.dial_failures) == (0, 0)  # and adds no strike
        shown = [alive.url_histories(i).get(DEFAULT_DELAY_URL, []) for i in ids.values()]
        # each run measured 10 members (the others found the deadline passed and were not
        # measured, so nothing is recorded for them): their history shows the failure
        assert sum(len(h) for h in shown) == 2 * GROUP_DELAY_CONCURRENCY
        assert all(failed for h in shown for _, _, failed in h)
