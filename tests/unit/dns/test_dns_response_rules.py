"""DNS routing behaving as written: request rules choose the upstream, response rules run on its
answer and accept it, reject it or send the query on to another upstream (dae's
docs/en/configuration/dns.md). Sans-I/O: a fake upstream set answers dnspython messages by the
upstream asked; geodata is the test's own (helpers.geodata)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from helpers.geodata import write_geodata

from honk.config.load import load_file, load_text
from honk.config.spec import DnsCondition, DnsRequestRule, DnsSpec, DnsUpstreamSpec, MatchArg
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.dns.service import MAX_LOOKUP_DEPTH, DnsService
from honk.dns.upstream import Destination
from honk.geo.assets import GeoAssets

ANSWER_TTL = 60
LAN_CLIENT = Address("192.168.50.7", 40000)
OTHER_CLIENT = Address("192.0.2.77", 40000)


class FakeUpstreams:
    """Each upstream (by name) answers with the addresses its table gives for the name asked."""

    def __init__(self, answers: dict[str, Callable[[str], list[str]]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str]] = []  # (upstream, name)

    async def exchange(
        self,
        destination: Destination,
        query: dns.message.Message,
        wire: bytes,
        client: Address | None,
        *,
        tcp: bool = False,
    ) -> dns.message.Message:
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True)
        self.asked.append((destination.label, name))
        reply = dns.message.make_response(query)
        family = "AAAA" if question.rdtype == dns.rdatatype.AAAA else "A"
        wanted = [ip for ip in self.answers[destination.label](name) if (":" in ip) == (family == "AAAA")]
        if wanted:
            reply.answer.append(dns.rrset.from_text(question.name, ANSWER_TTL, "IN", family, *wanted))
        return reply


def dns_spec(routing: str) -> DnsSpec:
    text = (
        "dns {\n    upstream {\n        alidns: 'udp://192.0.2.53:53'\n"
        "        googledns: 'tcp+udp://192.0.2.54:53'\n    }\n"
        f"    routing {{\n{routing}    }}\n}}\n"
    )
    spec = load_text(text, "dae").dns
    assert spec is not None
    return spec


def service_for(spec: DnsSpec, upstreams: FakeUpstreams) -> DnsService:
    return DnsService(spec, None, FakeClock(), exchanger=upstreams, geo=GeoAssets())  # type: ignore[arg-type]


async def ask(
    service: DnsService, name: str, qtype: str = "A", client: Address = OTHER_CLIENT
) -> dns.message.Message:
    query = dns.message.make_query(name, qtype, use_edns=False)
    reply = await service.handle(query.to_wire(), client, None)
    assert reply is not None
    return dns.message.from_wire(reply)


def addresses(reply: dns.message.Message) -> list[str]:
    return [r.address for rrset in reply.answer for r in rrset]


def polluting(name: str) -> list[str]:
    """A resolver that answers every name outside .cn with a private address."""
    return ["198.51.100.9"] if name.endswith(".cn") else ["10.9.9.9"]


# public addresses: geoip:private holds the documentation ranges too (honk.route.matchers)
HONEST_V4, HONEST_V6 = "100.20.0.5", "2600:1f00::5"


def honest(name: str) -> list[str]:
    return [HONEST_V4, HONEST_V6]


# dae docs/en/configuration/dns.md, Templates: alidns for all, googledns when polluted
TEMPLATE = """\
        request {
            fallback: alidns
        }
        response {
            upstream(googledns) -> accept
            ip(geoip:private) && !qname(geosite:cn) -> googledns
            fallback: accept
        }
"""


async def test_a_polluted_answer_is_asked_again_of_the_trusted_upstream(geodata):
    """dae docs/en/configuration/dns.md, Templates: ip(geoip:private) && !qname(geosite:cn) -> googledns."""
    upstreams = FakeUpstreams({"alidns": polluting, "googledns": honest})
    service = service_for(dns_spec(TEMPLATE), upstreams)
    reply = await ask(service, "www.example.org")
    assert addresses(reply) == [HONEST_V4]
    assert upstreams.asked == [("alidns", "www.example.org"), ("googledns", "www.example.org")]


async def test_an_answer_the_response_rules_accept_is_kept_as_the_first_upstream_gave_it(geodata):
    """Same template: a name in geosite:cn keeps alidns's answer; so does a public address."""
    upstreams = FakeUpstreams({"alidns": polluting, "googledns": honest})
    service = service_for(dns_spec(TEMPLATE), upstreams)
    assert addresses(await ask(service, "shop.example.cn")) == ["198.51.100.9"]
    assert upstreams.asked == [("alidns", "shop.example.cn")]


async def test_an_answer_asked_again_is_cached_for_the_request_rules_choice(geodata):
    upstreams = FakeUpstreams({"alidns": polluting, "googledns": honest})
    service = service_for(dns_spec(TEMPLATE), upstreams)
    await ask(service, "www.example.org")
    assert addresses(await ask(service, "www.example.org")) == [HONEST_V4]
    assert len(upstreams.asked) == 2  # the second query was a hit


async def test_a_rejecting_response_rule_answers_empty_noerror():
    """upstream honk doc/en/reference/dns.md, Response actions: reject returns an empty success."""
    spec = dns_spec(
        "        request {\n            fallback: alidns\n        }\n"
        "        response {\n            ip(10.0.0.0/8) -> reject\n        }\n"
    )
    service = service_for(spec, FakeUpstreams({"alidns": polluting, "googledns": honest}))
    reply = await ask(service, "www.example.org")
    assert reply.rcode() == dns.rcode.NOERROR and reply.answer == []
    assert addresses(await ask(service, "www.example.cn")) == ["198.51.100.9"]


async def test_the_response_fallback_may_send_the_query_to_another_upstream():
    spec = dns_spec(
        "        request {\n            fallback: alidns\n        }\n"
        "        response {\n            upstream(googledns) -> accept\n            fallback: googledns\n"
        "        }\n"
    )
    upstreams = FakeUpstreams({"alidns": polluting, "googledns": honest})
    assert addresses(await ask(service_for(spec, upstreams), "a.example.cn")) == [HONEST_V4]
    assert [u for u, _ in upstreams.asked] == ["alidns", "googledns"]


async def test_response_rules_that_never_accept_stop_after_the_lookup_depth_with_servfail():
    """dae's MaxDnsLookupDepth: a rule that always asks again (no upstream(...) -> accept)."""
    spec = dns_spec(
        "        request {\n            fallback: alidns\n        }\n"
        "        response {\n            upstream(alidns) -> googledns\n"
        "            upstream(googledns) -> alidns\n        }\n"
    )
    upstreams = FakeUpstreams({"alidns": honest, "googledns": honest})
    reply = await ask(service_for(spec, upstreams), "loop.example.org")
    assert reply.rcode() == dns.rcode.SERVFAIL
    assert len(upstreams.asked) == MAX_LOOKUP_DEPTH  # the fourth upstream is never asked
    assert [u for u, _ in upstreams.asked][:2] == ["alidns", "googledns"]


async def test_response_rules_match_qtype_and_any_of_the_answers_addresses(geodata):
    spec = dns_spec(
        "        request {\n            fallback: alidns\n        }\n"
        "        response {\n            qtype(aaaa) && ip(geoip:cn) -> reject\n"
        "            fallback: accept\n        }\n"
    )
    both = FakeUpstreams(
        {"alidns": lambda _n: ["203.0.113.1", "2001:db8::1", "2001:db8:cc::1"], "googledns": honest}
    )
    service = service_for(spec, both)
    assert (await ask(service, "www.example.org", "AAAA")).answer == []  # 2001:db8:cc::/48 is cn
    assert addresses(await ask(service, "www.example.org", "A")) == ["203.0.113.1"]


async def test_request_rules_choose_the_upstream_by_geosite_qname_and_client_source(geodata):
    """dae docs/en/configuration/dns.md, Examples (qname(geosite:...) -> reject / upstream) and
    upstream honk doc/en/reference/dns.md (sip(...) -> upstream)."""
    spec = dns_spec(
        "        request {\n            qname(geosite:category-ads-all@ads) -> reject\n"
        "            qname(geosite:google@cn) -> alidns\n"
        "            sip(192.168.50.0/24) -> googledns\n            fallback: alidns\n        }\n"
    )
    upstreams = FakeUpstreams({"alidns": honest, "googledns": honest})
    service = service_for(spec, upstreams)
    assert (await ask(service, "x.ads.example", client=LAN_CLIENT)).answer == []
    assert (await ask(service, "tracker.example", client=LAN_CLIENT)).answer != []  # no @ads attribute
    await ask(service, "maps.google.example.cn", client=LAN_CLIENT)
    await ask(service, "www.example.org", client=LAN_CLIENT)
    await ask(service, "www.example.net", client=OTHER_CLIENT)
    assert upstreams.asked == [
        ("googledns", "tracker.example"),
        ("alidns", "maps.google.example.cn"),
        ("googledns", "www.example.org"),
        ("alidns", "www.example.net"),
    ]


async def test_the_service_reads_geodata_through_the_assets_it_is_given(no_geodata, tmp_path):
    """The router's GeoAssets is handed to the DNS service: with no geodata anywhere else, the
    data under its data_dir answers qname(geosite:...)."""
    directory = write_geodata(tmp_path / "data")
    built = DnsSpec(
        upstreams=(
            DnsUpstreamSpec("alidns", "udp", "192.0.2.53"),
            DnsUpstreamSpec("googledns", "udp", "192.0.2.54"),
        ),
        request_rules=(
            DnsRequestRule((DnsCondition("qname", names=(MatchArg("geosite", "cn"),)),), "googledns"),
        ),
        request_fallback="alidns",
    )
    upstreams = FakeUpstreams({"alidns": honest, "googledns": honest})
    service = DnsService(
        built,
        None,
        FakeClock(),
        exchanger=upstreams,  # type: ignore[arg-type]
        geo=GeoAssets(str(directory)),
    )
    await ask(service, "www.example.cn")
    assert upstreams.asked == [("googledns", "www.example.cn")]


# --- the corpus, behaving as written ------------------------------------------------------------

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "dae"
CORPUS_DNS = sorted(p for p in CORPUS.glob("*.dae") if "\ndns {" in p.read_text(encoding="utf-8"))


def corpus_service(path: Path, upstreams: FakeUpstreams) -> DnsService:
    spec = load_file(path).dns
    assert spec is not None
    return DnsService(spec, None, FakeClock(), exchanger=upstreams, geo=GeoAssets())  # type: ignore[arg-type]


async def test_the_dns_reference_case_routes_requests_and_responses_as_written(geodata):
    """tests/corpus/dae/dns_routing_reference.dae (dae's docs/en/configuration/dns.md and upstream
    honk's doc/en/reference/dns.md)."""
    upstreams = FakeUpstreams({"alidns": polluting, "googledns": honest, "proxied": honest})
    service = corpus_service(CORPUS / "dns_routing_reference.dae", upstreams)
    assert (await ask(service, "x.tracker.example")).answer == []  # geosite:category-ads-all -> reject
    assert (await ask(service, "www.example.org", "HTTPS")).answer == []  # qtype(https) -> reject
    await ask(service, "maps.google.example.cn")  # geosite:google@cn -> alidns
    await ask(service, "www.example.org", client=LAN_CLIENT)  # sip(192.168.50.0/24) -> proxied
    await ask(service, "router.home.example")  # the rule over four lines -> alidns (10.x, then re-asked)
    await ask(service, "plain.example.net")  # default: googledns
    assert upstreams.asked == [
        ("alidns", "maps.google.example.cn"),
        ("proxied", "www.example.org"),
        ("alidns", "router.home.example"),
        ("googledns", "router.home.example"),
        ("googledns", "plain.example.net"),
    ]


@pytest.mark.parametrize("path", CORPUS_DNS, ids=[p.name for p in CORPUS_DNS])
async def test_every_corpus_dns_section_answers_and_re_asks_a_polluted_answer_where_it_says_so(path, geodata):
    """Each tests/corpus/dae case with a dns section: a public answer from any upstream is
    accepted; where the case has the dae template's response rule, a private answer for a
    non-CN name is asked again of the trusted upstream."""
    spec = load_file(path).dns
    assert spec is not None
    names = [u.name for u in spec.upstreams]
    upstreams = FakeUpstreams({name: polluting for name in names})
    service = corpus_service(path, upstreams)
    reply = await ask(service, "www.example.org")
    assert reply.rcode() == dns.rcode.NOERROR
    requery = next((r.action for r in spec.response_rules if any(c.kind == "ip" for c in r.conditions)), None)
    asked = [name for name, _ in upstreams.asked]
    if requery is None or asked[0] == requery:
        assert len(asked) == 1
    else:
        assert asked == [asked[0], requery]


def test_geodata_only_dns_rules_read_is_stamped_so_a_changed_file_rebuilds_them_on_reload(geodata):
    """The route's file stamps (what a reload compares) include the DNS rules' geodata: a
    geosite.dat only qname(geosite:...) reads still makes a changed file rebuild the service."""
    from honk.control.desired import lower

    text = (
        "dns {\n    routing {\n        request {\n            qname(geosite:cn) -> default\n"
        "        }\n        response {\n            ip(geoip:cn) -> reject\n        }\n    }\n}\n"
        "routing {\n    dport(22) -> direct\n}\n"
    )
    stamped = {name for name, *_ in lower(load_text(text, "dae")).route.geodata}
    assert {"geosite.dat", "geoip.dat"} <= stamped
