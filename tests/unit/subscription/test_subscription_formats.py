"""Subscription body formats: detection, per-format mapping, admission and bounds."""

from __future__ import annotations

import base64
import json

import pytest

from honk.config.links import parse_node_link
from honk.subscription.formats import (
    MAX_BODY_BYTES,
    MAX_DIAGNOSTICS,
    EntryDiagnostic,
    SubscriptionError,
    parse_body,
)

SECRET = "s3cretPW"
SS_USERINFO = base64.urlsafe_b64encode(f"aes-256-gcm:{SECRET}".encode()).decode().rstrip("=")

# One node set written four ways (SIP008 carries only the Shadowsocks nodes).
LINKS = (
    f"socks5://alice:{SECRET}@198.51.100.7:1080#edge-socks\n"
    f"ss://{SS_USERINFO}@203.0.113.9:8388#edge-ss\n"
    "ss://chacha20-ietf-poly1305:pw2@[2001:db8::1]:8389#v6-ss\n"
)
CLASH_YAML = f"""\
port: 7890
proxies:
  - {{name: edge-socks, type: socks5, server: 198.51.100.7, port: 1080, username: alice, password: {SECRET}}}
  - name: edge-ss
    type: ss
    server: 203.0.113.9
    port: "8388"
    cipher: AES-256-GCM
    password: {SECRET}
  - {{name: v6-ss, type: shadowsocks, server: "2001:db8::1", port: 8389, cipher: chacha20-ietf-poly1305, password: pw2}}
proxy-groups:
  - {{name: auto, type: url-test, proxies: [edge-ss]}}
"""
SINGBOX = {
    "log": {"level": "info"},
    "outbounds": [
        {"type": "selector", "tag": "proxy", "outbounds": ["edge-ss"]},
        {
            "type": "socks",
            "tag": "edge-socks",
            "server": "198.51.100.7",
            "server_port": 1080,
            "version": "5",
            "username": "alice",
            "password": SECRET,
        },
        {
            "type": "shadowsocks",
            "tag": "edge-ss",
            "server": "203.0.113.9",
            "server_port": 8388,
            "method": "aes-256-gcm",
            "password": SECRET,
        },
        {
            "type": "shadowsocks",
            "tag": "v6-ss",
            "server": "2001:db8::1",
            "server_port": 8389,
            "method": "chacha20-ietf-poly1305",
            "password": "pw2",
        },
        {"type": "direct", "tag": "direct"},
        {"type": "block", "tag": "block"},
        {"type": "dns", "tag": "dns-out"},
    ],
}
SIP008 = {
    "version": 1,
    "servers": [
        {
            "id": "27b8a625-4f4b-4428-9f0f-8a2317db7c79",
            "remarks": "edge-ss",
            "server": "203.0.113.9",
            "server_port": 8388,
            "password": SECRET,
            "method": "aes-256-gcm",
            "plugin": "",
            "plugin_opts": "",
        },
        {
            "remarks": "v6-ss",
            "server": "2001:db8::1",
            "server_port": 8389,
            "password": "pw2",
            "method": "chacha20-ietf-poly1305",
        },
    ],
}


def ids(body: bytes | str, tag: str = "paid") -> list:
    data = body.encode() if isinstance(body, str) else body
    return [n.id for n in parse_body(data, tag).nodes]


def test_the_four_formats_of_one_node_set_give_the_same_node_ids():
    from_links = ids(LINKS)
    assert len(from_links) == 3
    assert ids(CLASH_YAML) == from_links
    assert ids(json.dumps(SINGBOX)) == from_links
    assert ids(json.dumps(SIP008)) == from_links[1:]


def test_each_format_is_detected_and_named():
    assert parse_body(LINKS.encode()).format == "links"
    assert parse_body(base64.b64encode(LINKS.encode())).format == "links-base64"
    assert parse_body(CLASH_YAML.encode()).format == "clash"
    assert parse_body(clash({"type": "socks5", "server": "h.example", "port": 1})).format == "clash"
    assert parse_body(json.dumps(SINGBOX).encode()).format == "sing-box"
    assert parse_body(json.dumps(SIP008).encode()).format == "sip008"
    assert parse_body(json.dumps(SIP008["servers"]).encode()).format == "sip008"


def test_nodes_carry_the_subscription_tag_and_keep_their_names():
    nodes = parse_body(CLASH_YAML.encode(), "paid").nodes
    assert [(n.name, n.protocol, n.subscription) for n in nodes] == [
        ("edge-socks", "socks5", "paid"),
        ("edge-ss", "ss", "paid"),
        ("v6-ss", "ss", "paid"),
    ]
    ss = nodes[1]
    assert (ss.host, ss.port, ss.encryption, ss.password) == ("203.0.113.9", 8388, "aes-256-gcm", SECRET)


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda b: base64.b64encode(b), id="standard-padded"),
        pytest.param(lambda b: base64.urlsafe_b64encode(b).rstrip(b"="), id="urlsafe-unpadded"),
        pytest.param(lambda b: b"\n".join(base64.encodebytes(b).split(b"\n")) + b"\r\n", id="wrapped-lines"),
        pytest.param(
            lambda b: b"\xef\xbb\xbf" + base64.b64encode(b"\xef\xbb\xbf" + b), id="bom-outside-and-inside"
        ),
    ],
)
def test_base64_link_lists_decode_in_every_accepted_spelling(encode):
    assert ids(encode(LINKS.encode())) == ids(LINKS)


def test_comments_blank_lines_and_shadowrocket_metadata_are_skipped_without_diagnostics():
    body = "\ufeffREMARKS=My Airport\nSTATUS=expires 2030\n\n# a comment\n   \n" + LINKS
    parsed = parse_body(body.encode())
    assert len(parsed.nodes) == 3 and parsed.diagnostics == ()


def test_unsupported_and_malformed_links_are_skipped_with_their_line_and_a_static_reason():
    body = (
        "# header\n"
        f"tuic://{SECRET}\n"
        f"socks5://alice:{SECRET}@198.51.100.7:1080#edge-socks\n"
        f"hysteria2://{SECRET}@example.com:443\n"
        "socks5://nohost-port.example\n"
        f"ss://{SS_USERINFO}@203.0.113.9:8388/?plugin=obfs-local%3Bobfs%3Dhttp#needs-plugin\n"
    )
    parsed = parse_body(body.encode())
    assert [n.name for n in parsed.nodes] == ["edge-socks"]
    assert [(d.index, d.reason) for d in parsed.diagnostics] == [
        (2, "unsupported-scheme"),
        (4, "unsupported-scheme"),
        (5, "missing-port"),
        (6, "unsupported-plugin"),
    ]
    assert all(SECRET not in str(d) and "example" not in str(d) for d in parsed.diagnostics)


def test_first_occurrence_of_a_node_id_wins_and_later_ones_name_it():
    body = LINKS + f"socks5://alice:{SECRET}@198.51.100.7:1080#renamed-copy\n"
    parsed = parse_body(body.encode())
    assert [n.name for n in parsed.nodes] == ["edge-socks", "edge-ss", "v6-ss"]
    assert parsed.diagnostics == (EntryDiagnostic(4, "duplicate-node", first=1),)


def test_a_body_with_no_usable_node_is_a_typed_error_carrying_the_reasons():
    with pytest.raises(SubscriptionError) as info:
        parse_body(f"tuic://{SECRET}\nREMARKS=x\n".encode())
    assert info.value.reason == "no-usable-node"
    assert [d.reason for d in info.value.diagnostics] == ["unsupported-scheme"]
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty-body"),
        (b" \n\t\n", "empty-body"),
        (b"\xff\xfe socks5://", "invalid-encoding"),
        (b"just some words", "unrecognised-format"),
        (b'{"hello": "world"}', "unrecognised-format"),
        (b"proxies: 3\n", "unrecognised-format"),
        (b"proxies: []\n", "no-usable-node"),
        (b"REMARKS=only metadata\n", "unrecognised-format"),
    ],
)
def test_malformed_documents_are_rejected_with_a_reason(body, reason):
    with pytest.raises(SubscriptionError) as info:
        parse_body(body)
    assert info.value.reason == reason


def test_a_body_over_eight_mebibytes_is_refused_before_parsing():
    with pytest.raises(SubscriptionError) as info:
        parse_body(b"#" * (MAX_BODY_BYTES + 1))
    assert info.value.reason == "body-too-large"
    padded = LINKS.encode() + b"#" * (MAX_BODY_BYTES - len(LINKS))
    assert len(parse_body(padded).nodes) == 3  # exactly at the cap is fine


def test_diagnostics_stop_at_the_cap_and_the_rest_are_counted():
    extra = 40
    body = "\n".join([f"vmess://x{i}" for i in range(MAX_DIAGNOSTICS + extra)] + [LINKS])
    parsed = parse_body(body.encode())
    assert len(parsed.diagnostics) == MAX_DIAGNOSTICS
    assert parsed.omitted == extra and parsed.skipped == MAX_DIAGNOSTICS + extra
    assert len(parsed.nodes) == 3  # the cap never stops admission


# --- Clash -------------------------------------------------------------------------------


def clash(*proxies: dict) -> bytes:
    return json.dumps({"proxies": list(proxies)}).encode()


def test_clash_ports_may_be_numeric_strings_and_bad_ports_skip_the_entry():
    body = clash(
        {"name": "a", "type": "socks5", "server": "h.example", "port": "1080"},
        {"name": "b", "type": "socks5", "server": "h.example", "port": "0"},
        {"name": "c", "type": "socks5", "server": "h.example", "port": 70000},
        {"name": "d", "type": "socks5", "server": "h.example", "port": "10 80"},
        {"name": "e", "type": "socks5", "server": "h.example", "port": True},
    )
    parsed = parse_body(body)
    assert [(n.name, n.port) for n in parsed.nodes] == [("a", 1080)]
    assert [(d.index, d.reason) for d in parsed.diagnostics] == [(i, "invalid-port") for i in (2, 3, 4, 5)]


def test_clash_entries_with_a_plugin_are_skipped():
    base = {"type": "ss", "server": "h.example", "port": 8388, "cipher": "aes-128-gcm", "password": SECRET}
    parsed = parse_body(
        clash(
            {**base, "name": "plain", "plugin": ""},
            {**base, "name": "obfs", "port": 8389, "plugin": "obfs"},
            {**base, "name": "opts", "port": 8390, "plugin-opts": {"mode": "tls"}},
        )
    )
    assert [n.name for n in parsed.nodes] == ["plain"]
    assert [d.reason for d in parsed.diagnostics] == ["unsupported-plugin", "unsupported-plugin"]


def test_clash_http_with_tls_is_an_https_node_with_its_server_name():
    parsed = parse_body(
        clash(
            {
                "name": "web",
                "type": "http",
                "server": "proxy.example",
                "port": 443,
                "tls": True,
                "sni": "front.example",
                "skip-cert-verify": True,
            }
        )
    )
    (node,) = parsed.nodes
    assert node.protocol == "https"
    assert dict(node.params) == {"sni": "front.example", "allowInsecure": "1"}
    assert node.id == parse_node_link("https://proxy.example:443?sni=front.example&allowInsecure=1").id


def test_clash_numeric_credentials_become_decimal_text_and_other_types_skip():
    parsed = parse_body(
        clash(
            {
                "name": "num",
                "type": "socks5",
                "server": "h.example",
                "port": 1,
                "username": 42,
                "password": 7,
            },
            {"name": "list", "type": "socks5", "server": "h.example", "port": 2, "password": [SECRET]},
            {"name": "bool", "type": "socks5", "server": "h.example", "port": 3, "username": True},
        )
    )
    (node,) = parsed.nodes
    assert (node.username, node.password) == ("42", "7")
    assert [d.reason for d in parsed.diagnostics] == ["invalid-password", "invalid-username"]


def test_clash_unknown_types_and_missing_fields_are_located():
    parsed = parse_body(
        clash(
            {"name": "h", "type": "hysteria2", "server": "h.example", "port": 443, "password": SECRET},
            "not an object",
            {"name": "no-type", "server": "h.example", "port": 1},
            {"name": "no-server", "type": "socks5", "port": 1},
            {
                "name": "bad-cipher",
                "type": "ss",
                "server": "h.example",
                "port": 1,
                "cipher": "rc4-md5",
                "password": SECRET,
            },
            {"name": "no-password", "type": "ss", "server": "h.example", "port": 1, "cipher": "aes-128-gcm"},
            {"name": "ok", "type": "http", "server": "h.example", "port": 8080},
        )
    )
    assert [n.name for n in parsed.nodes] == ["ok"]
    assert [(d.index, d.reason) for d in parsed.diagnostics] == [
        (1, "unsupported-protocol"),
        (2, "not-an-object"),
        (3, "missing-type"),
        (4, "missing-server"),
        (5, "unsupported-cipher"),
        (6, "missing-password"),
    ]


def test_clash_entry_without_a_name_gets_type_server_and_port():
    (node,) = parse_body(clash({"type": "socks5", "server": "H.Example.", "port": 1080})).nodes
    assert node.name == "socks5-h.example:1080" and node.host == "h.example"


# --- sing-box and SIP008 -----------------------------------------------------------------------


def test_sing_box_structural_outbounds_are_passed_over_silently_and_others_are_diagnosed():
    body = {
        "outbounds": [
            {"type": "urltest", "tag": "auto", "outbounds": ["x"]},
            {"type": "tuic", "tag": "t", "server": "h.example", "server_port": 443, "uuid": SECRET},
            {"type": "socks", "tag": "chained", "server": "h.example", "server_port": 1, "detour": "v"},
            {"type": "socks", "tag": "four", "server": "h.example", "server_port": 2, "version": "4a"},
            {
                "type": "http",
                "tag": "tls",
                "server": "h.example",
                "server_port": 443,
                "tls": {"enabled": True, "server_name": "sni.example"},
            },
        ]
    }
    parsed = parse_body(json.dumps(body).encode())
    assert [(n.name, n.protocol, dict(n.params)) for n in parsed.nodes] == [
        ("tls", "https", {"sni": "sni.example"})
    ]
    assert [(d.index, d.reason) for d in parsed.diagnostics] == [
        (2, "unsupported-protocol"),
        (3, "unsupported-feature"),
        (4, "unsupported-feature"),
    ]


def test_sip008_active_plugins_are_skipped_and_empty_ones_are_harmless():
    servers = [
        {"server": "h.example", "server_port": 1, "method": "aes-128-gcm", "password": SECRET, "plugin": ""},
        {
            "server": "h.example",
            "server_port": 2,
            "method": "aes-128-gcm",
            "password": SECRET,
            "plugin": "v2ray-plugin",
            "plugin_opts": "server",
        },
    ]
    parsed = parse_body(json.dumps({"version": 1, "servers": servers}).encode())
    assert [(n.name, n.port) for n in parsed.nodes] == [("ss-h.example:1", 1)]
    assert [(d.index, d.reason) for d in parsed.diagnostics] == [(2, "unsupported-plugin")]
