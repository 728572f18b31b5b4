"""The answer cache: LRU over entries that expire on the injected clock.

A key is (qname lower-cased, qtype, qclass, scope), the scope being the
upstream name request routing selected or ``("asis", destination)``: clients
that choose the same exchange share entries, different upstreams never do.
An entry holds the reply's wire bytes with its TTLs already set to its
lifetime; a hit reports the whole seconds left, which the service writes into
every record, so a client never keeps a record longer than honk does.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from honk.core.clock import Clock
from honk.dns.wire import remaining_seconds

__all__ = ["CacheKey", "CachedReply", "DnsCache"]

CacheKey = tuple[str, int, int, Hashable]


@dataclass(frozen=True, slots=True)
class CachedReply:
    wire: bytes
    ttl: int  # whole seconds left, >= 1


@dataclass(slots=True)
class _Entry:
    wire: bytes
    expires: float  # on the clock


class DnsCache:
    def __init__(self, clock: Clock, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("a DNS cache holds at least one entry")
        self._clock = clock
        self._max = max_entries
        self._entries: collections.OrderedDict[CacheKey, _Entry] = collections.OrderedDict()

    @property
    def max_entries(self) -> int:
        return self._max

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> CachedReply | None:
        """The live entry for ``key`` (now the most recently used), or None; an expired one is dropped."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        ttl = remaining_seconds(entry.expires, self._clock.now())
        if entry.expires <= self._clock.now() or ttl < 1:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return CachedReply(entry.wire, ttl)

    def put(self, key: CacheKey, wire: bytes, lifetime: float) -> None:
        """Keep ``wire`` for ``lifetime`` seconds (nothing for 0 or less), evicting the least recently used."""
        if lifetime <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = _Entry(wire, self._clock.now() + lifetime)
        self._entries.move_to_end(key)
        self._evict()

    def resize(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("a DNS cache holds at least one entry")
        self._max = max_entries
        self._evict()

    def retain(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop every entry whose scope ``keep`` refuses (a reload changed or removed its upstream)."""
        for key in [k for k in self._entries if not keep(k[3])]:
            del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()

    def _evict(self) -> None:
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
