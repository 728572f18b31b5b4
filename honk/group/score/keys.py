"""Score's cell keys and target normalization (GH-K-02, GH-K-03).

An exact cell is keyed ``(group, TCP|UDP, target family, normalized target, NodeId)``; an
aggregate cell ``(group, TCP|UDP, target family or None, NodeId)``. The aggregate with family
``None`` is the global layer: every outcome of the node in the group lands there, including
targetless warm-up samples and targets whose family is not known.

Decisions the seed leaves open:

* **IPv6 text** is the compressed form ``ipaddress`` prints, so every spelling of one address
  is one key.
* **IPv6 zone ids are stripped.** A zone names an interface of *this* host; the proxy
  protocols that carry the target (SOCKS, VMess, VLESS, Trojan, ...) encode 16 address bytes
  and no zone, so two targets differing only in their zone are the same target to the proxy
  and must share evidence. Refusing them instead would drop real flows' evidence.
* **Target family** is the family of the destination address actually used when the caller
  knows it (a resolved domain), else that of the IP literal; a domain with no known address
  has no family and feeds only the global aggregate, never an exact or family cell.
* **A name still ending in a dot** after the one trailing dot is removed (``a..``) has an
  empty label and is refused: removing "exactly one" dot would otherwise not be idempotent.
  A name that becomes an IP literal once its dot is gone (``1.2.3.4.``) is that IP.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field

from honk._fast.valuetype import install as _value_type
from honk.alive.outcome import Family
from honk.core.net import IPAddress, Network

NodeId = uuid.UUID | Hashable  # a node's UUID; tests may use any hashable identity

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Characters that cannot be in a host name and would make the "host:port" text ambiguous.
_FORBIDDEN_NAME_CHARS = frozenset(" :/[]%\\@")
MAX_PORT = 65535


def _parse_ip(text: str) -> IPAddress | None:
    """An IP literal without its IPv6 zone, or None when ``text`` is not one."""
    if ":" in text:
        text = text.partition("%")[0]  # the zone (see the module docstring)
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@_value_type  # hashed and compared in C by the compiled build
@dataclass(frozen=True, slots=True)
class ScoreTarget:
    """A normalized business target: ``host`` is a lower-case name or the canonical IP text.

    Build it with :meth:`of` or :meth:`parse`; the constructor trusts its arguments.
    The repr hides the target: Score's target data is never logged (GH-K-09).
    """

    host: str
    port: int
    ip: IPAddress | None = None
    # hashed once: a target is part of the keys every rank and report looks up (an IP address
    # alone hashes in Python); not a field of equality or of the repr
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.host, self.port, self.ip)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, host: str, port: int) -> ScoreTarget:
        """Normalize ``host`` (a name, an IP literal, or a bracketed IPv6 literal) and ``port``."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
            raise ValueError("the port must be an integer 0-65535")
        if host.startswith("["):
            if not host.endswith("]"):
                raise ValueError("unbalanced bracket")
            ip = _parse_ip(host[1:-1])
            if ip is None or ip.version != 6:
                raise ValueError("only an IPv6 literal may be bracketed")
            return cls(str(ip), port, ip)
        ip = _parse_ip(host)
        if ip is not None:
            return cls(str(ip), port, ip)
        name = host[:-1] if host.endswith(".") else host  # exactly one trailing dot
        if not name or name.endswith("."):
            raise ValueError("empty host name or label")
        if any(c in _FORBIDDEN_NAME_CHARS or c <= " " or c == "\x7f" for c in name):
            raise ValueError("invalid character in host name")
        name = name.translate(_ASCII_LOWER)
        ip = _parse_ip(name)
        if ip is not None:
            return cls(str(ip), port, ip)
        return cls(name, port, None)

    @classmethod
    def parse(cls, text: str) -> ScoreTarget:
        """``host:port`` or ``[v6]:port``."""
        if text.startswith("["):
            host, sep, port_text = text.rpartition(":")
            if not sep or not host.endswith("]"):
                raise ValueError("expected [address]:port")
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep or ":" in host:
                raise ValueError("expected host:port (an IPv6 address must be bracketed)")
        if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
            raise ValueError("the port must be a number 0-65535")
        return cls.of(host, int(port_text))

    @property
    def text(self) -> str:
        """The normalized ``host:port`` (``[v6]:port``); :meth:`parse` reads it back unchanged."""
        if self.ip is not None and self.ip.version == 6:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    def family(self, destination: IPAddress | None = None) -> Family | None:
        """The target family: of ``destination`` (the address actually used) when known,
        else of the IP literal, else None."""
        return target_family(self, destination)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return "ScoreTarget(<hidden>)"


def target_family(target: ScoreTarget | None, destination: IPAddress | None = None) -> Family | None:
    """The Score bucket family of a flow (see the module docstring); None for no family."""
    ip = destination if destination is not None else (target.ip if target is not None else None)
    if ip is None:
        return None
    return _V6 if ip.version == 6 else _V4


_V4, _V6 = Family.V4, Family.V6  # bound once: an Enum.MEMBER read costs a metaclass hook (Python 3.11)


class _CellKey:
    """A cell key: compared by its fields, hashed once (a key is looked up many times per flow
    and per rank, and hashing its fields means hashing a UUID and enums in Python each time).
    Treat it as immutable: its hash is fixed when it is built."""

    __slots__ = ("_hash",)

    def __hash__(self) -> int:
        return self._hash

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __repr__(self) -> str:  # the target stays hidden (GH-K-09)
        return f"{type(self).__name__}({self.group!r}, {self.network}, {self.family}, <node>)"  # type: ignore[attr-defined]


@_value_type  # hashed and compared in C by the compiled build
class ExactKey(_CellKey):
    """One node's evidence for one target in one group (GH-K-02)."""

    __slots__ = ("family", "group", "network", "node_id", "target")

    def __init__(
        self, group: str, network: Network, family: Family, target: ScoreTarget, node_id: NodeId
    ) -> None:
        self.group = group
        self.network = network
        self.family = family
        self.target = target
        self.node_id = node_id
        self._hash = hash((group, network, family, target, node_id))

    __hash__ = _CellKey.__hash__  # defining __eq__ would otherwise drop it

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if other.__class__ is not ExactKey:
            return NotImplemented
        return (
            self._hash == other._hash
            and self.node_id == other.node_id  # type: ignore[attr-defined]
            and self.target == other.target
            and self.group == other.group  # type: ignore[attr-defined]
            and self.family == other.family
            and self.network == other.network
        )  # type: ignore[attr-defined]

    @property
    def row(self) -> tuple:
        """The key without its node: every member's cell for one target."""
        return (self.group, self.network, self.family, self.target)


@_value_type
class AggregateKey(_CellKey):
    """One node's evidence in one group over all targets of a family, or of all (family None)."""

    __slots__ = ("family", "group", "network", "node_id")

    def __init__(self, group: str, network: Network, family: Family | None, node_id: NodeId) -> None:
        self.group = group
        self.network = network
        self.family = family
        self.node_id = node_id
        self._hash = hash((group, network, family, node_id))

    __hash__ = _CellKey.__hash__

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if other.__class__ is not AggregateKey:
            return NotImplemented
        return (
            self._hash == other._hash
            and self.node_id == other.node_id  # type: ignore[attr-defined]
            and self.group == other.group
            and self.family == other.family  # type: ignore[attr-defined]
            and self.network == other.network
        )  # type: ignore[attr-defined]

    @property
    def row(self) -> tuple:
        """The key without its node: every member's cell of one layer."""
        return (self.group, self.network, self.family)


def layer_rows(
    group: str, network: Network, family: Family | None, target: ScoreTarget | None
) -> tuple[tuple | None, tuple | None, tuple | None]:
    """The row (``AggregateKey.row``, ``ExactKey.row``) of each layer one read uses, global,
    family and exact; None for a layer it does not have (no family, or no target)."""
    if family is None:
        return (group, network, None), None, None
    return (
        (group, network, None),
        (group, network, family),
        ((group, network, family, target) if target is not None else None),
    )


__all__ = ["AggregateKey", "ExactKey", "NodeId", "ScoreTarget", "layer_rows", "target_family"]
