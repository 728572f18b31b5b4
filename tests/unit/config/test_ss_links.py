"""ss:// share links: SIP002 (base64 or percent-encoded userinfo) and the whole-link base64 form."""

from __future__ import annotations

import base64

import pytest
from config_helpers import SECRET, run

from honk.config.links import LinkError, parse_node_link


def b64(text: str, *, urlsafe: bool = True, pad: bool = False) -> str:
    raw = text.encode()
    out = (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode()
    return out if pad else out.rstrip("=")


def test_sip002_link_with_base64url_userinfo():
    node = parse_node_link(f"ss://{b64('aes-256-gcm:pass/+?word')}@Proxy.Example:8388/#Tokyo%20%231")
    assert (node.name, node.protocol, node.host, node.port) == ("Tokyo #1", "ss", "proxy.example", 8388)
    assert (node.encryption, node.password, node.username) == ("aes-256-gcm", "pass/+?word", None)


def test_sip002_userinfo_may_use_the_standard_alphabet_and_padding_even_percent_encoded():
    creds = "chacha20-ietf-poly1305:k>?~"  # encodes to '+' and '/' in the standard alphabet
    std = b64(creds, urlsafe=False, pad=True)
    assert "+" in std or "/" in std
    for userinfo in (std, std.replace("=", "%3D"), b64(creds)):
        node = parse_node_link(f"ss://{userinfo}@10.0.0.1:8388")
        assert (node.encryption, node.password) == ("chacha20-ietf-poly1305", "k>?~")


def test_sip002_link_with_percent_encoded_plain_userinfo():
    node = parse_node_link("ss://aes-128-gcm:p%40ss%3Aw%2Fd@[2001:db8::1]:443?plugin=#n")
    assert (node.host, node.port, node.encryption, node.password) == (
        "2001:db8::1",
        443,
        "aes-128-gcm",
        "p@ss:w/d",
    )


def test_whole_link_base64_form_splits_at_the_last_at_sign():
    link = "ss://" + b64("aes-128-gcm:p@ss:w@rd@192.0.2.1:8388", urlsafe=False, pad=True) + "#legacy"
    node = parse_node_link(link)
    assert (node.name, node.host, node.port) == ("legacy", "192.0.2.1", 8388)
    assert (node.encryption, node.password) == ("aes-128-gcm", "p@ss:w@rd")


def test_whole_link_base64_credentials_may_be_base64_themselves():
    inner = b64("aes-256-gcm:secret", urlsafe=False, pad=True)
    node = parse_node_link("ss://" + b64(f"{inner}@h.example:8388"))
    assert (node.encryption, node.password, node.host) == ("aes-256-gcm", "secret", "h.example")


def test_decoded_credentials_are_taken_literally():
    assert parse_node_link(f"ss://{b64('aes-128-gcm:a%40b+c')}@h.example:1").password == "a%40b+c"
    assert parse_node_link("ss://" + b64("aes-128-gcm:a%40b@h.example:1")).password == "a%40b"


def test_method_is_lower_cased_and_the_three_aead_ciphers_are_accepted():
    for method in ("AES-128-GCM", "aes-256-gcm", "ChaCha20-IETF-Poly1305"):
        assert parse_node_link(f"ss://{b64(method + ':pw')}@h.example:1").encryption == method.lower()


def test_empty_plugin_is_no_plugin_and_other_parameters_are_kept():
    node = parse_node_link(f"ss://{b64('aes-128-gcm:pw')}@h.example:8388/?plugin=&udp=1#x")
    assert node.params == (("udp", "1"),)
    plain = parse_node_link(f"ss://{b64('aes-128-gcm:pw')}@h.example:8388/?udp=1#y")
    assert node.id == plain.id


def test_tag_replaces_the_fragment_and_an_untagged_link_is_named_after_its_host():
    link = f"ss://{b64('aes-128-gcm:pw')}@h.example:8388#frag"
    assert parse_node_link(link, "tagged").name == "tagged"
    assert parse_node_link(f"ss://{b64('aes-128-gcm:pw')}@h.example:8388").name == "ss-h.example"


@pytest.mark.parametrize(
    "method",
    ["rc4-md5", "aes-256-cfb", "chacha20-ietf", "xchacha20-ietf-poly1305", "2022-blake3-aes-128-gcm", "none"],
)
def test_ciphers_other_than_the_aead_three_are_unsupported(method):
    for link in (
        f"ss://{b64(method + ':' + SECRET)}@h.example:8388",
        f"ss://{method}:{SECRET}@h.example:8388",
        "ss://" + b64(f"{method}:{SECRET}@h.example:8388"),
    ):
        with pytest.raises(LinkError) as info:
            parse_node_link(link)
        assert info.value.code == "unsupported-cipher"
        # the same words for every link: nothing from the link is in them
        assert info.value.message == _message_for("ss://bogus:x@other.example:1")


def _message_for(link: str) -> str:
    with pytest.raises(LinkError) as info:
        parse_node_link(link)
    return info.value.message


def test_a_link_that_needs_a_plugin_is_refused():
    link = f"ss://{b64('aes-128-gcm:' + SECRET)}@h.example:8388/?plugin=obfs-local%3Bobfs%3Dhttp#n"
    with pytest.raises(LinkError) as info:
        parse_node_link(link)
    assert info.value.code == "unsupported-plugin"
    assert SECRET not in info.value.message and "obfs" not in info.value.message


@pytest.mark.parametrize(
    ("link", "code"),
    [
        (f"ss://{b64('aes-128-gcm:' + SECRET)}@h.example", "missing-port"),
        (f"ss://{b64('aes-128-gcm:' + SECRET)}@:8388", "missing-host"),
        (f"ss://{b64('aes-128-gcm:' + SECRET)}@h.example:0", "invalid-port"),
        (f"ss://{b64('aes-128-gcm:' + SECRET)}@h.example:65536", "invalid-port"),
        (f"ss://{b64('aes-128-gcm:' + SECRET)}@::1:8388", "invalid-host"),
        (f"ss://{b64('aes-128-gcm' + SECRET)}@h.example:8388", "invalid-credentials"),
        (f"ss://!!{SECRET}!!@h.example:8388", "invalid-credentials"),
        ("ss://" + b64(f"aes-128-gcm:{SECRET}"), "invalid-link"),
        (f"ss://not*base64{SECRET}", "invalid-link"),
        ("ss://" + b64("aes-128-gcm:@h.example:8388"), "missing-password"),
        ("ss://aes-128-gcm:@h.example:8388", "missing-password"),
        ("ss://" + b64(f"aes-128-gcm:{SECRET}@h.example:x8388"), "invalid-port"),
    ],
)
def test_bad_ss_links_raise_a_coded_error_without_any_value(link, code):
    with pytest.raises(LinkError) as info:
        parse_node_link(link)
    assert info.value.code == code
    assert SECRET not in info.value.message and "h.example" not in info.value.message


def test_every_form_of_the_same_node_has_the_same_id():
    forms = [
        f"ss://{b64('aes-256-gcm:p@ss')}@h.example:8388#a",
        "ss://aes-256-gcm:p%40ss@h.example:8388/#b",
        "ss://" + b64("AES-256-GCM:p@ss@h.example:8388", urlsafe=False, pad=True) + "#c",
    ]
    ids = {parse_node_link(link).id for link in forms}
    assert len(ids) == 1


def test_node_id_changes_with_password_cipher_or_endpoint_but_not_name():
    base = parse_node_link("ss://aes-256-gcm:pw@h.example:8388#one")
    assert base.id == parse_node_link("ss://aes-256-gcm:pw@h.example:8388", "two").id
    assert base.id != parse_node_link("ss://aes-256-gcm:pw2@h.example:8388").id
    assert base.id != parse_node_link("ss://aes-128-gcm:pw@h.example:8388").id
    assert base.id != parse_node_link("ss://aes-256-gcm:pw@h.example:8389").id


def test_repr_of_an_ss_node_hides_the_password():
    node = parse_node_link(f"ss://aes-128-gcm:{SECRET}@h.example:8388")
    assert SECRET not in repr(node)


def test_a_dae_file_declares_an_ss_node_and_refusals_are_located_without_secrets():
    good = run(f"node {{\n    hk: 'ss://{b64('aes-128-gcm:' + SECRET)}@127.0.0.1:8388'\n}}\n")
    assert good.error is None
    (node,) = good.spec.nodes
    assert (node.name, node.protocol, node.encryption) == ("hk", "ss", "aes-128-gcm")
    bad = run(f"node {{\n    hk: 'ss://{b64('rc4-md5:' + SECRET)}@127.0.0.1:8388'\n}}\n")
    (diag,) = bad.find("unsupported-cipher")
    assert diag.key_path == "node.hk"
    bad.assert_no_secret()
