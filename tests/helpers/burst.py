"""A connection burst, as the load tool of the relay benchmark makes one, with every connection's fate.

``burst(proxy, origin, count, concurrency)`` opens ``count`` short SOCKS5 CONNECT flows through
``proxy`` to ``origin``, at most ``concurrency`` at once: greeting, request, 100 bytes up, the
same 100 bytes back, close. Each ends as one of

* ``ok``: echoed;
* ``refused``: the proxy answered the request with a failure code (a clean refusal);
* ``unanswered``: no reply within :data:`ANSWER_TIMEOUT`, a reset or EOF before the reply, or
  a connect that failed: what a client of an exhausted proxy sees;
* ``broken``: accepted (0x00) but the echo did not come back whole.

The origin is :class:`EchoOnce` (read 100 bytes, echo, close), like the load tool's ``R`` mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

ECHO_BYTES = 100  # bytes each way per connection (the relay benchmark's rate mode)
ANSWER_TIMEOUT = 10.0  # seconds a connection may wait for each answer before it counts as unanswered
PAYLOAD = bytes(range(ECHO_BYTES))


@dataclass
class BurstResult:
    outcomes: Counter[str] = field(default_factory=Counter)
    codes: Counter[int] = field(default_factory=Counter)  # SOCKS reply codes of the refusals
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    @property
    def rate(self) -> float:
        return self.total / self.seconds if self.seconds else 0.0


async def _one(proxy: tuple[str, int], origin: tuple[str, int], result: BurstResult) -> None:
    outcome = "unanswered"  # until the proxy answers the request
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*proxy), ANSWER_TIMEOUT)
        writer.write(
            b"\x05\x01\x00" + b"\x05\x01\x00\x01" + socket.inet_aton(origin[0]) + origin[1].to_bytes(2, "big")
        )
        method = await asyncio.wait_for(reader.readexactly(2), ANSWER_TIMEOUT)
        reply = await asyncio.wait_for(reader.readexactly(10), ANSWER_TIMEOUT)
        if method != b"\x05\x00" or reply[1] != 0:
            outcome = "refused"
            result.codes[reply[1]] += 1
            return
        outcome = "broken"  # accepted: from here only a whole echo is a success
        writer.write(PAYLOAD)
        if await asyncio.wait_for(reader.readexactly(ECHO_BYTES), ANSWER_TIMEOUT) == PAYLOAD:
            outcome = "ok"
    except (asyncio.IncompleteReadError, ConnectionError, OSError, TimeoutError):
        pass
    finally:
        result.outcomes[outcome] += 1
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def burst(proxy: tuple[str, int], origin: tuple[str, int], count: int, concurrency: int) -> BurstResult:
    """``count`` connections, ``concurrency`` at a time; what became of each."""
    result = BurstResult()
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> None:
        async with gate:
            await _one(proxy, origin, result)

    started = time.monotonic()
    await asyncio.gather(*(gated() for _ in range(count)))
    result.seconds = time.monotonic() - started
    return result


class EchoOnce:
    """The burst's origin: read :data:`ECHO_BYTES`, send them back, close."""

    def __init__(self) -> None:
        self.served = 0
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            data = await reader.readexactly(ECHO_BYTES)
            writer.write(data)
            await writer.drain()
            self.served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def echo_once() -> AsyncIterator[EchoOnce]:
    origin = EchoOnce()
    server = await asyncio.start_server(origin._handle, "127.0.0.1", 0, backlog=1024)
    origin.port = server.sockets[0].getsockname()[1]
    try:
        yield origin
    finally:
        server.close()
        await server.wait_closed()
