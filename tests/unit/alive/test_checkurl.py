"""The health-check URL: request shape (GH-F-04), default ports, and the shapes refused before any request."""

from __future__ import annotations

import pytest

from honk.alive.checkurl import DEFAULT_DELAY_URL, CheckUrl, parse_check_url
from honk.config.spec import DEFAULT_TCP_CHECK_URL


def test_credentials_default_port_and_fragment_are_dropped_and_dot_segments_kept() -> None:
    url = parse_check_url("http://user:pw@Host:80/a/../b?x#frag")
    assert url == CheckUrl(
        scheme="http", host="Host", port=80, authority="Host", target="/a/../b?x", tls=False
    )


def test_a_slashless_query_is_requested_as_slash_query_and_a_non_default_port_is_kept() -> None:
    url = parse_check_url("https://h:8443?q")
    assert (url.authority, url.target, url.port, url.tls) == ("h:8443", "/?q", 8443, True)


@pytest.mark.parametrize(
    ("text", "scheme", "port", "authority"),
    [
        ("http://example.com", "http", 80, "example.com"),
        ("https://example.com", "https", 443, "example.com"),
        ("HTTPS://example.com:443/", "https", 443, "example.com"),
        ("https://example.com:80/", "https", 80, "example.com:80"),
        ("http://example.com:443/", "http", 443, "example.com:443"),
        ("http://example.com:/", "http", 80, "example.com"),
    ],
)
def test_explicit_schemes_default_to_80_and_443(text: str, scheme: str, port: int, authority: str) -> None:
    url = parse_check_url(text)
    assert (url.scheme, url.port, url.authority) == (scheme, port, authority)


@pytest.mark.parametrize(
    ("text", "port", "authority", "target"),
    [
        ("example.com", 80, "example.com", "/"),
        ("example.com/generate_204", 80, "example.com", "/generate_204"),
        ("example.com:8080/x?y", 8080, "example.com:8080", "/x?y"),
        ("192.0.2.7:81", 81, "192.0.2.7:81", "/"),
        ("[2001:db8::1]:8080/p", 8080, "[2001:db8::1]:8080", "/p"),
        ("u:p@example.com?q", 80, "example.com", "/?q"),
    ],
)
def test_a_schemeless_target_is_http_on_port_80(text: str, port: int, authority: str, target: str) -> None:
    url = parse_check_url(text)
    assert (url.scheme, url.tls, url.port, url.authority, url.target) == (
        "http",
        False,
        port,
        authority,
        target,
    )


def test_a_schemeless_target_takes_the_given_default_scheme() -> None:
    url = parse_check_url("example.com/x", default_scheme="https")
    assert (url.scheme, url.port, url.tls) == ("https", 443, True)


def test_ipv6_stays_bracketed_in_the_authority_and_is_unbracketed_for_dialling() -> None:
    url = parse_check_url("https://[2001:db8::1]/generate_204")
    assert (url.host, url.authority, url.port) == ("2001:db8::1", "[2001:db8::1]", 443)
    url = parse_check_url("http://u:p@[::1]:8080/#x")
    assert (url.host, url.authority, url.target) == ("::1", "[::1]:8080", "/")


def test_percent_encoding_and_raw_path_characters_are_sent_as_written() -> None:
    url = parse_check_url("http://h/%2e%2E/./a%2Fb/..;x?q=%20&r=/../#f?g")
    assert url.target == "/%2e%2E/./a%2Fb/..;x?q=%20&r=/../"


def test_an_at_sign_after_the_authority_is_part_of_the_path() -> None:
    url = parse_check_url("http://h/a@b")
    assert (url.authority, url.target) == ("h", "/a@b")


def test_an_empty_query_and_a_bare_fragment_keep_their_shapes() -> None:
    assert parse_check_url("http://h?").target == "/?"
    assert parse_check_url("http://h#").target == "/"


def test_non_ascii_is_percent_encoded_as_utf8_and_names_become_idna() -> None:
    url = parse_check_url("http://bücher.example/é?ü")
    assert (url.host, url.authority, url.target) == (
        "xn--bcher-kva.example",
        "xn--bcher-kva.example",
        "/%C3%A9?%C3%BC",
    )


@pytest.mark.parametrize(
    "text",
    [
        "http:///example.com/",  # surplus authority slashes
        "https:////example.com",
        "///example.com",
        "//example.com/",
        "http:\\\\example.com\\",  # backslashes
        "http://example.com\\path",
        "http://exa mple.com/",  # embedded whitespace and control characters
        "http://example.com/a b",
        "http://example.com/a\tb",
        "http://example.com/\r\nX: y",
        "http://example.com/\x00",
        "http://example.com/\x7f",
        " http://example.com/",
        "http://example.com/ ",
    ],
)
def test_slashes_backslashes_and_whitespace_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_check_url(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "http://",
        "http://user@/x",
        "http://:8080/",
        "ftp://example.com/",
        "ws://example.com/",
        "http:example.com",
        "http:/example.com",
        "http://example.com:0/",
        "http://example.com:65536/",
        "http://example.com:8o/",
        "http://example.com:80:81/",
        "http://2001:db8::1/",  # unbracketed IPv6
        "http://[2001:db8::1/",
        "http://[2001:db8::1]x/",
        "http://[example.com]/",
        "http://[fe80::1%25eth0]/",
        "http://exa%6dple.com/",
        "http://exa<mple.com/",
        "mailto:someone",
    ],
)
def test_malformed_urls_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_check_url(text)


def test_the_rejection_message_does_not_repeat_the_url() -> None:
    secret = "tok3n-s3cret"
    for text in (
        f"http://{secret}@h:99999/",
        f"http:///{secret}",
        f"http://h/{secret} x",
        f"ftp://{secret}/",
    ):
        with pytest.raises(ValueError) as info:
            parse_check_url(text)
        assert secret not in str(info.value)


def test_an_unknown_default_scheme_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_check_url("example.com", default_scheme="ftp")


def test_the_default_delay_url_is_the_generate_204_endpoint_and_parses() -> None:
    assert DEFAULT_DELAY_URL == "https://www.gstatic.com/generate_204" == DEFAULT_TCP_CHECK_URL
    url = parse_check_url(DEFAULT_DELAY_URL)
    assert (url.host, url.port, url.authority, url.target, url.tls) == (
        "www.gstatic.com",
        443,
        "www.gstatic.com",
        "/generate_204",
        True,
    )
