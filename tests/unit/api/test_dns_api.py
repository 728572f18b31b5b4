"""The Clash API's DNS tools: mihomo's /dns/query JSON built from a reply, the question a request
asks, and both routes over a real aiohttp app in front of a DnsService whose upstream is a fake
(no sockets), with the DNS metrics they move."""

from __future__ import annotations

from types import SimpleNamespace

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from aiohttp import test_utils
from helpers.apidaemon import bearer, metric_samples

from honk.api import clash, metrics
from honk.api.errors import ApiError
from honk.api.webapp import build_app
from honk.config.spec import DnsSpec, DnsUpstreamSpec
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.core.stats import RuntimeStats
from honk.dns.service import DnsService
from honk.dns.upstream import Destination

SECRET = "dns-secret"
TTL = 300
MAX_MESSAGE = 65535  # what the fake upstream's replies may weigh (as over TCP)
BIG = 100  # A records in big.test's answer: 1,600 bytes and more, past a UDP reply's limit


def reply_to(query: dns.message.Message) -> dns.message.Message:
    """What the fake upstream answers: A and MX records for any name, NXDOMAIN for *.nx.test."""
    answer = dns.message.make_response(query)
    question = query.question[0]
    if question.name.to_text().endswith("nx.test."):
        answer.set_rcode(dns.rcode.NXDOMAIN)
        answer.authority.append(
            dns.rrset.from_text(
                "nx.test.", TTL, "IN", "SOA", "ns.nx.test. admin.nx.test. 1 3600 600 86400 60"
            )
        )
    elif question.name.to_text() == "big.test.":
        answer.answer.append(
            dns.rrset.from_text(
                question.name, TTL, "IN", "A", *(f"10.1.{i // 250}.{i % 250}" for i in range(BIG))
            )
        )
    elif question.rdtype == dns.rdatatype.A:
        answer.answer.append(dns.rrset.from_text(question.name, TTL, "IN", "A", "10.0.0.1", "10.0.0.2"))
    elif question.rdtype == dns.rdatatype.MX:
        answer.answer.append(dns.rrset.from_text(question.name, TTL, "IN", "MX", "10 mail.example.test."))
    return answer


class Upstream:
    timeout = 5.0

    def __init__(self) -> None:
        self.calls = 0

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        wire: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        self.calls += 1
        answer = dns.message.from_wire(reply_to(query).to_wire(max_size=MAX_MESSAGE))
        answer.id = query.id
        return answer


# --- the JSON view -------------------------------------------------------------------------------


def test_an_answer_renders_in_mihomos_shape_with_keys_sorted_as_go_encodes_a_map():
    query = dns.message.make_query("www.example.test", "A")
    message = reply_to(query)
    message.flags |= dns.flags.RA
    body = clash.dns_query_json(message)
    assert list(body) == sorted(body)
    assert body == {
        "AD": False,
        "CD": False,
        "RA": True,
        "RD": True,
        "TC": False,
        "Status": 0,
        "Question": [{"Name": "www.example.test.", "Qtype": 1, "Qclass": 1}],
        "Answer": [
            {"name": "www.example.test.", "type": 1, "TTL": TTL, "data": "10.0.0.1"},
            {"name": "www.example.test.", "type": 1, "TTL": TTL, "data": "10.0.0.2"},
        ],
    }


def test_empty_sections_are_left_out_and_a_negative_answer_shows_its_authority():
    body = clash.dns_query_json(reply_to(dns.message.make_query("gone.nx.test", "AAAA")))
    assert body["Status"] == dns.rcode.NXDOMAIN
    assert "Answer" not in body and "Additional" not in body
    assert body["Authority"] == [
        {"name": "nx.test.", "type": 6, "TTL": TTL, "data": "ns.nx.test. admin.nx.test. 1 3600 600 86400 60"}
    ]


def test_record_data_is_the_presentation_format_after_the_header():
    body = clash.dns_query_json(reply_to(dns.message.make_query("example.test", "MX")))
    assert body["Answer"] == [
        {"name": "example.test.", "type": 15, "TTL": TTL, "data": "10 mail.example.test."}
    ]


def test_a_question_defaults_to_recursion_and_reads_types_in_any_case():
    question = clash.dns_question("www.example.test", "aaaa")
    assert question.flags & dns.flags.RD
    (rrset,) = question.question
    assert (rrset.name.to_text(), rrset.rdtype) == ("www.example.test.", dns.rdatatype.AAAA)
    assert clash.dns_question("", "A").question[0].name.to_text() == "."  # mihomo asks the root too


@pytest.mark.parametrize("qtype", ["BOGUS", "ANY", "AXFR", "OPT", ""])
def test_a_type_that_is_no_record_type_is_mihomos_400(qtype):
    with pytest.raises(ApiError) as raised:
        clash.dns_question("example.test", qtype)
    assert (raised.value.status, raised.value.message) == (400, clash.INVALID_QTYPE)


def test_a_name_that_is_no_dns_name_is_a_400():
    with pytest.raises(ApiError) as raised:
        clash.dns_question("a" * 64 + ".test", "A")
    assert (raised.value.status, raised.value.message) == (400, clash.INVALID_QNAME)


# --- the routes ----------------------------------------------------------------------------------


def control_with(service: DnsService | None) -> SimpleNamespace:
    clock = FakeClock()
    return SimpleNamespace(
        dns_service=service,
        clock=clock,
        started_at=clock.now(),
        started_wall=clock.wall(),
        plane=None,
        stats=RuntimeStats(),
        tracker=SimpleNamespace(snapshot=list, totals=lambda: (0, 0)),
        health=SimpleNamespace(alive=SimpleNamespace(nodes=lambda: iter(()))),
    )


def service_and_upstream() -> tuple[DnsService, Upstream]:
    upstream = Upstream()
    spec = DnsSpec(upstreams=(DnsUpstreamSpec("default", "udp", "192.0.2.53"),))
    return DnsService(spec, None, FakeClock(), exchanger=upstream), upstream  # type: ignore[arg-type]


def client_for(control: SimpleNamespace) -> test_utils.TestClient:
    app = build_app(control, SECRET, [clash.routes, metrics.routes])  # type: ignore[arg-type]
    return test_utils.TestClient(test_utils.TestServer(app))


async def test_without_a_dns_section_a_query_is_mihomos_500_and_a_flush_still_204():
    async with client_for(control_with(None)) as http:
        response = await http.get("/dns/query", params={"name": "example.test"}, headers=bearer(SECRET))
        assert response.status == 500
        assert await response.json() == {"message": "DNS section is disabled"}
        assert (await http.post("/cache/dns/flush", headers=bearer(SECRET))).status == 204


async def test_both_routes_want_the_api_secret():
    service, _ = service_and_upstream()
    async with client_for(control_with(service)) as http:
        assert (await http.get("/dns/query", params={"name": "example.test"})).status == 401
        assert (await http.post("/cache/dns/flush")).status == 401


async def test_a_query_goes_through_the_service_then_hits_its_cache_until_a_flush():
    service, upstream = service_and_upstream()
    async with client_for(control_with(service)) as http:
        params = {"name": "WWW.Example.test"}  # no type: A
        first = await (await http.get("/dns/query", params=params, headers=bearer(SECRET))).json()
        assert first["Question"] == [{"Name": "WWW.Example.test.", "Qtype": 1, "Qclass": 1}]
        assert sorted(a["data"] for a in first["Answer"]) == ["10.0.0.1", "10.0.0.2"]  # rrset order may vary
        assert first["RA"] is True and first["RD"] is True
        second = await (await http.get("/dns/query", params=params, headers=bearer(SECRET))).json()
        assert sorted(a["data"] for a in second["Answer"]) == ["10.0.0.1", "10.0.0.2"] and upstream.calls == 1
        scraped = metric_samples(await (await http.get("/metrics", headers=bearer(SECRET))).text())
        assert scraped[("honk_dns_cache_hits_total", frozenset())] == 1
        assert scraped[("honk_dns_cache_misses_total", frozenset())] == 1
        assert scraped[("honk_dns_cache_entries", frozenset())] == 1
        queries = {
            dict(labels)["result"]: v
            for (name, labels), v in scraped.items()
            if name == "honk_dns_queries_total" and dict(labels)["upstream"] == "default"
        }
        assert queries == {"cached": 1, "answered": 1, "negative": 0, "error": 0, "failed": 0, "rejected": 0}
        assert scraped[("honk_dns_upstream_latency_seconds_count", frozenset({("upstream", "default")}))] == 1

        flushed = await http.post("/cache/dns/flush", headers=bearer(SECRET))
        assert flushed.status == 204 and await flushed.read() == b""
        assert len(service.cache) == 0
        await http.get("/dns/query", params=params, headers=bearer(SECRET))
        assert upstream.calls == 2


async def test_a_bad_type_over_http_is_400_with_mihomos_message():
    service, upstream = service_and_upstream()
    async with client_for(control_with(service)) as http:
        response = await http.get(
            "/dns/query", params={"name": "a.test", "type": "NOPE"}, headers=bearer(SECRET)
        )
        assert response.status == 400 and await response.json() == {"message": "invalid query type"}
        assert upstream.calls == 0


async def test_without_a_dns_section_the_dns_metrics_are_absent():
    async with client_for(control_with(None)) as http:
        text = await (await http.get("/metrics", headers=bearer(SECRET))).text()
    assert "honk_dns_" not in text


async def test_an_answer_too_large_for_udp_is_asked_again_over_tcp_as_a_client_would():
    service, upstream = service_and_upstream()
    async with client_for(control_with(service)) as http:
        response = await http.get("/dns/query", params={"name": "big.test"}, headers=bearer(SECRET))
        body = await response.json()
    assert response.status == 200 and body["TC"] is False and len(body["Answer"]) == BIG
    assert upstream.calls == 1  # the retry found the whole answer in the cache
    assert service.stats.queries == {("default", "answered"): 1, ("default", "cached"): 1}


def test_honkctl_prints_the_status_the_question_and_one_line_per_record():
    from honk.cli.ctl import _dns_answer

    body = clash.dns_query_json(reply_to(dns.message.make_query("example.test", "MX")))
    lines = _dns_answer(body).splitlines()
    assert lines[0] == "NOERROR example.test. MX"
    assert lines[1].split() == ["name", "ttl", "type", "data"]
    assert lines[2].split() == ["example.test.", str(TTL), "MX", "10", "mail.example.test."]
    negative = _dns_answer(clash.dns_query_json(reply_to(dns.message.make_query("a.nx.test", "TYPE65"))))
    assert negative.splitlines()[0] == "NXDOMAIN a.nx.test. HTTPS"
