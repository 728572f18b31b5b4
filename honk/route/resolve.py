"""Name resolution for routing and the direct outbound, bounded by an injected clock.

A resolver is any async callable ``host -> list[IPAddress]`` (order kept, no
duplicates). It raises :class:`ResolveError` when the name has no address and
:class:`ResolveTimeout` when its deadline passes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from honk.core.clock import Clock, timeout_at
from honk.core.errors import HonkError
from honk.core.net import IPAddress

T = TypeVar("T")

Resolver = Callable[[str], Awaitable[list[IPAddress]]]


class ResolveError(HonkError):
    """A host name could not be resolved to any address."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class ResolveTimeout(ResolveError):
    """Resolution did not finish before its deadline."""


async def wait_until(clock: Clock, deadline: float, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` until ``deadline`` (absolute, on ``clock``).

    Raises :class:`TimeoutError` when the deadline passes first; the awaitable
    is then cancelled.
    """
    async with timeout_at(clock, deadline):
        return await awaitable


class SystemResolver:
    """Resolves with the event loop's ``getaddrinfo`` (the system resolver).

    Each call is bounded by ``timeout`` seconds on ``clock``. IP literals are
    returned without a lookup.
    """

    def __init__(self, clock: Clock, timeout: float) -> None:
        self._clock = clock
        self._timeout = timeout

    async def __call__(self, host: str) -> list[IPAddress]:
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        loop = asyncio.get_running_loop()
        lookup = loop.getaddrinfo(host, None, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        try:
            infos = await wait_until(self._clock, self._clock.now() + self._timeout, lookup)
        except TimeoutError:
            raise ResolveTimeout(host, f"no answer within {self._timeout:g}s") from None
        except OSError as exc:  # socket.gaierror and friends
            raise ResolveError(host, exc.strerror or str(exc)) from None
        return addresses_from_infos(host, infos)


def addresses_from_infos(host: str, infos: list[tuple[Any, ...]]) -> list[IPAddress]:
    """The distinct IPs of ``getaddrinfo`` results, in the order returned."""
    seen: dict[IPAddress, None] = {}
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        seen.setdefault(ipaddress.ip_address(sockaddr[0]), None)
    if not seen:
        raise ResolveError(host, "no IPv4 or IPv6 address")
    return list(seen)
