"""The Clash API's DNS tools and ``honkctl dns`` against a running daemon whose dns section asks a
DNS responder on loopback (``helpers/dns.py``): the answer is the responder's, a second query is
a cache hit that /metrics counts, a flush sends the next query to the responder again. Nothing
dials beyond 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from click.testing import CliRunner, Result
from helpers.apidaemon import (
    LAN_INBOUND,
    api_base,
    api_block,
    bearer,
    metric_samples,
    quiet_global,
    running_daemon,
)
from helpers.dns import DnsResponder

from honk.cli.ctl import cli
from honk.config.spec import DEFAULT_DNS_CACHE_TTL
from honk.daemon.app import Daemon

SECRET = "dns-api-secret"
NAME, ADDRESSES = "www.example.test", ("10.1.2.3", "10.1.2.4")
NO_ENV = {"HONK_API": None, "HONK_API_SECRET": None, "HONK_SECRET": None}
TYPE_A, RCODE_NOERROR, RCODE_NXDOMAIN = 1, 0, 3


def dns_section(responder: DnsResponder) -> str:
    return f"""dns {{
    upstream {{
        default: 'udp://{responder.host}:{responder.port}'
    }}
}}
"""


@dataclass
class Live:
    daemon: Daemon
    url: str
    http: aiohttp.ClientSession
    responder: DnsResponder | None

    async def query(self, name: str, qtype: str | None = None) -> tuple[int, dict]:
        params = {"name": name} | ({"type": qtype} if qtype else {})
        async with self.http.get(f"{self.url}/dns/query", params=params, headers=bearer(SECRET)) as response:
            return response.status, await response.json()

    async def flush(self) -> int:
        async with self.http.post(f"{self.url}/cache/dns/flush", headers=bearer(SECRET)) as response:
            assert await response.read() == b""
            return response.status

    async def metrics(self) -> dict:
        async with self.http.get(f"{self.url}/metrics", headers=bearer(SECRET)) as response:
            assert response.status == 200
            return metric_samples(await response.text())

    async def ctl(self, *args: str) -> Result:
        """honkctl in a worker thread, so the daemon's loop keeps serving meanwhile."""
        runner = CliRunner()
        return await asyncio.to_thread(
            runner.invoke, cli, ["--api", self.url, "--secret", SECRET, *args], env=NO_ENV
        )


@contextlib.asynccontextmanager
async def running(tmp_path: Path, responder: DnsResponder | None) -> AsyncIterator[Live]:
    text = quiet_global() + LAN_INBOUND + (dns_section(responder) if responder else "") + api_block(SECRET)
    async with running_daemon(tmp_path, text) as daemon, aiohttp.ClientSession() as http:
        yield Live(daemon, api_base(daemon), http, responder)


def answers(body: dict) -> list[str]:
    return sorted(record["data"] for record in body.get("Answer", []))


async def test_a_query_is_the_upstreams_answer_then_a_cache_hit_until_a_flush(tmp_path):
    with DnsResponder({NAME: list(ADDRESSES)}) as responder:
        async with running(tmp_path, responder) as live:
            status, body = await live.query(NAME)
            assert status == 200
            assert body["Status"] == RCODE_NOERROR and body["RA"] is True and body["RD"] is True
            assert body["Question"] == [{"Name": f"{NAME}.", "Qtype": TYPE_A, "Qclass": 1}]
            assert answers(body) == sorted(ADDRESSES)
            assert {record["name"] for record in body["Answer"]} == {f"{NAME}."}
            # optimistic_cache_ttl is written into every record a client gets
            assert {record["TTL"] for record in body["Answer"]} == {DEFAULT_DNS_CACHE_TTL}
            assert responder.queries == 1

            status, again = await live.query(NAME.upper(), "A")
            assert status == 200 and answers(again) == sorted(ADDRESSES)
            assert responder.queries == 1  # a hit: the responder was not asked
            scraped = await live.metrics()
            assert scraped[("honk_dns_cache_hits_total", frozenset())] == 1
            assert scraped[("honk_dns_cache_entries", frozenset())] == 1
            labels = frozenset({("upstream", "default"), ("result", "cached")})
            assert scraped[("honk_dns_queries_total", labels)] == 1
            assert (
                scraped[
                    ("honk_dns_queries_total", labels - {("result", "cached")} | {("result", "answered")})
                ]
                == 1
            )
            assert (
                scraped[("honk_dns_upstream_latency_seconds_count", frozenset({("upstream", "default")}))]
                == 1
            )

            assert await live.flush() == 204
            assert (await live.metrics())[("honk_dns_cache_entries", frozenset())] == 0
            status, fresh = await live.query(NAME)
            assert status == 200 and answers(fresh) == sorted(ADDRESSES)
            assert responder.queries == 2  # the flush sent it to the upstream again


async def test_a_name_the_upstream_does_not_know_is_its_nxdomain(tmp_path):
    with DnsResponder({NAME: ADDRESSES[0]}) as responder:
        async with running(tmp_path, responder) as live:
            status, body = await live.query("missing.example.test")
            assert status == 200 and body["Status"] == RCODE_NXDOMAIN and "Answer" not in body
            status, body = await live.query(NAME, "NOPE")
            assert status == 400 and body == {"message": "invalid query type"}


async def test_without_a_dns_section_a_query_is_mihomos_500_and_a_flush_is_204(tmp_path):
    async with running(tmp_path, None) as live:
        status, body = await live.query(NAME)
        assert status == 500 and body == {"message": "DNS section is disabled"}
        assert await live.flush() == 204
        result = await live.ctl("dns", "query", NAME)
        assert result.exit_code == 1 and "DNS section is disabled" in result.stderr


async def test_honkctl_dns_query_and_flush_go_through_the_api(tmp_path):
    with DnsResponder({NAME: list(ADDRESSES)}) as responder:
        async with running(tmp_path, responder) as live:
            result = await live.ctl("--json", "dns", "query", NAME)
            assert result.exit_code == 0, (result.stdout, result.stderr)
            assert answers(json.loads(result.stdout)) == sorted(ADDRESSES)

            human = await live.ctl("dns", "query", NAME, "--type", "a")
            assert human.exit_code == 0, (human.stdout, human.stderr)
            lines = human.stdout.splitlines()
            assert lines[0] == f"NOERROR {NAME}. A"
            assert all(any(address in line for line in lines) for address in ADDRESSES)
            assert responder.queries == 1  # the second was answered from the cache

            flushed = await live.ctl("dns", "flush")
            assert flushed.exit_code == 0 and flushed.stdout.strip() == "dns cache flushed"
            assert (await live.ctl("dns", "query", NAME)).exit_code == 0
            assert responder.queries == 2

            aaaa = await live.ctl("--json", "dns", "query", NAME, "--type", "AAAA")
            assert aaaa.exit_code == 0 and json.loads(aaaa.stdout)["Question"][0]["Qtype"] == 28
