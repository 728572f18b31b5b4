"""The ``flow opened`` line: one record per established flow, honk's key=value text for stderr
and the native stream, mihomo's ``[TCP] src --> target match Type(payload) using Group[leaf]``
for the Clash ``/logs`` stream, and never a credential or Score's target data."""

from __future__ import annotations

import base64
import logging

import pytest

from honk.api import clash_views as views
from honk.config.load import load_text
from honk.connection import flowlog
from honk.connection.dispatch import Dispatcher
from honk.connection.flowlog import FlowOpened, log_flow_opened
from honk.connection.mode import RoutingMode
from honk.connection.plane import build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.logs import FLOW_FIELD, LogBroker, set_level
from honk.core.net import Address, FlowMeta, Network

SOCKS_SECRET = "s0cksPW-flowlog"
SS_SECRET = "ssPW-flowlog"
SS_USERINFO = base64.urlsafe_b64encode(f"aes-256-gcm:{SS_SECRET}".encode()).decode().rstrip("=")
VLESS_UUID = "6f1d6c3e-4b5a-4c2d-9e8f-0a1b2c3d4e5f"
SECRETS = (SOCKS_SECRET, SS_SECRET, SS_USERINFO, VLESS_UUID)

CONFIG = f"""
inbound {{
    lan: 'mixed://127.0.0.1:7890'
}}
node {{
    hk-01: 'socks5://user:{SOCKS_SECRET}@127.0.0.1:9'
    jp: 'ss://{SS_USERINFO}@127.0.0.1:19'
    edge: 'vless://{VLESS_UUID}@127.0.0.1:29?type=tcp&security=none'
}}
group {{
    Proxy {{
        filter: name(hk-01, jp, edge)
    }}
}}
routing {{
    domain(suffix: example.com) -> Proxy
    dport(22) -> direct
    fallback: Proxy
}}
"""

CLIENT = Address("192.168.1.5", 50000)


class Handle:
    """A flow's handle as the tracker reads it."""

    bytes_up = 0
    bytes_down = 0
    last_activity = 0.0

    def close(self, reason=None) -> None:
        pass


async def no_lookup(host: str):
    return []


@pytest.fixture
def dispatcher() -> Dispatcher:
    clock = FakeClock()
    spec = load_text(CONFIG, "dae")
    plane = build_plane(spec, clock, 1)
    return Dispatcher(plane, ConnectionTracker(clock), clock, spec.global_, no_lookup)


@pytest.fixture
def records(caplog) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="honk.connection")
    return caplog


def flow_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, FLOW_FIELD)]


async def open_flow(dispatcher: Dispatcher, target: Address, network: Network = Network.TCP) -> None:
    meta = FlowMeta(network, source=CLIENT, target=target, inbound="lan")
    dispatcher.track(await dispatcher.route(meta), Handle(), network)


def clash_text(record: logging.LogRecord) -> str:
    return views.flow_log_text(getattr(record, FLOW_FIELD))


async def test_a_tcp_flow_by_a_rule_with_a_payload_reads_as_mihomo_writes_it(dispatcher, records):
    await open_flow(dispatcher, Address("www.example.com", 443))
    (record,) = flow_lines(records)
    assert record.levelno == logging.INFO
    assert clash_text(record) == (
        "[TCP] 192.168.1.5:50000 --> www.example.com:443 match DomainSuffix(example.com) using Proxy[hk-01]"
    )
    assert record.getMessage() == (
        "flow opened network=tcp inbound=lan source=192.168.1.5:50000 "
        "target=www.example.com:443 rule=domain(suffix:example.com) chain=Proxy>hk-01"
    )


async def test_the_fallback_reads_as_a_match_rule_without_a_payload(dispatcher, records):
    await open_flow(dispatcher, Address("203.0.113.7", 80))
    (record,) = flow_lines(records)
    assert clash_text(record) == "[TCP] 192.168.1.5:50000 --> 203.0.113.7:80 match Match using Proxy[hk-01]"
    assert record.getMessage().endswith("rule=fallback chain=Proxy>hk-01")


async def test_a_direct_rule_names_direct_as_its_chain(dispatcher, records):
    await open_flow(dispatcher, Address("203.0.113.7", 22))
    (record,) = flow_lines(records)
    assert clash_text(record) == "[TCP] 192.168.1.5:50000 --> 203.0.113.7:22 match DstPort(22) using DIRECT"
    assert record.getMessage().endswith("rule=dport(22) chain=direct")


async def test_a_udp_target_is_tagged_udp_and_an_ipv6_source_is_bracketed(dispatcher, records):
    meta = FlowMeta(
        Network.UDP, source=Address("fd00::5", 5353), target=Address("dns.example.com", 53), inbound="lan"
    )
    routed = await dispatcher.route(meta)
    log_flow_opened(
        Network.UDP, "lan", meta.source, meta.target, routed.rule, routed.chain, dispatcher.plane.spec
    )
    (record,) = flow_lines(records)
    assert clash_text(record) == (
        "[UDP] [fd00::5]:5353 --> dns.example.com:53 match DomainSuffix(example.com) using Proxy[hk-01]"
    )
    assert record.getMessage().startswith("flow opened network=udp inbound=lan source=[fd00::5]:5353 ")


@pytest.mark.parametrize(("mode", "using"), [("direct", "DIRECT"), ("global", "GLOBAL")])
async def test_a_flow_a_mode_routed_names_the_mode_as_mihomo_does(dispatcher, records, mode, using):
    dispatcher.mode = RoutingMode(mode)
    await open_flow(dispatcher, Address("www.example.com", 443))
    (record,) = flow_lines(records)
    assert clash_text(record) == f"[TCP] 192.168.1.5:50000 --> www.example.com:443 using {using}"
    assert f"rule=mode({mode})" in record.getMessage()


def test_a_chain_through_nested_groups_shows_the_rules_target_and_the_leaf():
    assert views.clash_chain(("Proxy", "Auto", "hk-01")) == "Proxy[hk-01]"
    assert views.clash_chain(("hk-01",)) == "hk-01"
    assert views.clash_chain(("block",)) == "REJECT"
    assert views.clash_chain(()) == ""


@pytest.mark.parametrize("member", ["hk-01", "jp", "edge"])
async def test_no_credential_appears_in_either_rendering(dispatcher, records, member):
    dispatcher.plane.groups.select("Proxy", member)
    await open_flow(dispatcher, Address("www.example.com", 443))
    (record,) = flow_lines(records)
    texts = (record.getMessage(), clash_text(record), repr(getattr(record, FLOW_FIELD).chain))
    assert member in texts[0] and member in texts[1]
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


async def test_the_line_carries_the_flows_addresses_and_names_only_never_scores_data(dispatcher, records):
    await open_flow(dispatcher, Address("www.example.com", 443))
    (record,) = flow_lines(records)
    facts = getattr(record, FLOW_FIELD)
    assert isinstance(facts, FlowOpened)
    assert {
        type(v).__name__ for v in (facts.network, facts.source, facts.target, facts.rule, facts.chain)
    } == {"Network", "Address", "str", "tuple"}
    assert "score" not in record.getMessage().lower() and "ScoreTarget" not in clash_text(record)


async def test_nothing_is_formatted_when_the_logger_drops_info(dispatcher, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="honk.connection")
    built = []
    monkeypatch.setattr(flowlog, "kv", lambda **fields: built.append(fields) or "")
    monkeypatch.setattr(flowlog, "FlowOpened", lambda *facts: built.append(facts))
    await open_flow(dispatcher, Address("www.example.com", 443))
    assert flow_lines(caplog) == [] and built == []
    caplog.set_level(logging.INFO, logger="honk.connection")
    await open_flow(dispatcher, Address("www.example.com", 443))
    assert len(built) == 2  # the guard, not the patch, kept them out


async def test_the_clash_stream_writes_mihomos_line_and_the_native_one_honks_from_one_record(dispatcher):
    broker = LogBroker()
    broker.install()
    set_level("info")
    try:
        sub = broker.subscribe("info")
        await open_flow(dispatcher, Address("www.example.com", 443))
        event = await sub.get()
        assert views.log_plain(event.level, views.log_message(event)) == {
            "type": "info",
            "payload": "[TCP] 192.168.1.5:50000 --> www.example.com:443 match DomainSuffix(example.com) "
            "using Proxy[hk-01]",
        }
        assert event.message.startswith("flow opened network=tcp inbound=lan ")
        logging.getLogger("honk.other").info("plain %s", "line")
        assert views.log_message(await sub.get()) == "plain line"
    finally:
        broker.uninstall()
