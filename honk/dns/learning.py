"""Which names resolved to which IPs: lets an IP-only flow be matched against domain rules.

Every A/AAAA answer honk returns to a client is recorded as address -> names
(the question's name and the record's owner, which differ along a CNAME
chain) for the lifetime the client was given. The table is bounded: at most
``max_addresses`` addresses, least recently recorded evicted first, and
:data:`MAX_NAMES_PER_ADDRESS` names each (the oldest name goes). It belongs to
the daemon rather than to one configuration, so a reload carries it over.
"""

from __future__ import annotations

import collections
import ipaddress
from collections.abc import Iterable

from honk.core.clock import Clock
from honk.core.net import IPAddress

__all__ = ["DEFAULT_LEARNED_ADDRESSES", "MAX_NAMES_PER_ADDRESS", "MIN_LEARNED_LIFETIME", "DomainLearning"]

DEFAULT_LEARNED_ADDRESSES = 65536  # addresses remembered; a home LAN resolves far fewer per TTL window
MAX_NAMES_PER_ADDRESS = 16  # a CDN address serves many names; more than this is noise for routing
# A client connects right after its answer arrives, so even a 0-TTL answer must cover that
# first connection.
MIN_LEARNED_LIFETIME = 10.0  # seconds


def _normalise(ip: IPAddress | str) -> IPAddress:
    address = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket's view of an IPv4 flow
    return address


class DomainLearning:
    def __init__(self, clock: Clock, max_addresses: int = DEFAULT_LEARNED_ADDRESSES) -> None:
        if max_addresses < 1:
            raise ValueError("learning keeps at least one address")
        self._clock = clock
        self._max = max_addresses
        # address -> (name -> expiry), both orders = least recently recorded first
        self._table: collections.OrderedDict[IPAddress, collections.OrderedDict[str, float]] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._table)

    def record(self, ip: IPAddress | str, names: Iterable[str], lifetime: float) -> None:
        """``ip`` was given out for ``names`` for ``lifetime`` seconds (at least MIN_LEARNED_LIFETIME)."""
        address = _normalise(ip)
        expires = self._clock.now() + max(lifetime, MIN_LEARNED_LIFETIME)
        entry = self._table.get(address)
        if entry is None:
            entry = self._table[address] = collections.OrderedDict()
        else:
            self._table.move_to_end(address)
        for name in names:
            name = name.rstrip(".").lower()
            if not name:
                continue
            entry[name] = max(expires, entry.get(name, expires))
            entry.move_to_end(name)
        while len(entry) > MAX_NAMES_PER_ADDRESS:
            entry.popitem(last=False)
        while len(self._table) > self._max:
            self._table.popitem(last=False)

    def learned_names(self, ip: IPAddress | str) -> tuple[str, ...]:
        """The live names ``ip`` was given out for, most recently recorded first."""
        try:
            address = _normalise(ip)
        except ValueError:
            return ()
        entry = self._table.get(address)
        if entry is None:
            return ()
        now = self._clock.now()
        for name in [n for n, expires in entry.items() if expires <= now]:
            del entry[name]
        if not entry:
            del self._table[address]
            return ()
        return tuple(reversed(entry))
