"""block, the unsupported stand-in, the registry, and the address interleaving of direct."""

from __future__ import annotations

import ipaddress
import logging

import pytest

from honk.config.spec import GlobalSpec, NodeSpec, Spec
from honk.core.clock import FakeClock
from honk.core.errors import Blocked, NotSupported
from honk.core.net import Address
from honk.outbound.block import BlockOutbound
from honk.outbound.direct import BYPASS_MARK, CONNECTION_ATTEMPT_DELAY, DirectOutbound, interleave_families
from honk.outbound.http import HttpOutbound
from honk.outbound.registry import build_outbounds, register_protocol
from honk.outbound.socks5 import Socks5Outbound
from honk.outbound.unsupported import UnsupportedOutbound

TARGET = Address("example.com", 443)


async def test_block_raises_blocked_immediately() -> None:
    with pytest.raises(Blocked):
        await BlockOutbound().dial_tcp(TARGET, deadline=0.0)


async def test_unsupported_node_raises_not_supported_naming_the_protocol() -> None:
    leaf = UnsupportedOutbound("hk-1", "socks5")
    with pytest.raises(NotSupported, match="socks5"):
        await leaf.dial_tcp(TARGET, deadline=0.0)
    assert leaf.supports_udp is False


def test_named_constants_match_rfc_8305_and_upstream() -> None:
    assert CONNECTION_ATTEMPT_DELAY == 0.250
    assert BYPASS_MARK == 0x100


def test_registry_always_has_direct_and_block() -> None:
    outbounds = build_outbounds(Spec(), FakeClock())[0]
    assert isinstance(outbounds["direct"], DirectOutbound)
    assert isinstance(outbounds["block"], BlockOutbound)


def test_registry_builds_nodes_by_protocol() -> None:
    spec = Spec(
        nodes=(
            NodeSpec("hk", "socks5", "127.0.0.1", 1080),
            NodeSpec("web", "http", "127.0.0.1", 8080),
            NodeSpec("lan-direct", "direct"),
            NodeSpec("sink", "block"),
            NodeSpec("later", "hysteria2", "127.0.0.1", 443),
        )
    )
    outbounds, _ = build_outbounds(spec, FakeClock())
    assert list(outbounds) == ["direct", "block", "hk", "web", "lan-direct", "sink", "later"]
    assert isinstance(outbounds["hk"], Socks5Outbound)
    assert isinstance(outbounds["web"], HttpOutbound) and outbounds["web"].protocol == "http"
    assert isinstance(outbounds["later"], UnsupportedOutbound)
    assert (
        isinstance(outbounds["lan-direct"], DirectOutbound) and outbounds["lan-direct"].name == "lan-direct"
    )
    assert isinstance(outbounds["sink"], BlockOutbound) and outbounds["sink"].name == "sink"


def test_registry_first_declared_name_wins(caplog: pytest.LogCaptureFixture) -> None:
    spec = Spec(
        nodes=(
            NodeSpec("hk", "socks5", "127.0.0.1", 1),
            NodeSpec("hk", "direct"),
            NodeSpec("direct", "socks5"),
        )
    )
    with caplog.at_level(logging.WARNING):
        outbounds, _ = build_outbounds(spec, FakeClock())
    assert outbounds["hk"].protocol == "socks5"
    assert isinstance(outbounds["direct"], DirectOutbound)
    assert "more than once" in caplog.text and "built-in" in caplog.text


def test_registry_uses_the_configured_connect_timeout() -> None:
    spec = Spec(global_=GlobalSpec(connect_timeout=1.5))
    assert build_outbounds(spec, FakeClock())[0]["direct"].connect_timeout == 1.5


def test_registering_a_protocol_twice_is_rejected() -> None:
    with pytest.raises(ValueError):
        register_protocol("direct", lambda node, glob, clock: BlockOutbound())


def ips(*texts: str) -> list:
    return [ipaddress.ip_address(t) for t in texts]


def test_interleave_starts_with_the_first_returned_family() -> None:
    assert interleave_families(ips("2001:db8::1", "2001:db8::2", "10.0.0.1", "10.0.0.2", "10.0.0.3")) == ips(
        "2001:db8::1", "10.0.0.1", "2001:db8::2", "10.0.0.2", "10.0.0.3"
    )
    assert interleave_families(ips("10.0.0.1", "2001:db8::1", "2001:db8::2")) == ips(
        "10.0.0.1", "2001:db8::1", "2001:db8::2"
    )


def test_interleave_of_one_family_keeps_the_order() -> None:
    assert interleave_families(ips("10.0.0.2", "10.0.0.1")) == ips("10.0.0.2", "10.0.0.1")
    assert interleave_families([]) == []
