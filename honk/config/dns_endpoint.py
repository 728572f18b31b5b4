"""What an upstream's URL says about how to reach it, carried in one string.

The configuration's upstream spec keeps ``protocol``, ``host`` and ``port``
(:class:`~honk.config.spec.DnsUpstreamSpec`); an encrypted upstream also has a
request path (DoH) and a TLS server name (``?tls_server_name=``). Both travel
in the protocol string, so every place that compares, caches by or shows an
upstream's definition sees them without the spec growing fields:

    "udp" | "tcp"                                 plain DNS (RFC 1035)
    "tls[;sni=NAME]"                              DoT, RFC 7858
    "https[;path=/P][;sni=NAME]"                  DoH over HTTP/2, RFC 8484
    "h3[;path=/P][;sni=NAME]"                     DoH over HTTP/3, RFC 9114
    "quic[;sni=NAME]"                             DoQ, RFC 9250

A default (path ``/dns-query``, no server name: the host itself) is left out,
so the common forms stay the bare scheme. No dnspython here: the configuration
loader imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_PORTS",
    "DOH_PATH",
    "DOH_PORT",
    "DOQ_PORT",
    "DOT_PORT",
    "ENCRYPTED",
    "H3",
    "HTTPS",
    "PLAIN_PORT",
    "QUIC",
    "TCP",
    "TLS",
    "UDP",
    "Transport",
    "decode",
    "encode",
]

UDP, TCP, TLS, HTTPS, H3, QUIC = "udp", "tcp", "tls", "https", "h3", "quic"
ENCRYPTED = frozenset({TLS, HTTPS, H3, QUIC})
HTTP_KINDS = frozenset({HTTPS, H3})  # the kinds with a request path

PLAIN_PORT = 53  # RFC 1035 §4.2
DOT_PORT = 853  # RFC 7858 §3.1
DOH_PORT = 443  # RFC 8484 §5: an https URI, so HTTPS's port
DOQ_PORT = 853  # RFC 9250 §4.1.1
DOH_PATH = "/dns-query"  # RFC 8484 §4.1.1's example path, and every public resolver's
DEFAULT_PORTS = {
    UDP: PLAIN_PORT,
    TCP: PLAIN_PORT,
    TLS: DOT_PORT,
    HTTPS: DOH_PORT,
    H3: DOH_PORT,
    QUIC: DOQ_PORT,
}

_SEPARATOR = ";"
_PATH, _SNI = "path", "sni"


@dataclass(frozen=True, slots=True)
class Transport:
    """How to reach one upstream: its kind, request path (DoH, DoH3) and TLS server name
    (None: the upstream's host, an IP literal verified as an IP address)."""

    kind: str
    path: str = DOH_PATH
    server_name: str | None = None

    @property
    def encrypted(self) -> bool:
        return self.kind in ENCRYPTED


def encode(kind: str, path: str | None = None, server_name: str | None = None) -> str:
    """The protocol string for ``kind`` with a path and server name (defaults left out)."""
    parts = [kind]
    if kind in HTTP_KINDS and path and path != DOH_PATH:
        parts.append(f"{_PATH}={path}")
    if kind in ENCRYPTED and server_name:
        parts.append(f"{_SNI}={server_name}")
    return _SEPARATOR.join(parts)


def decode(protocol: str) -> Transport:
    """The :class:`Transport` a protocol string from :func:`encode` stands for; ValueError
    for anything else (a hand-built spec with a typo)."""
    kind, *options = protocol.split(_SEPARATOR)
    if kind not in DEFAULT_PORTS:
        raise ValueError(f"unknown upstream protocol {kind!r}")
    path, server_name = DOH_PATH, None
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not value:
            raise ValueError(f"malformed upstream protocol option {option!r}")
        if key == _PATH and kind in HTTP_KINDS:
            path = value
        elif key == _SNI and kind in ENCRYPTED:
            server_name = value
        else:
            raise ValueError(f"the option {key!r} does not apply to {kind}")
    return Transport(kind, path, server_name)
