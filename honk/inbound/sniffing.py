"""dial_mode: what a transparent flow is routed by and what its proxy dials, from the name
sniffed in its first bytes (or learned from honk's DNS answers).

A transparent inbound knows only the original destination IP. Routing by name needs a name:

| mode       | sniff | name verified                         | routing sees          | proxies dial |
| ---------- | ----- | ------------------------------------- | --------------------- | ------------ |
| ``ip``       | no    | -                                     | the IP                | the IP       |
| ``domain``   | yes   | learned for the IP, or resolves to it | the name (if verified) | the name     |
| ``domain+``  | yes   | no                                    | the IP                | the name     |
| ``domain++`` | yes   | no                                    | the name              | the name     |

When sniffing finds nothing but honk's DNS answered some name with this IP (``learned_names``),
``domain`` and ``domain++`` route by that name as verified: this is how an IP flow meets
domain rules. Routing by a name keeps the original IP as ``FlowMeta.resolved``, so IP rules
still match when no domain rule does. Direct, block and ``(must)`` decisions always dial the
original IP (:meth:`FlowPlan.dial_target`).

Everything here is pure except the reality check (a resolver call bounded by the clock) and
:func:`sniff_first_bytes` (reads a stream until a verdict or the sniffing timeout).
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from honk.core.clock import Clock, timeout_at
from honk.core.errors import HonkError
from honk.core.net import Address, FlowMeta, IPAddress
from honk.proto.sniff import NEED_MORE, sniff_http, sniff_tls

__all__ = [
    "DialMode",
    "FlowPlan",
    "LearnedNames",
    "keeps_original_ip",
    "plan_flow",
    "sniff_first_bytes",
    "sniff_stream",
]

log = logging.getLogger("honk.inbound")

# names honk's DNS answered with this IP (most recent first); None when DNS learning is off
LearnedNames = Callable[[IPAddress], Iterable[str]]
Resolver = Callable[[str], Awaitable[Sequence[Any]]]

# Leaves that never dial by a sniffed name: the flow's own destination is what they serve.
IP_ONLY_PROTOCOLS = frozenset({"direct", "block"})


class DialMode(enum.Enum):
    IP = "ip"
    DOMAIN = "domain"
    DOMAIN_PLUS = "domain+"
    DOMAIN_PLUSPLUS = "domain++"

    @classmethod
    def parse(cls, text: str | DialMode) -> DialMode:
        """The mode named ``text`` (case-insensitive); ValueError lists the valid ones."""
        if isinstance(text, DialMode):
            return text
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValueError(
                f"dial_mode must be one of {', '.join(m.value for m in cls)}, not {text!r}"
            ) from None

    @property
    def sniffs(self) -> bool:
        return self is not DialMode.IP


@dataclass(frozen=True, slots=True)
class FlowPlan:
    """How one transparent flow is routed and dialled.

    ``meta`` is what routing sees; ``original`` the destination the client addressed (an IP);
    ``name`` the name proxy leaves dial instead of it (None: they dial the IP too);
    ``verified`` whether that name passed the reality check (or needed none: learned)."""

    meta: FlowMeta
    original: Address
    name: str | None = None
    verified: bool = False

    @property
    def by_name(self) -> bool:
        """Whether routing sees the name (not the original IP)."""
        return self.meta.target != self.original

    def dial_target(self, leaf_protocol: str, must: bool = False) -> Address:
        """What the leaf the flow was routed to dials: the name for a proxy when there is one;
        the original IP for direct, block and ``(must)`` decisions."""
        if self.name is None or must or leaf_protocol in IP_ONLY_PROTOCOLS:
            return self.original
        return Address(self.name, self.original.port)


def _usable_name(name: str | None) -> str | None:
    """A sniffed or learned name routing can use: not empty, not an IP literal."""
    if not name:
        return None
    name = name.rstrip(".").lower()
    if not name:
        return None
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return name
    return None


def _learned(learned_names: LearnedNames | None, ip: IPAddress) -> list[str]:
    if learned_names is None:
        return []
    try:
        names = learned_names(ip)
    except Exception:  # noqa: BLE001 - a broken DNS cache must not cost the flow its IP routing
        log.exception("learned_names failed for %s", ip)
        return []
    return [n for n in (_usable_name(name) for name in names or ()) if n is not None]


async def resolves_to(resolver: Resolver, name: str, ip: IPAddress, clock: Clock, timeout: float) -> bool:
    """Whether ``resolver`` answers ``name`` with ``ip`` within ``timeout`` clock seconds; a
    failure or a late answer is a no."""
    try:
        async with timeout_at(clock, clock.now() + timeout):
            answers = await resolver(name)
    except (HonkError, OSError, TimeoutError, ValueError) as exc:
        log.debug("sniffed name not verified name=%s ip=%s error=%s", name, ip, type(exc).__name__)
        return False
    for answer in answers or ():
        try:
            if ipaddress.ip_address(str(answer)) == ip:
                return True
        except ValueError:
            continue
    return False


async def plan_flow(
    mode: DialMode | str,
    meta: FlowMeta,
    sniffed: str | None,
    *,
    learned_names: LearnedNames | None = None,
    resolver: Resolver | None = None,
    clock: Clock | None = None,
    verify_timeout: float = 0.0,
) -> FlowPlan:
    """The plan of a flow whose ``meta.target`` is its original destination (an IP literal).

    ``sniffed``: the name its first bytes carried (None: none). ``domain`` verifies it against
    ``learned_names`` first, then asks ``resolver`` (bounded by ``verify_timeout`` seconds of
    ``clock``); a name that fails keeps the IP decision and the IP dial."""
    mode = DialMode.parse(mode)
    original = meta.target
    ip = original.ip
    if ip is None:
        raise ValueError(f"a transparent flow's destination is an IP, not {original.host}")
    ip_plan = FlowPlan(meta, original)
    if mode is DialMode.IP:
        return ip_plan
    name = _usable_name(sniffed)

    def routed_by(chosen: str, verified: bool) -> FlowPlan:
        routed_meta = dataclasses.replace(meta, target=Address(chosen, original.port), resolved=ip)
        return FlowPlan(routed_meta, original, chosen, verified)

    if mode is DialMode.DOMAIN_PLUS:
        return FlowPlan(meta, original, name) if name is not None else ip_plan
    learned = _learned(learned_names, ip)
    if name is None:
        return routed_by(learned[0], True) if learned else ip_plan
    if mode is DialMode.DOMAIN_PLUSPLUS:
        return routed_by(name, name in learned)
    # DOMAIN: the reality check
    if name in learned:
        return routed_by(name, True)
    if (
        resolver is not None
        and clock is not None
        and await resolves_to(resolver, name, ip, clock, verify_timeout)
    ):
        return routed_by(name, True)
    log.debug("sniffed name failed the reality check name=%s ip=%s", name, ip)
    return ip_plan


def keeps_original_ip(routed: Any) -> bool:
    """Whether the flow ``routed`` describes dials the original IP whatever was sniffed:
    direct, block and ``(must)`` decisions."""
    return routed.leaf.protocol in IP_ONLY_PROTOCOLS or routed.must


# --- sniffing ----------------------------------------------------------------------------


def sniff_stream(data: bytes) -> str | None:
    """The name in a TCP stream's first bytes (TLS SNI or HTTP Host), :data:`NEED_MORE`, or None."""
    verdicts = (sniff_tls(data), sniff_http(data))
    for verdict in verdicts:
        if verdict is not None and verdict != NEED_MORE:
            return verdict
    return NEED_MORE if NEED_MORE in verdicts else None


class _Readable(Protocol):
    async def receive(self) -> bytes: ...


async def sniff_first_bytes(
    conn: _Readable, clock: Clock, timeout: float, sniff: Callable[[bytes], str | None] = sniff_stream
) -> tuple[bytes, str | None]:
    """Read ``conn`` until its first bytes name a domain, cannot, end, or ``timeout`` clock
    seconds pass (a client waiting for the server to speak first); returns (the bytes read,
    the name or None). The caller forwards the bytes upstream first. Read errors propagate."""
    data = b""
    name: str | None = None
    try:
        async with timeout_at(clock, clock.now() + timeout):
            while True:
                chunk = await conn.receive()
                if not chunk:
                    break
                data += chunk
                verdict = sniff(data)
                if verdict != NEED_MORE:
                    name = verdict
                    break
    except TimeoutError:
        pass
    return data, name
