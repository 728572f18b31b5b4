"""Asyncio clients and spec builders shared by the loopback integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from helpers.socks import encode_address
from honk.config.spec import MatchArg, Predicate, RuleSpec

STEP = 5.0  # seconds: the most any single protocol exchange may take in a test


def rule(predicate: str, value: str, outbound: str, key: str = "") -> RuleSpec:
    """A one-predicate routing rule: ``predicate(key: value) -> outbound``."""
    return RuleSpec(predicates=(Predicate(predicate, (MatchArg(key, value),)),), outbound=outbound)


async def socks5_open(
    port: int, host: str, dport: int, *, cmd: int = 1, auth: tuple[str, str] | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, bytes]:
    """SOCKS5 handshake; returns the streams, the reply code (0xFF: method/auth refused), and the bound address."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01" + (b"\x02" if auth else b"\x00"))
    method = (await asyncio.wait_for(reader.readexactly(2), STEP))[1]
    if method == 0xFF:
        return reader, writer, 0xFF, b""
    if auth:
        user, password = (a.encode() for a in auth)
        writer.write(b"\x01" + bytes((len(user),)) + user + bytes((len(password),)) + password)
        status = (await asyncio.wait_for(reader.readexactly(2), STEP))[1]
        if status != 0:
            return reader, writer, 0xFF, b""
    writer.write(bytes((5, cmd, 0)) + encode_address(host, dport))
    head = await asyncio.wait_for(reader.readexactly(4), STEP)
    tail = await asyncio.wait_for(reader.readexactly({1: 6, 4: 18}[head[3]]), STEP)
    return reader, writer, head[1], tail


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def until(condition: Callable[[], bool], what: str, turns: int = 1000) -> None:
    """Let the loop run until ``condition()`` holds: bounded in loop turns, not in time."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")
