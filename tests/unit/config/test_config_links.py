"""Share links, inbound URLs and stable node identity."""

from __future__ import annotations

import uuid

import pytest

from honk.config.links import LinkError, derive_node_id, parse_inbound_url, parse_node_link
from honk.config.spec import NODE_ID_NAMESPACE, NodeSpec


def test_socks5_link_with_percent_encoded_credentials_and_fragment():
    node = parse_node_link("socks5://us%40er:p%3Ass@Example.COM:1080#Hong%20Kong")
    assert (node.name, node.protocol, node.host, node.port) == ("Hong Kong", "socks5", "example.com", 1080)
    assert (node.username, node.password) == ("us@er", "p:ss")


def test_tag_replaces_fragment_and_untagged_falls_back_to_scheme_host():
    assert parse_node_link("socks5://10.0.0.1:1080#frag", "tagged").name == "tagged"
    assert parse_node_link("socks5h://[2001:db8::1]:1080").name == "socks5h-2001:db8::1"
    assert parse_node_link("socks5h://[2001:db8::1]:1080").protocol == "socks5"


def test_http_links_default_to_port_443():
    assert parse_node_link("https://proxy.example").port == 443
    assert parse_node_link("http://proxy.example:8080").port == 8080


@pytest.mark.parametrize(
    ("link", "code"),
    [
        ("socks5://10.0.0.1", "missing-port"),
        ("socks5://10.0.0.1:0", "invalid-port"),
        ("socks5://10.0.0.1:65536", "invalid-port"),
        ("socks5://:1080", "missing-host"),
        ("socks5://[::1:1080", "invalid-host"),
        ("socks5://::1:1080", "invalid-host"),
        ("anytls://secret@h:443", "unsupported-scheme"),
        ("hysteria2://secret@h:443", "unsupported-scheme"),
        ("gopher://h:70", "unknown-scheme"),
        ("10.0.0.1:1080", "unknown-scheme"),
    ],
)
def test_bad_links_raise_a_coded_error_without_the_link(link, code):
    with pytest.raises(LinkError) as info:
        parse_node_link(link)
    assert info.value.code == code
    assert "secret" not in info.value.message and "10.0.0.1" not in info.value.message


def test_node_id_is_stable_across_rename_and_changes_with_endpoint_or_credentials():
    a = parse_node_link("socks5://u:p@10.0.0.1:1080#one")
    assert a.id == parse_node_link("socks5://u:p@10.0.0.1:1080", "two").id
    assert a.id != parse_node_link("socks5://u:q@10.0.0.1:1080").id
    assert a.id != parse_node_link("socks5://u:p@10.0.0.1:1081").id
    assert a.id != parse_node_link("socks5://10.0.0.1:1080").id
    assert a.id.version == 5


def test_node_id_escapes_field_separators():
    plain = NodeSpec("n", "socks5", "a|b", 1)
    shifted = NodeSpec("n", "socks5", "a", 1, params=(("b", ""),))
    assert derive_node_id(plain) != derive_node_id(shifted)
    expected = uuid.uuid5(NODE_ID_NAMESPACE, "socks5|a\\|b|1||")
    assert derive_node_id(plain) == expected


def test_display_params_do_not_change_the_id():
    assert parse_node_link("https://h.example?remark=x").id == parse_node_link("https://h.example").id
    assert parse_node_link("https://h.example?sni=a").id != parse_node_link("https://h.example").id


def test_inbound_url_with_user_and_ipv6_listen():
    inbound = parse_inbound_url("mixed://alice:pw%21@[::1]:7890", "lan")
    assert (inbound.name, inbound.kind, inbound.host, inbound.port) == ("lan", "mixed", "::1", 7890)
    assert inbound.users[0].username == "alice" and inbound.users[0].password == "pw!"
    assert parse_inbound_url("mixed://127.0.0.1:1080").name == "mixed-1080"
    assert parse_inbound_url("mixed://127.0.0.1:0").port == 0  # ephemeral: the OS picks


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("socks5://127.0.0.1:1", "unsupported-inbound"),
        ("mixed://127.0.0.1", "missing-port"),
        ("mixed://127.0.0.1:70000", "invalid-port"),
    ],
)
def test_bad_inbound_urls(url, code):
    with pytest.raises(LinkError) as info:
        parse_inbound_url(url)
    assert info.value.code == code
