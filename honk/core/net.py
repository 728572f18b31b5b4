"""Networks, addresses and flow metadata shared by inbounds, routing and outbounds."""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Network(enum.Enum):
    TCP = "tcp"
    UDP = "udp"


@dataclass(frozen=True, slots=True)
class Address:
    """A host (domain name or IP literal, never bracketed) and a port.

    IP literals are normalised at construction (``::ffff:1.2.3.4`` stays IPv6,
    ``0x7f.1`` is not an IP and stays a name); domain names are lower-cased and
    lose a trailing dot.
    """

    host: str
    port: int

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} out of range")
        host = self.host
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            host = host.rstrip(".").lower()
        object.__setattr__(self, "host", host)

    @property
    def ip(self) -> IPAddress | None:
        """The IP if ``host`` is a literal, else ``None``."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def is_domain(self) -> bool:
        return self.ip is None

    def __str__(self) -> str:
        ip = self.ip
        if ip is not None and ip.version == 6:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
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

    @property
    def destination_ip(self) -> IPAddress | None:
        return self.resolved if self.resolved is not None else self.target.ip
