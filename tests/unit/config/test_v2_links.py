"""vmess:// (v2rayN base64 JSON), vless:// and trojan:// share links -> NodeSpec."""

from __future__ import annotations

import base64
import json

import pytest
from config_helpers import SECRET
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.links import LinkError, parse_node_link

UUID = "b831381d-6324-4d53-ad4f-8cda48b30811"
OTHER_UUID = "0f0e0d0c-0b0a-4908-8706-050403020100"


def vmess(**fields: object) -> str:
    """A v2rayN vmess link; ``fields`` override a plain TCP node at vm.example:443."""
    obj: dict[str, object] = {
        "v": "2",
        "ps": "",
        "add": "vm.example",
        "port": "443",
        "id": UUID,
        "aid": "0",
        "scy": "",
        "net": "tcp",
        "type": "none",
        "host": "",
        "path": "",
        "tls": "",
    }
    obj.update(fields)
    return "vmess://" + base64.b64encode(json.dumps(obj).encode()).decode()


def code_of(link: str) -> str:
    with pytest.raises(LinkError) as info:
        parse_node_link(link)
    return info.value.code


# --- vmess -------------------------------------------------------------------------------


def test_vmess_v2rayn_json_maps_to_a_vmess_node():
    node = parse_node_link(
        vmess(ps="Tokyo 1", add="VM.Example", port=8443, id=UUID.upper(), scy="chacha20-poly1305")
    )
    assert (node.name, node.protocol, node.host, node.port) == ("Tokyo 1", "vmess", "vm.example", 8443)
    assert (node.username, node.password, node.encryption) == (UUID, None, "chacha20-poly1305")
    assert node.params == (("type", "tcp"), ("security", "none"))


def test_vmess_over_websocket_and_tls_keeps_its_dial_shape():
    node = parse_node_link(
        vmess(net="ws", host="cdn.example", path="/v2", tls="tls", sni="Front.Example", alpn="h2, http/1.1")
    )
    assert node.params == (
        ("type", "ws"),
        ("security", "tls"),
        ("host", "cdn.example"),
        ("path", "/v2"),
        ("sni", "front.example"),
        ("alpn", "h2,http/1.1"),
    )


@pytest.mark.parametrize(
    ("scy", "cipher"),
    [
        ("", "auto"),
        ("AUTO", "auto"),
        ("Aes-128-Gcm", "aes-128-gcm"),
        ("none", "none"),
        ("chacha20-poly1305", "chacha20-poly1305"),
    ],
)
def test_vmess_cipher_is_normalised_and_empty_means_auto(scy, cipher):
    assert parse_node_link(vmess(scy=scy)).encryption == cipher


@pytest.mark.parametrize("scy", ["zero", "aes-128-cfb", "chacha20-ietf-poly1305", "rc4"])
def test_vmess_ciphers_outside_the_four_are_unsupported(scy):
    assert code_of(vmess(scy=scy)) == "unsupported-cipher"


@pytest.mark.parametrize("aid", [1, "64", " 2 "])
def test_vmess_with_a_positive_alter_id_is_refused(aid):
    assert code_of(vmess(aid=aid)) == "unsupported-alter-id"


@pytest.mark.parametrize("aid", [0, "0", "", None])
def test_vmess_alter_id_zero_or_absent_is_the_aead_header(aid):
    assert parse_node_link(vmess(aid=aid)).protocol == "vmess"


def test_vmess_port_may_be_a_number_or_text_but_is_required():
    assert parse_node_link(vmess(port=10086)).port == parse_node_link(vmess(port="10086")).port == 10086
    assert code_of(vmess(port="")) == "missing-port"
    assert code_of(vmess(port="0")) == "invalid-port"
    assert code_of(vmess(port=True)) == "invalid-field"


def test_vmess_without_a_remark_is_named_after_its_host_and_a_tag_wins():
    assert parse_node_link(vmess(add="10.0.0.9")).name == "vmess-10.0.0.9"
    assert parse_node_link(vmess(ps="remark"), "tagged").name == "tagged"


def test_vmess_accepts_url_safe_base64_without_padding():
    link = vmess(ps="k>?~")
    body = base64.b64decode(link.removeprefix("vmess://"))
    urlsafe = "vmess://" + base64.urlsafe_b64encode(body).decode().rstrip("=")
    assert parse_node_link(urlsafe) == parse_node_link(link)


@pytest.mark.parametrize(
    ("link", "code"),
    [
        ("vmess://not base64!", "invalid-link"),
        ("vmess://" + base64.b64encode(b"[1, 2]").decode(), "invalid-link"),
        ("vmess://" + base64.b64encode(b"{not json").decode(), "invalid-link"),
        (vmess(id="not-a-uuid"), "invalid-uuid"),
        (vmess(add=""), "missing-host"),
        (vmess(net="grpc"), "unsupported-transport"),
        (vmess(net="h2"), "unsupported-transport"),
        (vmess(type="http"), "unsupported-transport"),
        (vmess(tls="reality"), "unsupported-security"),
        (vmess(aid="x"), "invalid-alter-id"),
    ],
)
def test_malformed_vmess_links_raise_a_coded_error(link, code):
    assert code_of(link) == code


# --- vless -------------------------------------------------------------------------------


def test_vless_link_maps_to_a_vless_node_over_tls_by_default():
    node = parse_node_link(f"vless://{UUID}@Edge.Example:8443?type=tcp&sni=edge.example#edge%201")
    assert (node.name, node.protocol, node.host, node.port) == ("edge 1", "vless", "edge.example", 8443)
    assert (node.username, node.password, node.encryption) == (UUID, None, None)
    assert node.params == (("type", "tcp"), ("security", "tls"), ("sni", "edge.example"))


def test_vless_over_websocket_with_every_dial_parameter():
    node = parse_node_link(
        f"vless://{UUID}@edge.example?type=ws&security=tls&sni=front.example&path=%2Fws"
        "&host=cdn.example&alpn=h2&encryption=none&allowInsecure=1"
    )
    assert node.port == 443  # a URL-shaped link defaults an omitted port to 443
    assert node.params == (
        ("type", "ws"),
        ("security", "tls"),
        ("host", "cdn.example"),
        ("path", "/ws"),
        ("sni", "front.example"),
        ("alpn", "h2"),
        ("allowInsecure", "1"),
    )


def test_vless_with_security_none_is_plaintext_and_drops_tls_fields():
    node = parse_node_link(f"vless://{UUID}@h.example:80?security=none&sni=x.example&alpn=h2&allowInsecure=1")
    assert node.params == (("type", "tcp"), ("security", "none"))


@pytest.mark.parametrize("flow", ["xtls-rprx-vision", "xtls-rprx-direct", "anything"])
def test_vless_with_a_flow_is_unsupported(flow):
    assert code_of(f"vless://{UUID}@h.example:443?flow={flow}") == "unsupported-flow"


def test_vless_with_an_empty_flow_is_no_flow():
    assert (
        parse_node_link(f"vless://{UUID}@h.example:443?flow=").id
        == parse_node_link(f"vless://{UUID}@h.example:443").id
    )


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("type=grpc", "unsupported-transport"),
        ("type=ws&network=tcp", "conflicting-transport"),
        ("security=reality", "unsupported-security"),
        ("pbk=abc", "unsupported-security"),
        ("encryption=mlkem768", "unsupported-encryption"),
        ("sni=a.example&peer=b.example", "conflicting-sni"),
        ("allowInsecure=maybe", "invalid-allow-insecure"),
        ("allowInsecure=1&insecure=0", "conflicting-allow-insecure"),
        ("headerType=http", "unsupported-transport"),
    ],
)
def test_vless_links_with_unsupported_or_conflicting_parameters_are_refused(query, code):
    assert code_of(f"vless://{UUID}@h.example:443?{query}") == code


def test_vless_user_id_must_be_a_uuid():
    assert code_of(f"vless://{SECRET}@h.example:443") == "invalid-uuid"
    assert code_of("vless://h.example:443") == "missing-credentials"


# --- trojan ------------------------------------------------------------------------------


def test_trojan_link_maps_to_a_trojan_node_always_over_tls():
    node = parse_node_link(f"trojan://{SECRET}%40x:y@tj.example:443?sni=tj.example#trojan1")
    assert (node.name, node.protocol, node.host, node.port) == ("trojan1", "trojan", "tj.example", 443)
    assert (node.username, node.password, node.encryption) == (None, f"{SECRET}@x:y", None)
    assert node.params == (("type", "tcp"), ("security", "tls"), ("sni", "tj.example"))


def test_trojan_over_websocket_and_its_insecure_flag():
    node = parse_node_link("trojan://pw@tj.example:443?type=ws&host=cdn.example&path=/p&allowInsecure=TRUE")
    assert node.params == (
        ("type", "ws"),
        ("security", "tls"),
        ("host", "cdn.example"),
        ("path", "/p"),
        ("allowInsecure", "1"),
    )


def test_trojan_without_tls_or_password_is_refused():
    assert code_of("trojan://pw@tj.example:443?security=none") == "unsupported-security"
    assert code_of("trojan://@tj.example:443") == "missing-credentials"
    assert code_of("trojan://pw@:443") == "missing-host"


# --- a node's own CA ----------------------------------------------------------------------


def test_the_ca_parameter_is_kept_under_tls_and_is_part_of_the_identity():
    node = parse_node_link("trojan://pw@tj.example:443?sni=tj.example&ca=%2Fetc%2Fhonk%2Fprivate%20ca.pem")
    assert node.params == (
        ("type", "tcp"),
        ("security", "tls"),
        ("sni", "tj.example"),
        ("ca", "/etc/honk/private ca.pem"),
    )
    assert node.id != parse_node_link("trojan://pw@tj.example:443?sni=tj.example").id


def test_the_ca_parameter_is_dropped_without_tls_and_two_different_ones_are_refused():
    assert parse_node_link(f"vless://{UUID}@h.example:80?security=none&ca=/a.pem").params == (
        ("type", "tcp"),
        ("security", "none"),
    )
    assert parse_node_link(f"vless://{UUID}@h.example?ca=/a.pem&ca=%20/a.pem").params[-1] == ("ca", "/a.pem")
    assert code_of(f"vless://{UUID}@h.example?ca=/a.pem&ca=/b.pem") == "conflicting-ca"


def test_untagged_links_without_a_fragment_are_named_by_scheme_and_host():
    assert parse_node_link("trojan://pw@tj.example").name == "trojan-tj.example"
    assert parse_node_link(f"vless://{UUID}@[2001:db8::1]:443").name == "vless-2001:db8::1"
    assert parse_node_link("trojan://pw@tj.example?remarks=r1").name == "r1"


# --- identity ----------------------------------------------------------------------------


def test_equal_dials_spelled_differently_get_the_same_id():
    base = parse_node_link("trojan://pw@tj.example:443?sni=tj.example")
    for same in (
        "trojan://pw@TJ.example?security=tls&sni=TJ.EXAMPLE&allowInsecure=false#renamed",
        "trojan://pw@tj.example:443?host=tj.example",  # outside ws, host stands in for the SNI
        "trojan://pw@tj.example:443?peer=tj.example&type=tcp&headerType=none",
    ):
        assert parse_node_link(same).id == base.id
    ws = parse_node_link("trojan://pw@tj.example:443?type=ws&sni=tj.example")
    assert parse_node_link("trojan://pw@tj.example:443?type=ws&path=/&sni=tj.example").id == ws.id


@pytest.mark.parametrize(
    "other",
    [
        "trojan://pw2@tj.example:443?sni=tj.example",
        "trojan://pw@tj.example:8443?sni=tj.example",
        "trojan://pw@tj.example:443?sni=other.example",
        "trojan://pw@tj.example:443?sni=tj.example&allowInsecure=1",
        "trojan://pw@tj.example:443?sni=tj.example&type=ws",
        "trojan://pw@tj.example:443?sni=tj.example&alpn=h2",
    ],
)
def test_a_different_credential_endpoint_or_dial_shape_changes_the_id(other):
    assert parse_node_link(other).id != parse_node_link("trojan://pw@tj.example:443?sni=tj.example").id


def test_vmess_id_covers_the_uuid_and_the_cipher_and_vless_differs_from_vmess():
    base = parse_node_link(vmess())
    assert parse_node_link(vmess(id=OTHER_UUID)).id != base.id
    assert parse_node_link(vmess(scy="none")).id != base.id
    assert parse_node_link(vmess(ps="renamed")).id == base.id
    assert parse_node_link(f"vless://{UUID}@vm.example:443?security=none").id != base.id


# --- errors never leak the link ----------------------------------------------------------


@pytest.mark.parametrize(
    "link",
    [
        vmess(id=SECRET, ps=SECRET),
        vmess(aid=1, id=UUID, ps=SECRET, add=f"{SECRET}.example"),
        vmess(scy=SECRET),
        f"vless://{SECRET}@{SECRET}.example:443",
        f"vless://{UUID}@h.example:443?flow={SECRET}#{SECRET}",
        f"trojan://{SECRET}@h.example:443?type={SECRET}",
        f"trojan://{SECRET}@h.example:443?allowInsecure={SECRET}",
    ],
)
def test_link_errors_never_contain_the_link_or_its_values(link):
    with pytest.raises(LinkError) as info:
        parse_node_link(link)
    assert SECRET not in info.value.message and SECRET not in str(info.value)


# --- fuzz --------------------------------------------------------------------------------

V2_PIECES = [
    "vmess://",
    "vless://",
    "trojan://",
    UUID,
    "@",
    ":",
    "443",
    "?",
    "&",
    "=",
    "#",
    "%",
    "%2F",
    "[",
    "]",
    "type",
    "ws",
    "tcp",
    "security",
    "tls",
    "none",
    "sni",
    "host",
    "path",
    "alpn",
    "flow",
    "allowInsecure",
    "1",
    "peer",
    "network",
    "/",
    "h.example",
    "::1",
]


@settings(max_examples=400)
@given(st.one_of(st.text(), st.lists(st.sampled_from(V2_PIECES) | st.text(max_size=3)).map("".join)))
def test_any_text_raises_only_link_errors(text):
    try:
        node = parse_node_link(text)
    except LinkError:
        return
    assert node.id.int != 0


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 70000),
    st.text(max_size=8),
    st.sampled_from(["", "0", "443", "ws", "tcp", "tls", "none", "auto", UUID, "h.example"]),
    st.lists(st.integers(), max_size=2),
)
JSON_KEYS = [
    "v",
    "ps",
    "add",
    "port",
    "id",
    "aid",
    "scy",
    "net",
    "type",
    "host",
    "path",
    "tls",
    "sni",
    "alpn",
]


@settings(max_examples=400)
@given(st.dictionaries(st.sampled_from(JSON_KEYS), JSON_VALUES), st.booleans())
def test_any_vmess_json_raises_only_link_errors(fields, urlsafe):
    raw = json.dumps(fields).encode()
    body = (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode()
    try:
        node = parse_node_link("vmess://" + body)
    except LinkError:
        return
    assert node.protocol == "vmess" and node.encryption is not None and node.username is not None


# --- mux (honk's own parameter) --------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_a_vless_link_asks_for_mux_with_a_query_parameter(value):
    node = parse_node_link(f"vless://{UUID}@vl.example:443?security=tls&mux={value}#n")
    assert ("mux", "1") in node.params
    plain = parse_node_link(f"vless://{UUID}@vl.example:443?security=tls#n")
    assert node.id != plain.id  # a carrier is another dial: another node


@pytest.mark.parametrize("mux", ["1", 1, True])
def test_a_vmess_link_asks_for_mux_with_a_json_field(mux):
    assert ("mux", "1") in parse_node_link(vmess(mux=mux)).params


@pytest.mark.parametrize("mux", ["0", False, ""])
def test_mux_off_adds_nothing_to_the_dial_shape(mux):
    assert parse_node_link(vmess(mux=mux)).params == parse_node_link(vmess()).params


def test_an_unreadable_mux_value_is_refused():
    assert code_of(f"vless://{UUID}@vl.example:443?mux=sometimes") == "invalid-mux"


def test_a_mux_node_dials_its_flows_on_a_carrier():
    from honk.config.spec import Spec
    from honk.core.clock import FakeClock
    from honk.outbound.registry import build_outbounds

    node = parse_node_link(vmess(mux="1"), "m")
    leaf = build_outbounds(Spec(nodes=(node,)), FakeClock())[0]["m"]
    assert leaf.mux
