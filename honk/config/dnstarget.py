"""The ``udp_check_dns`` targets: parsing each entry and picking the one the UDP probe asks.

Pure text handling, shared by the configuration's validation (which reports a
located error) and the probe (which uses the picked target).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from honk.core.net import Address

__all__ = ["DEFAULT_DNS_TARGET", "DNS_PORT", "dns_check_target", "parse_dns_target"]

DNS_PORT = 53  # "Bare IPv4/IPv6, `[IPv6]`, and hostnames default to port 53"
DEFAULT_DNS_TARGET = Address("8.8.8.8", DNS_PORT)  # "otherwise `8.8.8.8:53`"
MIN_PORT, MAX_PORT = 1, 65535  # "explicit ports must be numeric and in 1..65535"
MAX_HOSTNAME = 253  # RFC 1035 section 2.3.4: a name's text form without the root dot
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")  # letters, digits, hyphen (and the common underscore)


# --- the target ------------------------------------------------------------------------------


def dns_check_target(entries: Sequence[str]) -> Address:
    """The DNS server the UDP probe asks, from the ``udp_check_dns`` entries.

    Entries are trimmed (a single comma-separated string is split first) and
    empty ones ignored. The first IP literal anywhere in the list wins;
    otherwise the first host name; otherwise ``8.8.8.8:53``. Every entry must
    parse: a malformed one raises :class:`ValueError` even when another would win.
    """
    items = [entries] if isinstance(entries, str) else list(entries)
    parsed = [parse_dns_target(part.strip()) for item in items for part in item.split(",") if part.strip()]
    for address in parsed:
        if address.ip is not None:
            return address
    return parsed[0] if parsed else DEFAULT_DNS_TARGET


def parse_dns_target(entry: str) -> Address:
    """One ``udp_check_dns`` entry: ``host``, ``host:port``, IPv4, bare IPv6, ``[IPv6]`` or
    ``[IPv6]:port``; port 53 by default. Raises ValueError (the message does not repeat the entry)."""
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError("unclosed '['")
        host, rest = entry[1:close], entry[close + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError("text after ']' must be ':port'")
        if not _is_ip(host, version=6):
            raise ValueError("brackets must hold an IPv6 address")
        return Address(host, _port(rest[1:]) if rest else DNS_PORT)
    if entry.count(":") > 1:  # a bare IPv6 address: its colons are not a port separator
        if not _is_ip(entry, version=6):
            raise ValueError("not an IPv6 address (use [IPv6]:port for a port)")
        return Address(entry, DNS_PORT)
    host, sep, port_text = entry.partition(":")
    port = _port(port_text) if sep else DNS_PORT
    if _is_ip(host, version=4):
        return Address(host, port)
    if not _is_hostname(host):
        raise ValueError("not an IP address or a host name")
    return Address(host, port)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError("the port must be numeric")
    port = int(text)
    if not MIN_PORT <= port <= MAX_PORT:
        raise ValueError(f"port {port} is not in {MIN_PORT}..{MAX_PORT}")
    return port


def _is_ip(text: str, *, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False


def _is_hostname(host: str) -> bool:
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > MAX_HOSTNAME:
        return False
    labels = name.split(".")
    # an all-numeric last label would be a mistyped IPv4 address ("1.2.3.256"), not a name
    return all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()
