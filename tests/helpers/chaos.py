"""A chaos node: a SOCKS5 server on loopback (no auth, CONNECT only) whose misbehaviour a test
changes while it runs, and which attributes every flow it carries.

    async with chaos_node(name="n1") as node:          # or host="::1"
        link = node.link                                 # 'socks5://127.0.0.1:PORT'
        node.behaviour.refuse_share = 0.5                # counts from the next CONNECT on
        ...
        node.stats.refused, node.records[-1].outcome

Each connection reads the behaviour when its greeting arrives (a blackhole decides there) and
takes a copy of it when its request arrives: changing ``node.behaviour`` (or assigning a new
``ChaosBehaviour``) affects every CONNECT from then on and no flow already past its request.
Randomness (connect jitter, the refusal share) comes from one ``random.Random(seed)`` per node,
drawn twice per CONNECT in request order, so a sequence of requests behaves the same each run.

Targets may be IPv4, IPv6 or a domain, but the node only ever dials loopback: a non-loopback
address, or a name other than ``localhost``/``*.localhost`` (never looked up), is answered 0x02.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import ipaddress
import random
import socket
import struct
import termios
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from helpers.socks import ATYP_DOMAIN, ATYP_IPV4, ATYP_IPV6, encode_address

# RFC 1928 §6 reply codes
REPLY_SUCCEEDED = 0x00
REPLY_NOT_ALLOWED = 0x02
REPLY_HOST_UNREACHABLE = 0x04
REPLY_REFUSED = 0x05
REPLY_COMMAND_UNSUPPORTED = 0x07
REPLY_ADDRESS_UNSUPPORTED = 0x08
CMD_CONNECT = 0x01
NO_AUTH, NO_ACCEPTABLE_METHOD = 0x00, 0xFF

READ_CHUNK = 64 * 1024  # bytes per read when no bandwidth cap applies
PACING_SLICE = 0.02  # seconds of a capped flow's bandwidth per chunk, so pacing stays smooth
DIAL_TIMEOUT = 5.0  # seconds: the most a loopback dial may take
FLUSH_TIMEOUT = 1.0  # seconds to wait for the peer to take bytes already sent before an RST
FIRST_BYTES = 64  # how much of what a client sends first a record keeps (for attribution)

# a flow record's outcome: "pending" until one of the others is known
PENDING, OK, REFUSED, BLACKHOLED, SILENCED, RESET = (
    "pending",
    "ok",
    "refused",
    "blackholed",
    "silenced",
    "reset",
)
UNREACHABLE, NOT_ALLOWED, UNSUPPORTED, CLIENT_GONE = (
    "unreachable",
    "not-allowed",
    "unsupported",
    "client-gone",
)


@dataclass
class ChaosBehaviour:
    """What the node does to the next CONNECT; every field may be changed at run time."""

    connect_delay: float = 0.0  # seconds before the reply (success or refusal)
    connect_jitter: float = 0.0  # seconds: a uniform extra in [0, jitter) on top of connect_delay
    chunk_delay: float = 0.0  # seconds before forwarding each chunk, in each direction
    refuse_share: float = 0.0  # the fraction of CONNECTs answered with refuse_code
    refuse_code: int = REPLY_REFUSED
    blackhole: bool = False  # accept and read, never answer (not even the greeting)
    reset_after: int | None = (
        None  # RST the client after this many bytes downstream (0: right after the reply)
    )
    silent: bool = False  # answer success, then forward nothing either way (the target is not dialled)
    bandwidth: float | None = None  # bytes/s per flow and per direction


@dataclass
class ChaosStats:
    """Counters per node. ``succeeded`` counts CONNECTs whose target was reached and answered
    0x00 (a flow reset later counts there and in ``reset``)."""

    accepted: int = 0  # TCP connections (a pooled connection that never speaks counts only here)
    requests: int = 0  # SOCKS requests read, any command
    refused: int = 0  # answered refuse_code by the refusal share
    blackholed: int = 0
    silenced: int = 0
    reset: int = 0  # RSTs sent by reset_after
    succeeded: int = 0
    unreachable: int = 0  # the target could not be dialled, or is not on loopback
    unsupported: int = 0  # a command other than CONNECT, or an unknown address type
    bytes_up: int = 0  # client -> target
    bytes_down: int = 0  # target -> client


@dataclass
class FlowRecord:
    """One connection that sent a greeting: when (the node's clock), where to, and what became of it."""

    started: float
    target: tuple[str, int] | None = None  # None until a request names it (a blackhole may never see one)
    outcome: str = PENDING
    reply: int | None = None  # the SOCKS reply code sent, None when none was
    bytes_up: int = 0
    bytes_down: int = 0
    first_up: bytes = b""  # the first bytes the client sent after the reply: what a test tags a flow with
    ended: float | None = None


class ChaosNode:
    """The server; ``chaos_node`` is the usual way to get one started and closed."""

    def __init__(
        self,
        name: str = "chaos",
        host: str = "127.0.0.1",
        *,
        seed: int = 0,
        behaviour: ChaosBehaviour | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.host = host
        self.behaviour = behaviour or ChaosBehaviour()
        self.rng = random.Random(seed)
        self.clock = clock
        self.stats = ChaosStats()
        self.records: list[FlowRecord] = []
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def port(self) -> int:
        assert self._server is not None, "the node is not started"
        return self._server.sockets[0].getsockname()[1]

    @property
    def link(self) -> str:
        """The node as a honk node link."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"socks5://{host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)

    async def close(self) -> None:
        """Stop listening and end every connection; returns once every handler has finished."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        await asyncio.sleep(0)  # handlers of connections accepted just now start, see _closed and leave
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # --- one connection ----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if self._closed:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        flow = _Flow(self, reader, writer)
        graceful = False
        try:
            graceful = await flow.run()
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            flow.decide(CLIENT_GONE)
        except asyncio.CancelledError:
            # the node closes; ending here rather than cancelled spares asyncio's stream callback
            # (3.11) an error report about a cancelled task
            flow.decide(CLIENT_GONE)
        finally:
            flow.end(graceful)
            self._tasks.discard(task)


class _Flow:
    """The state of one client connection, from greeting to end."""

    def __init__(self, node: ChaosNode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.node = node
        self.stats = node.stats
        self.reader, self.writer = reader, writer
        self.up_reader: asyncio.StreamReader | None = None
        self.up_writer: asyncio.StreamWriter | None = None
        self.record: FlowRecord | None = None

    def decide(self, outcome: str) -> None:
        if self.record is not None and self.record.outcome == PENDING:
            self.record.outcome = outcome

    def end(self, graceful: bool) -> None:
        """Close both sides: gracefully (buffered bytes still go out) after a relay that ended on
        its own, at once otherwise."""
        for writer in (self.writer, self.up_writer):
            if writer is None:
                continue
            if graceful:
                writer.close()
            else:
                writer.transport.abort()
        if self.record is not None and self.record.ended is None:
            self.record.ended = self.node.clock()

    async def run(self) -> bool:
        """Serve the connection; True when it ended as a relay whose both directions finished."""
        version, count = await self.reader.readexactly(2)
        methods = await self.reader.readexactly(count)
        self.record = FlowRecord(started=self.node.clock())
        self.node.records.append(self.record)
        if self.node.behaviour.blackhole:
            return await self._blackhole()
        if version != 5 or NO_AUTH not in methods:
            self.writer.write(bytes((5, NO_ACCEPTABLE_METHOD)))
            self.decide(UNSUPPORTED)
            self.stats.unsupported += 1
            return False
        self.writer.write(bytes((5, NO_AUTH)))
        command, target = await self._read_request()
        self.stats.requests += 1
        self.record.target = target
        behaviour = dataclasses.replace(self.node.behaviour)  # this flow's settings, whatever changes later
        if behaviour.blackhole:
            return await self._blackhole()
        if target is None or command != CMD_CONNECT:
            self.stats.unsupported += 1
            await self._refuse(
                REPLY_COMMAND_UNSUPPORTED if target else REPLY_ADDRESS_UNSUPPORTED, UNSUPPORTED
            )
            return False
        refuse_draw, jitter_draw = self.node.rng.random(), self.node.rng.random()  # always both: determinism
        delay = behaviour.connect_delay + behaviour.connect_jitter * jitter_draw
        if delay > 0:
            await asyncio.sleep(delay)
        if refuse_draw < behaviour.refuse_share:
            self.stats.refused += 1
            await self._refuse(behaviour.refuse_code, REFUSED)
            return False
        if behaviour.silent:
            return await self._silence()
        code = await self._dial(*target)
        if code != REPLY_SUCCEEDED:
            self.stats.unreachable += 1
            await self._refuse(code, NOT_ALLOWED if code == REPLY_NOT_ALLOWED else UNREACHABLE)
            return False
        assert self.up_writer is not None and self.up_reader is not None
        # drain() then means "handed to the kernel", which an RST after exactly N bytes needs
        self.writer.transport.set_write_buffer_limits(0)
        self._reply(REPLY_SUCCEEDED, self.up_writer.get_extra_info("sockname")[:2])
        self.stats.succeeded += 1
        await self.writer.drain()
        if behaviour.reset_after == 0:
            await self._reset()
            return False
        self.decide(OK)
        upstream = self._pipe(self.reader, self.up_writer, behaviour, downstream=False)
        downstream = self._pipe(self.up_reader, self.writer, behaviour, downstream=True)
        results = await asyncio.gather(upstream, downstream)
        return all(results)

    async def _read_request(self) -> tuple[int, tuple[str, int] | None]:
        """(command, target); the target is None for an address type this node cannot read."""
        _, command, _, atyp = await self.reader.readexactly(4)
        if atyp == ATYP_IPV4:
            host = str(ipaddress.IPv4Address(await self.reader.readexactly(4)))
        elif atyp == ATYP_IPV6:
            host = str(ipaddress.IPv6Address(await self.reader.readexactly(16)))
        elif atyp == ATYP_DOMAIN:
            (length,) = await self.reader.readexactly(1)
            host = (await self.reader.readexactly(length)).decode("ascii", "replace")
        else:
            return command, None
        (port,) = struct.unpack("!H", await self.reader.readexactly(2))
        return command, (host, port)

    def _reply(self, code: int, bound: tuple[str, int] = ("0.0.0.0", 0)) -> None:
        self.writer.write(bytes((5, code, 0)) + encode_address(*bound))
        assert self.record is not None
        self.record.reply = code

    async def _refuse(self, code: int, outcome: str) -> None:
        self._reply(code)
        self.decide(outcome)
        await self.writer.drain()

    async def _blackhole(self) -> bool:
        """Read (and drop) whatever the client sends until it leaves; never answer."""
        self.stats.blackholed += 1
        self.decide(BLACKHOLED)
        while await self.reader.read(READ_CHUNK):
            pass
        return False

    async def _silence(self) -> bool:
        """Success, then nothing either way until the node closes (the client's bytes stay unread)."""
        self.stats.silenced += 1
        self.decide(SILENCED)
        self._reply(REPLY_SUCCEEDED)
        await self.writer.drain()
        await asyncio.get_running_loop().create_future()  # only the node's close ends this
        return False

    async def _dial(self, host: str, port: int) -> int:
        """Connect to a loopback target; the reply code that says how it went."""
        try:
            candidates = [str(ipaddress.ip_address(host))]
        except ValueError:
            name = host.lower().rstrip(".")
            if name != "localhost" and not name.endswith(".localhost"):
                return REPLY_NOT_ALLOWED  # a name the node would have to look up: never
            candidates = ["127.0.0.1", "::1"]  # RFC 6761: localhost names are loopback
        if not all(ipaddress.ip_address(c).is_loopback for c in candidates):
            return REPLY_NOT_ALLOWED
        for address in candidates:
            try:
                self.up_reader, self.up_writer = await asyncio.wait_for(
                    asyncio.open_connection(address, port), DIAL_TIMEOUT
                )
                return REPLY_SUCCEEDED
            except (OSError, TimeoutError):
                continue
        return REPLY_HOST_UNREACHABLE if len(candidates) > 1 else REPLY_REFUSED

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        behaviour: ChaosBehaviour,
        *,
        downstream: bool,
    ) -> bool:
        """Forward one direction until EOF; False when it ended otherwise (an error, an RST)."""
        record = self.record
        assert record is not None
        rate = behaviour.bandwidth
        chunk = max(1024, min(READ_CHUNK, int(rate * PACING_SLICE))) if rate else READ_CHUNK
        loop = asyncio.get_running_loop()
        started, sent = loop.time(), 0
        try:
            while data := await reader.read(chunk):
                if behaviour.chunk_delay > 0:
                    await asyncio.sleep(behaviour.chunk_delay)
                reset_now = False
                if downstream and behaviour.reset_after is not None:
                    room = behaviour.reset_after - record.bytes_down
                    if len(data) >= room:
                        data, reset_now = data[:room], True
                if rate:  # the chunk leaves no earlier than the cap allows for everything up to its end
                    await asyncio.sleep(max(0.0, started + (sent + len(data)) / rate - loop.time()))
                writer.write(data)
                await writer.drain()
                sent += len(data)
                self._count(data, downstream)
                if reset_now:
                    await self._reset()
                    return False
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()
            return True
        except (OSError, asyncio.IncompleteReadError):
            return False

    def _count(self, data: bytes, downstream: bool) -> None:
        record = self.record
        assert record is not None
        if downstream:
            record.bytes_down += len(data)
            self.stats.bytes_down += len(data)
        else:
            if len(record.first_up) < FIRST_BYTES:
                record.first_up += data[: FIRST_BYTES - len(record.first_up)]
            record.bytes_up += len(data)
            self.stats.bytes_up += len(data)

    async def _reset(self) -> None:
        """RST the client once it has taken every byte sent so far (SO_LINGER 0, then abort)."""
        sock = self.writer.get_extra_info("socket")
        await _sent_queue_empty(sock)
        self.stats.reset += 1
        if self.record is not None:
            self.record.outcome = RESET  # overrides "ok": the relay it had become ends here
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()
        if self.up_writer is not None:
            self.up_writer.transport.abort()


async def _sent_queue_empty(sock: socket.socket) -> None:
    """Wait (bounded) until the kernel holds nothing unacknowledged for ``sock``: an RST would
    drop it, and the peer is meant to see exactly what was forwarded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FLUSH_TIMEOUT
    buf = bytearray(4)
    while loop.time() < deadline:
        try:
            fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf)
        except OSError:
            return
        if not int.from_bytes(buf, "little"):
            return
        await asyncio.sleep(0.001)


@contextlib.asynccontextmanager
async def chaos_node(
    name: str = "chaos",
    host: str = "127.0.0.1",
    *,
    seed: int = 0,
    behaviour: ChaosBehaviour | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[ChaosNode]:
    """A started ``ChaosNode`` on ``host`` (a free port), closed on exit."""
    node = ChaosNode(name, host, seed=seed, behaviour=behaviour, clock=clock)
    await node.start()
    try:
        yield node
    finally:
        await node.close()
