"""Deadline-bounded waiting and the system resolver's pure parts."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest

from honk.core.clock import FakeClock
from honk.route.resolve import ResolveError, SystemResolver, addresses_from_infos, wait_until


async def test_wait_until_returns_a_result_that_beats_the_deadline() -> None:
    clock = FakeClock()

    async def quick() -> int:
        return 7

    assert await wait_until(clock, clock.now() + 1.0, quick()) == 7
    assert clock.sleepers == 0


async def test_wait_until_times_out_on_the_injected_clock_and_cancels_the_work() -> None:
    clock = FakeClock()
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiter = asyncio.ensure_future(wait_until(clock, clock.now() + 2.0, never))
    while clock.sleepers == 0:
        await asyncio.sleep(0)
    clock.advance(1.999)
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(0.001)
    with pytest.raises(TimeoutError):
        await waiter
    assert never.cancelled()


async def test_wait_until_passes_errors_through() -> None:
    async def boom() -> None:
        raise ResolveError("x.test", "no such name")

    with pytest.raises(ResolveError):
        await wait_until(FakeClock(), 2000.0, boom())


async def test_system_resolver_returns_ip_literals_without_a_lookup() -> None:
    resolver = SystemResolver(FakeClock(), timeout=1.0)
    assert await resolver("2001:db8::1") == [ipaddress.ip_address("2001:db8::1")]


def test_addresses_from_infos_keeps_order_and_drops_duplicates() -> None:
    stream = socket.SOCK_STREAM
    infos = [
        (socket.AF_INET6, stream, 6, "", ("2001:db8::1", 0, 0, 0)),
        (socket.AF_INET, stream, 6, "", ("192.0.2.1", 0)),
        (socket.AF_INET6, stream, 6, "", ("2001:db8::1", 0, 0, 0)),
    ]
    assert addresses_from_infos("h.test", infos) == [
        ipaddress.ip_address("2001:db8::1"),
        ipaddress.ip_address("192.0.2.1"),
    ]


def test_addresses_from_infos_without_any_ip_is_a_resolve_error() -> None:
    with pytest.raises(ResolveError):
        addresses_from_infos("h.test", [])
