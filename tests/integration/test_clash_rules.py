"""Rules as mihomo serves them, against a running daemon: real SOCKS5 flows through the mixed
inbound to loopback echo servers raise the per-rule counters of ``GET /rules``, ``PATCH
/rules/disable`` makes routing skip a rule, and ``honkctl rules`` shows both."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from click.testing import CliRunner
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, quiet_global, running_daemon
from helpers.engines import poll
from helpers.servers import echo_server

from honk.cli.ctl import cli
from honk.daemon.app import Daemon

SECRET = "rule-counter"
ZERO_TIME = "0001-01-01T00:00:00Z"  # mihomo's hitAt/missAt before the first hit or miss
NO_ENV = {"HONK_API": None, "HONK_API_SECRET": None, "HONK_SECRET": None}
STEP = 5.0  # seconds an echo may take

# rule 0 never matches (a miss for every flow), rule 1 takes the flows to the first echo server,
# rule 2 every loopback flow rule 1 did not take, through a group the connection's chain shows
ROUTING = """group {{
    alt {{
        filter: name(direct)
    }}
}}
routing {{
    dport(22) -> direct
    dport({port}) -> direct
    dip(127.0.0.1/32) -> alt
{extra}    fallback: direct
}}
"""


@dataclass
class Live:
    daemon: Daemon
    base: str
    http: aiohttp.ClientSession
    port: int  # the echo server rule 1 routes
    other: int  # an echo server only rule 2 matches
    config: Path

    async def rules(self) -> list[dict]:
        async with self.http.get(self.base + "/rules") as resp:
            assert resp.status == 200
            return (await resp.json())["rules"]

    async def extras(self) -> list[dict]:
        return [rule["extra"] for rule in await self.rules()]

    async def patch(self, body: object | None = None, *, data: bytes | None = None) -> tuple[int, object]:
        kwargs = {"data": data} if data is not None else {"json": body}
        async with self.http.patch(self.base + "/rules/disable", **kwargs) as resp:
            text = await resp.text()
            return resp.status, (await resp.json(content_type=None) if text else None)

    async def echo(self, port: int) -> None:
        """One flow through the mixed inbound's SOCKS5 to ``port``, a byte echoed, closed."""
        reader, writer, rep, _ = await socks5_open(self.daemon.inbounds["lan"].bound.port, "127.0.0.1", port)
        try:
            assert rep == 0
            writer.write(b"x")
            assert await asyncio.wait_for(reader.readexactly(1), STEP) == b"x"
        finally:
            await close_writer(writer)

    async def reload(self) -> None:
        async with self.http.put(self.base + "/configs", json={}) as resp:
            assert resp.status == 204, await resp.text()


def config_text(port: int, extra: str = "") -> str:
    return quiet_global() + LAN_INBOUND + ROUTING.format(port=port, extra=extra) + api_block(SECRET)


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Live]:
    async with contextlib.AsyncExitStack() as stack:
        port = await stack.enter_async_context(echo_server())
        other = await stack.enter_async_context(echo_server())
        daemon = await stack.enter_async_context(running_daemon(tmp_path, config_text(port)))
        http = await stack.enter_async_context(aiohttp.ClientSession(headers=bearer(SECRET)))
        yield Live(daemon, api_base(daemon), http, port, other, daemon.config_path)


def wall(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def counts(extras: list[dict]) -> list[tuple[int, int]]:
    return [(e["hitCount"], e["missCount"]) for e in extras]


async def test_flows_raise_the_hit_count_of_their_rule_and_the_miss_count_of_the_rules_before_it(tmp_path):
    async with running(tmp_path) as live:
        rules = await live.rules()
        assert [(r["index"], r["type"], r["proxy"]) for r in rules] == [
            (0, "DstPort", "DIRECT"),
            (1, "DstPort", "DIRECT"),
            (2, "IPCIDR", "alt"),
            (3, "Match", "DIRECT"),
        ]
        for rule in rules:
            assert rule["extra"] == {
                "disabled": False,
                "hitCount": 0,
                "hitAt": ZERO_TIME,
                "missCount": 0,
                "missAt": ZERO_TIME,
            }

        before = time.time()
        await live.echo(live.port)
        await live.echo(live.port)
        after = time.time()
        extras = await live.extras()
        assert counts(extras) == [(0, 2), (2, 0), (0, 0), (0, 0)]
        assert before - 1 <= wall(extras[1]["hitAt"]) <= after + 1
        assert before - 1 <= wall(extras[0]["missAt"]) <= after + 1
        assert extras[0]["hitAt"] == extras[1]["missAt"] == extras[2]["hitAt"] == ZERO_TIME

        await live.echo(live.other)  # passes rules 0 and 1, decided by rule 2
        extras = await live.extras()
        assert counts(extras) == [(0, 3), (2, 1), (1, 0), (0, 0)]
        assert wall(extras[1]["missAt"]) >= wall(extras[1]["hitAt"])


async def test_a_disabled_rule_is_skipped_until_it_is_enabled_again(tmp_path):
    async with running(tmp_path) as live:
        await live.echo(live.port)
        assert await live.patch({"1": True}) == (204, None)
        extras = await live.extras()
        assert [e["disabled"] for e in extras] == [False, True, False, False]

        # the next flow to rule 1's port skips it: rule 2 (through the group alt) decides it
        reader, writer, rep, _ = await socks5_open(
            live.daemon.inbounds["lan"].bound.port, "127.0.0.1", live.port
        )
        try:
            assert rep == 0
            await poll(lambda: len(live.daemon.tracker.snapshot()) == 1, "the flow to be tracked")
            async with live.http.get(live.base + "/connections") as resp:
                (conn,) = (await resp.json())["connections"]
            assert (conn["rule"], conn["rulePayload"]) == ("IPCIDR", "127.0.0.1/32")
            assert conn["chains"] == ["DIRECT", "alt"]
        finally:
            await close_writer(writer)
        extras = await live.extras()
        assert counts(extras) == [(0, 2), (1, 0), (1, 0), (0, 0)]  # rule 1 neither hit nor missed

        assert await live.patch({"1": False}) == (204, None)
        await live.echo(live.port)
        extras = await live.extras()
        assert [e["disabled"] for e in extras] == [False, False, False, False]
        assert counts(extras) == [(0, 3), (2, 0), (1, 0), (0, 0)]


async def test_a_bad_disable_body_is_a_400_that_changes_nothing(tmp_path):
    async with running(tmp_path) as live:
        bad = [
            [1],
            "1",
            {"one": True},
            {"-1": True},
            {"1": 1},
            {"1": "true"},
            {"1": None},
            {"3": True},  # the fallback cannot be disabled
            {"4": True},  # no such rule
            {"0": True, "9": True},
        ]  # one good change and one bad: nothing applies
        for body in bad:
            status, answer = await live.patch(body)
            assert status == 400, body
            assert set(answer) == {"message"} and answer["message"], answer
        status, answer = await live.patch(data=b"{not json")
        assert status == 400 and answer == {"message": "Body invalid"}
        assert [e["disabled"] for e in await live.extras()] == [False, False, False, False]
        await live.echo(live.port)
        assert counts(await live.extras()) == [(0, 1), (1, 0), (0, 0), (0, 0)]
        assert await live.patch({}) == (204, None)  # an empty object changes nothing, and is fine


async def test_a_reload_enables_every_rule_and_resets_the_counters_only_when_the_rules_change(tmp_path):
    async with running(tmp_path) as live:
        await live.echo(live.port)
        assert await live.patch({"0": True}) == (204, None)
        await live.echo(live.port)
        kept = await live.extras()
        assert counts(kept) == [(0, 1), (2, 0), (0, 0), (0, 0)] and kept[0]["disabled"] is True

        await live.reload()  # the same file: the compiled rules and their counters stay; the flag does not
        assert await live.extras() == [{**kept[0], "disabled": False}, *kept[1:]]
        assert await live.patch({"0": True}) == (204, None)

        live.config.write_text(config_text(live.port, extra="    dport(23) -> direct\n"))
        await live.reload()
        extras = await live.extras()
        assert len(extras) == 5
        assert all(
            e == {"disabled": False, "hitCount": 0, "hitAt": ZERO_TIME, "missCount": 0, "missAt": ZERO_TIME}
            for e in extras
        )
        await live.echo(live.port)
        assert counts(await live.extras()) == [(0, 1), (1, 0), (0, 0), (0, 0), (0, 0)]


async def ctl(live: Live, *args: str):
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, cli, ["--api", live.base, "--secret", SECRET, *args], env=NO_ENV
    )


async def test_honkctl_rules_shows_counts_and_state_and_switches_rules(tmp_path):
    async with running(tmp_path) as live:
        await live.echo(live.port)
        await live.echo(live.other)
        disabled = await ctl(live, "rules", "disable", "2")
        assert disabled.exit_code == 0 and disabled.stdout.strip() == "disabled rule(s) 2", disabled.stdout
        listing = await ctl(live, "rules")
        assert listing.exit_code == 0, listing.stderr
        lines = listing.stdout.splitlines()
        assert lines[0].split() == [
            "#",
            "TYPE",
            "PAYLOAD",
            "PROXY",
            "STATE",
            "HITS",
            "LAST",
            "HIT",
            "MISSES",
            "LAST",
            "MISS",
        ]
        rows = {line.split()[0]: line.split() for line in lines[1:5]}
        assert rows["0"][:6] == ["0", "DstPort", "22", "DIRECT", "enabled", "0"]
        assert (
            rows["0"][6] == "-" and rows["0"][7] == "2" and rows["0"][-1] == "ago"
        )  # never hit, missed twice
        assert rows["1"][4:7] == ["enabled", "1", "0s"]  # hit once, just now
        assert rows["2"][:6] == ["2", "IPCIDR", "127.0.0.1/32", "alt", "disabled", "1"]
        assert rows["3"][:7] == ["3", "Match", "-", "DIRECT", "enabled", "0", "-"]
        assert lines[-1] == "4 rule(s), the last the fallback; 1 disabled"

        as_json = await ctl(live, "--json", "rules")
        assert as_json.exit_code == 0
        assert [r["extra"]["disabled"] for r in json.loads(as_json.stdout)["rules"]] == [
            False,
            False,
            True,
            False,
        ]
        refused = await ctl(live, "rules", "disable", "3")
        assert refused.exit_code == 1 and "fallback" in refused.stderr
        enabled = await ctl(live, "rules", "enable", "2")
        assert enabled.exit_code == 0 and enabled.stdout.strip() == "enabled rule(s) 2"
        assert [e["disabled"] for e in await live.extras()] == [False, False, False, False]
