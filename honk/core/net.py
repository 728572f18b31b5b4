"""Networks, addresses and flow metadata shared by inbounds, routing and outbounds."""

from __future__ import annotations

import enum
import functools
import ipaddress
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Network(enum.Enum):
    TCP = "tcp"
    UDP = "udp"

    # members are singletons compared by identity: hash them by identity too, in C, instead of
    # Enum's Python-level hash of the name (a Network is part of many hot dictionary keys)
    __hash__ = object.__hash__


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address as written (no brackets, no port)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _parse_host(host: str) -> tuple[str, IPAddress | None]:
    """Normalise a host once: an IP literal to its canonical text and value, a name
    to lower case without its trailing dot. Cached: flows repeat a few hosts, and
    ``ipaddress`` parsing is slow enough to show per connection."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host.rstrip(".").lower(), None
    return str(ip), ip


@dataclass(frozen=True, slots=True)
class Address:
    """A host (domain name or IP literal, never bracketed) and a port.

    IP literals are normalised at construction (``::ffff:1.2.3.4`` stays IPv6,
    ``0x7f.1`` is not an IP and stays a name); domain names are lower-cased and
    lose a trailing dot.
    """

    host: str
    port: int
    _ip: IPAddress | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} out of range")
        host, ip = _parse_host(self.host)
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "_ip", ip)

    @property
    def ip(self) -> IPAddress | None:
        """The IP if ``host`` is a literal, else ``None``."""
        return self._ip

    @property
    def is_domain(self) -> bool:
        return self._ip is None

    def __str__(self) -> str:
        ip = self._ip
        if ip is not None and ip.version == 6:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


# Not frozen: one is built per flow, and a frozen dataclass's __init__ pays an object.__setattr__
# call per field (the fast path's routing measured 3.0 -> 1.6 us per flow without). Never mutated.
@dataclass(slots=True)
class FlowMeta:
    """What routing knows about one flow when it is accepted.

    ``target`` is what the client asked for (a domain when the client gave a
    name); ``resolved`` is the destination IP once known (literal targets are
    their own resolution).
    """

    network: Network
    source: Address
    target: Address
    inbound: str
    user: str | None = None
    resolved: IPAddress | None = None
    # the inbound session (client connection) the flow belongs to: closing the session
    # (its user was revoked, its inbound removed) closes its flows; identity only
    session: object | None = field(default=None, compare=False, repr=False)
    process: str | None = None  # the local process's name, for the host's own flows (pname rules)

    @property
    def destination_ip(self) -> IPAddress | None:
        return self.resolved if self.resolved is not None else self.target.ip


def is_loopback_listen(host: str) -> bool:
    """Whether a listen address reaches this host only: a loopback IP or ``localhost``.
    The wildcard (``0.0.0.0``, ``::``, empty), LAN addresses and other names do not."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_host_port(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (a listen address) as (unbracketed host, port);
    ValueError names what is wrong."""
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError("expected [address]:port")
        ipaddress.IPv6Address(host)
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError("expected host:port")
        if ":" in host:
            raise ValueError("an IPv6 address must be bracketed")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError("the port must be a number 0-65535")
    return host, int(port_text)
