"""VMess, VLESS and Trojan in Clash and sing-box bodies: the same node as the share link, or a reason."""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.config.links import parse_node_link
from honk.config.spec import NodeSpec
from honk.subscription import formats
from honk.subscription.formats import SUPPORTED_PROTOCOLS, ParsedBody, SubscriptionError, parse_body

UUID = "b831381d-6324-4d53-ad4f-8cda48b30811"
FILLER = {"name": "filler", "type": "socks5", "server": "198.51.100.1", "port": 1080}  # keeps a body usable


def vmess_link(**fields: object) -> str:
    obj: dict[str, object] = {"v": "2", "add": "vm.example", "port": "443", "id": UUID, "aid": "0"}
    obj.update(fields)
    return "vmess://" + base64.b64encode(json.dumps(obj).encode()).decode()


def clash_yaml(*proxies: dict) -> bytes:
    return yaml.safe_dump({"proxies": list(proxies)}, sort_keys=False).encode()


def sing_box(*outbounds: dict) -> bytes:
    return json.dumps({"outbounds": [*outbounds, {"type": "direct", "tag": "direct"}]}).encode()


def only_node(body: bytes) -> NodeSpec:
    parsed = parse_body(body, "paid")
    assert parsed.diagnostics == ()
    (node,) = parsed.nodes
    return node


# (share link, Clash proxy, sing-box outbound) for one node each
EQUIVALENT = {
    "vmess-ws-tls": (
        vmess_link(
            ps="vm",
            net="ws",
            host="cdn.example",
            path="/v2",
            tls="tls",
            sni="front.example",
            alpn="h2,http/1.1",
            scy="auto",
        ),
        {
            "name": "vm",
            "type": "vmess",
            "server": "vm.example",
            "port": 443,
            "uuid": UUID,
            "alterId": 0,
            "cipher": "auto",
            "tls": True,
            "servername": "front.example",
            "network": "ws",
            "ws-opts": {"path": "/v2", "headers": {"Host": "cdn.example"}},
            "alpn": ["h2", "http/1.1"],
        },
        {
            "type": "vmess",
            "tag": "vm",
            "server": "vm.example",
            "server_port": 443,
            "uuid": UUID,
            "security": "auto",
            "alter_id": 0,
            "tls": {"enabled": True, "server_name": "front.example", "alpn": ["h2", "http/1.1"]},
            "transport": {"type": "ws", "path": "/v2", "headers": {"Host": "cdn.example"}},
        },
    ),
    "vmess-tcp-plain": (
        vmess_link(ps="vm-plain", add="203.0.113.5", port=10086, id=UUID.upper(), scy="chacha20-poly1305"),
        {
            "name": "vm-plain",
            "type": "vmess",
            "server": "203.0.113.5",
            "port": "10086",
            "uuid": UUID.upper(),
            "alterId": "0",
            "cipher": "chacha20-poly1305",
        },
        {
            "type": "vmess",
            "tag": "vm-plain",
            "server": "203.0.113.5",
            "server_port": 10086,
            "uuid": UUID,
            "security": "chacha20-poly1305",
        },
    ),
    "vless-tcp-tls-insecure": (
        f"vless://{UUID}@vl.example:443?security=tls&sni=vl.example&allowInsecure=1&flow=#vl",
        {
            "name": "vl",
            "type": "vless",
            "server": "vl.example",
            "port": 443,
            "uuid": UUID,
            "tls": True,
            "servername": "vl.example",
            "skip-cert-verify": True,
            "flow": "",
        },
        {
            "type": "vless",
            "tag": "vl",
            "server": "vl.example",
            "server_port": 443,
            "uuid": UUID,
            "flow": "",
            "tls": {"enabled": True, "server_name": "vl.example", "insecure": True},
        },
    ),
    "vless-ws-plain": (
        f"vless://{UUID}@vl.example:80?security=none&type=ws&path=%2Fws&host=cdn.example#vl-ws",
        {
            "name": "vl-ws",
            "type": "vless",
            "server": "vl.example",
            "port": 80,
            "uuid": UUID,
            "network": "ws",
            "ws-opts": {"path": "/ws", "headers": {"host": "cdn.example"}},
        },
        {
            "type": "vless",
            "tag": "vl-ws",
            "server": "vl.example",
            "server_port": 80,
            "uuid": UUID,
            "transport": {"type": "ws", "path": "/ws", "headers": {"Host": ["cdn.example"]}},
        },
    ),
    "trojan-tcp": (
        "trojan://pw%40x@tj.example:443?sni=tj.example&alpn=h2#tj",
        {
            "name": "tj",
            "type": "trojan",
            "server": "tj.example",
            "port": 443,
            "password": "pw@x",
            "sni": "tj.example",
            "alpn": ["h2"],
        },
        {
            "type": "trojan",
            "tag": "tj",
            "server": "tj.example",
            "server_port": 443,
            "password": "pw@x",
            "tls": {"enabled": True, "server_name": "tj.example", "alpn": "h2"},
        },
    ),
    "trojan-ws-insecure": (
        "trojan://pw@[2001:db8::5]:8443?type=ws&host=cdn.example&path=/p&allowInsecure=1#tj-ws",
        {
            "name": "tj-ws",
            "type": "trojan",
            "server": "2001:db8::5",
            "port": 8443,
            "password": "pw",
            "skip-cert-verify": True,
            "network": "ws",
            "ws-path": "/p",
            "ws-headers": {"Host": "cdn.example"},
        },
        {
            "type": "trojan",
            "tag": "tj-ws",
            "server": "2001:db8::5",
            "server_port": 8443,
            "password": "pw",
            "tls": {"enabled": True, "insecure": True},
            "transport": {"type": "ws", "path": "/p", "headers": {"Host": "cdn.example"}},
        },
    ),
}


@pytest.mark.parametrize("case", EQUIVALENT)
def test_a_clash_proxy_a_sing_box_outbound_and_the_share_link_give_the_same_node(case):
    link, proxy, outbound = EQUIVALENT[case]
    from_link = parse_node_link(link)
    from_clash = only_node(clash_yaml(proxy))
    from_sing_box = only_node(sing_box(outbound))
    assert from_clash == from_link == from_sing_box
    assert from_clash.params == from_link.params and from_clash.subscription == "paid"


def test_the_three_protocols_are_admitted_from_link_lists_too():
    body = "\n".join(link for link, _, _ in EQUIVALENT.values())
    parsed = parse_body(body.encode())
    assert [n.protocol for n in parsed.nodes] == ["vmess", "vmess", "vless", "vless", "trojan", "trojan"]
    assert parsed.diagnostics == ()


def test_a_sing_box_certificate_path_is_the_nodes_ca():
    outbound = {
        "type": "trojan",
        "tag": "tj",
        "server": "tj.example",
        "server_port": 443,
        "password": "pw",
        "tls": {"enabled": True, "server_name": "tj.example", "certificate_path": "/etc/honk/ca.pem"},
    }
    node = only_node(sing_box(outbound))
    assert dict(node.params)["ca"] == "/etc/honk/ca.pem"
    assert node == parse_node_link("trojan://pw@tj.example:443?sni=tj.example&ca=%2Fetc%2Fhonk%2Fca.pem#tj")


def test_client_side_options_that_the_server_does_not_see_are_not_carried():
    _, proxy, outbound = EQUIVALENT["vmess-ws-tls"]
    clash = {
        **proxy,
        "client-fingerprint": "chrome",
        "udp": True,
        "packet-encoding": "xudp",
        "global-padding": True,
        "authenticated-length": True,
        "ws-opts": {
            **proxy["ws-opts"],
            "max-early-data": 2048,
            "early-data-header-name": "Sec-WebSocket-Protocol",
        },
    }
    box = {
        **outbound,
        "packet_encoding": "xudp",
        "global_padding": True,
        "tls": {**outbound["tls"], "utls": {"enabled": True, "fingerprint": "chrome"}},
        "transport": {**outbound["transport"], "max_early_data": 2048},
    }
    assert only_node(clash_yaml(clash)) == only_node(clash_yaml(proxy))
    assert only_node(sing_box(box)) == only_node(sing_box(outbound))


VMESS = {"name": "v", "type": "vmess", "server": "vm.example", "port": 443, "uuid": UUID}
VLESS = {"name": "v", "type": "vless", "server": "vl.example", "port": 443, "uuid": UUID}
TROJAN = {"name": "t", "type": "trojan", "server": "tj.example", "port": 443, "password": "pw"}


@pytest.mark.parametrize(
    ("proxy", "reason"),
    [
        ({**VLESS, "flow": "xtls-rprx-vision"}, "unsupported-flow"),
        ({**VLESS, "encryption": "mlkem768x25519plus"}, "unsupported-encryption"),
        ({**VLESS, "tls": True, "reality-opts": {"public-key": "k"}}, "unsupported-security"),
        ({**VMESS, "alterId": 64}, "unsupported-alter-id"),
        ({**VMESS, "alterId": "many"}, "invalid-alter-id"),
        ({**VMESS, "cipher": "zero"}, "unsupported-cipher"),
        ({**VMESS, "network": "grpc", "grpc-opts": {"grpc-service-name": "x"}}, "unsupported-transport"),
        ({**VMESS, "network": "h2"}, "unsupported-transport"),
        ({**VMESS, "network": "http"}, "unsupported-transport"),
        ({**VMESS, "network": "ws", "ws-opts": {"v2ray-http-upgrade": True}}, "unsupported-transport"),
        ({**VMESS, "network": "ws", "ws-opts": "/path"}, "invalid-ws-opts"),
        ({**VMESS, "smux": {"enabled": True}}, "unsupported-feature"),
        ({**TROJAN, "fingerprint": "ab" * 32}, "unsupported-feature"),
        ({**TROJAN, "certificate": "client.pem", "private-key": "client.key"}, "unsupported-feature"),
        ({**TROJAN, "ech-opts": {"enable": True}}, "unsupported-feature"),
        ({**TROJAN, "sni": "a.example", "servername": "b.example"}, "conflicting-fields"),
        ({**TROJAN, "alpn": {"h2": True}}, "invalid-alpn"),
        ({**TROJAN, "skip-cert-verify": "yes"}, "invalid-skip-cert-verify"),
        ({**TROJAN, "password": ""}, "missing-password"),
        ({**VLESS, "uuid": "not-a-uuid"}, "invalid-uuid"),
        ({**VMESS, "uuid": None}, "missing-uuid"),
    ],
)
def test_clash_entries_honk_cannot_dial_are_skipped_with_their_reason(proxy, reason):
    parsed = parse_body(clash_yaml(proxy, FILLER))
    assert [n.name for n in parsed.nodes] == ["filler"]
    assert [(d.index, d.reason) for d in parsed.diagnostics] == [(1, reason)]


BOX_VMESS = {"type": "vmess", "tag": "v", "server": "vm.example", "server_port": 443, "uuid": UUID}
BOX_VLESS = {"type": "vless", "tag": "v", "server": "vl.example", "server_port": 443, "uuid": UUID}
BOX_TROJAN = {
    "type": "trojan",
    "tag": "t",
    "server": "tj.example",
    "server_port": 443,
    "password": "pw",
    "tls": {"enabled": True},
}


@pytest.mark.parametrize(
    ("outbound", "reason"),
    [
        ({**BOX_VLESS, "flow": "xtls-rprx-vision"}, "unsupported-flow"),
        (
            {**BOX_VLESS, "tls": {"enabled": True, "reality": {"enabled": True, "public_key": "k"}}},
            "unsupported-security",
        ),
        ({**BOX_TROJAN, "tls": {"enabled": False}}, "unsupported-security"),
        ({**BOX_TROJAN, "tls": None}, "unsupported-security"),
        ({**BOX_VMESS, "alter_id": 1}, "unsupported-alter-id"),
        ({**BOX_VMESS, "security": "aes-128-cfb"}, "unsupported-cipher"),
        ({**BOX_VMESS, "transport": {"type": "grpc", "service_name": "x"}}, "unsupported-transport"),
        ({**BOX_VMESS, "transport": {"type": "httpupgrade"}}, "unsupported-transport"),
        ({**BOX_VMESS, "transport": {"type": "quic"}}, "unsupported-transport"),
        ({**BOX_VMESS, "transport": "ws"}, "invalid-transport"),
        (
            {**BOX_VMESS, "transport": {"type": "ws", "headers": {"Host": ["a.example", "b.example"]}}},
            "unsupported-feature",
        ),
        ({**BOX_VMESS, "multiplex": {"enabled": True, "protocol": "smux"}}, "unsupported-feature"),
        (
            {**BOX_TROJAN, "tls": {"enabled": True, "certificate": ["-----BEGIN CERTIFICATE-----"]}},
            "unsupported-feature",
        ),
        ({**BOX_TROJAN, "tls": {"enabled": True, "ech": {"enabled": True}}}, "unsupported-feature"),
        ({**BOX_TROJAN, "tls": {"enabled": "yes"}}, "invalid-tls"),
        ({**BOX_TROJAN, "tls": "on"}, "invalid-tls"),
        ({**BOX_VLESS, "uuid": 12345}, "invalid-uuid"),
    ],
)
def test_sing_box_outbounds_honk_cannot_dial_are_skipped_with_their_reason(outbound, reason):
    filler = {"type": "socks", "tag": "filler", "server": "198.51.100.1", "server_port": 1080}
    parsed = parse_body(sing_box(outbound, filler))
    assert [n.name for n in parsed.nodes] == ["filler"]
    assert [(d.index, d.reason) for d in parsed.diagnostics] == [(1, reason)]


# --- fuzz --------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [UUID, UUID.upper(), "tcp", "ws", "grpc", "tls", "auto", "zero", "/p", "h2", "Host", "0", ""]
    ),
)
_KEYS = st.sampled_from(
    [
        "uuid",
        "password",
        "alterId",
        "alter_id",
        "cipher",
        "security",
        "tls",
        "servername",
        "sni",
        "server_name",
        "skip-cert-verify",
        "insecure",
        "alpn",
        "flow",
        "network",
        "ws-opts",
        "ws-path",
        "ws-headers",
        "path",
        "headers",
        "Host",
        "transport",
        "type",
        "enabled",
        "reality",
        "reality-opts",
        "smux",
        "multiplex",
        "certificate",
        "certificate_path",
        "utls",
        "ech",
        "ech-opts",
        "encryption",
        "fingerprint",
    ]
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=20,
)
_ENTRY = st.builds(
    lambda kind, extra, server, port: {
        **extra,
        "type": kind,
        "server": server,
        "port": port,
        "server_port": port,
    },
    st.sampled_from(["vmess", "vless", "trojan", "VMess"]),
    st.dictionaries(_KEYS, _VALUE, max_size=10),
    st.sampled_from(["h.example", "127.0.0.1", "::1", ""]),
    st.sampled_from([443, "8443", 0]),
)


@FUZZ
@given(_ENTRY, st.sampled_from([formats._clash_entry, formats._singbox_entry]))
def test_the_entry_parsers_give_a_node_or_a_reason_for_any_near_valid_entry(entry, parser):
    try:
        node = parser(entry)
    except formats._Skip as skip:
        assert skip.reason and skip.reason == skip.reason.strip()
        return
    assert isinstance(node, NodeSpec) and node.protocol in ("vmess", "vless", "trojan")
    assert node.id == formats.with_node_id(node).id


@FUZZ
@given(st.lists(_ENTRY, max_size=6), st.sampled_from(["proxies", "outbounds"]))
def test_bodies_of_near_valid_entries_parse_or_raise_subscription_error(entries, key):
    try:
        parsed = parse_body(json.dumps({key: entries}, default=str).encode(), "fuzz")
    except SubscriptionError as exc:
        assert exc.reason
        return
    assert isinstance(parsed, ParsedBody) and all(n.protocol in SUPPORTED_PROTOCOLS for n in parsed.nodes)
