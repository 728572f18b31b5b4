"""What the reload tests share: a small SOCKS5 upstream that counts its clients, a flow that
proves it is alive by echoing, and the listening socket's inode as the kernel reports it."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import struct
from pathlib import Path

from helpers.aio import STEP, close_writer, socks5_open


class SocksUpstream:
    """A no-auth SOCKS5 CONNECT server on loopback (what a proxy node dials)."""

    def __init__(self) -> None:
        self.port = 0
        self.clients = 0  # connections accepted so far (health probes among them)
        self.connects = 0  # CONNECT requests answered: the flows it carried
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> SocksUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    @property
    def link(self) -> str:
        return f"socks5://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients += 1
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            _ver, n = await reader.readexactly(2)
            await reader.readexactly(n)
            writer.write(b"\x05\x00")
            _ver, _cmd, _rsv, atyp = await reader.readexactly(4)
            if atyp == 1:
                host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
            elif atyp == 4:
                host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
            else:
                host = (await reader.readexactly((await reader.readexactly(1))[0])).decode()
            (port,) = struct.unpack("!H", await reader.readexactly(2))
            up_reader, up_writer = await asyncio.open_connection(host, port)
            self.connects += 1
            writer.write(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._pipes.discard(task)
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.write_eof()


class Flow:
    """One SOCKS5 CONNECT through honk to an echo server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.sent = 0

    @classmethod
    async def open(cls, proxy_port: int, echo_port: int, auth: tuple[str, str] | None = None) -> Flow:
        reader, writer, code, _ = await socks5_open(proxy_port, "127.0.0.1", echo_port, auth=auth)
        assert code == 0, f"SOCKS5 reply {code:#x}"
        return cls(reader, writer)

    async def echoes(self, payload: bytes | None = None) -> bool:
        """Whether ``payload`` comes back whole (False when the flow has ended)."""
        self.sent += 1
        payload = payload or f"ping {self.sent}".encode()
        try:
            self.writer.write(payload)
            await self.writer.drain()
            got = await asyncio.wait_for(self.reader.readexactly(len(payload)), STEP)
        except (OSError, asyncio.IncompleteReadError):
            return False
        return got == payload

    async def ended(self) -> bool:
        """Whether honk closed the flow (EOF or reset within STEP)."""
        try:
            return await asyncio.wait_for(self.reader.read(1), STEP) == b""
        except OSError:
            return True

    async def close(self) -> None:
        await close_writer(self.writer)


def listening_inode(port: int) -> int:
    """The inode of the TCP socket listening on 127.0.0.1:``port`` (from /proc/net/tcp), 0 if none."""
    want = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == want and fields[3] == "0A":  # state LISTEN
            return int(fields[9])
    return 0


def open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
