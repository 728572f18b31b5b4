"""The relay engine's pure-Python twin: the same API and events as ``relay_c.Engine``.

It moves bytes with ``os.splice`` through a pipe pair per direction (recv/send
through a buffer where splice answers ``EINVAL``, or when ``copy=True``), driven
by the loop's ``add_reader``/``add_writer`` instead of a worker thread: slower,
but the behaviour the conformance suite checks is the same.

Events reach ``listener.relay_event(kind, a, b, t)`` on the loop's thread, never
from inside ``add``/``cancel`` (they are queued and flushed by a loop callback,
as the compiled engine's are):

* ``EV_OPEN``: the engine took the flow over.
* ``EV_FIRST_BYTE``: the first byte from the upstream (``t`` = when it was read).
* ``EV_BYTES``: ``a`` = bytes read from the client so far, ``b`` = from the
  upstream; at most once per second per flow, and always once with the final
  totals just before ``EV_END``.
* ``EV_HALF_CLOSE``: ``a`` = 0 when the client's EOF was forwarded upstream
  (``shutdown(SHUT_WR)``), 1 when the upstream's EOF was forwarded to the client.
* ``EV_END``: the last event; ``a`` = ``END_CLEAN`` (both directions finished),
  ``END_ERROR`` or ``END_CANCELLED``; for ``END_ERROR`` ``b`` = ``side << 16 | errno``
  with side ``SIDE_CLIENT``/``SIDE_UPSTREAM`` (the fd the error came from) or
  ``SIDE_LOCAL`` (no pipe, no memory).

``t`` is ``time.monotonic()`` seconds (CLOCK_MONOTONIC, as in the compiled
engine). The engine owns the two fds from ``add`` on and closes them when the
flow ends; ``close()`` ends every flow with ``END_CANCELLED`` (delivered before it
returns) and closes every fd it holds.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import time
from typing import Any, Protocol

__all__ = [
    "Engine",
    "EngineClosed",
    "RelayListener",
    "EV_OPEN",
    "EV_FIRST_BYTE",
    "EV_BYTES",
    "EV_HALF_CLOSE",
    "EV_END",
    "END_CLEAN",
    "END_ERROR",
    "END_CANCELLED",
    "SIDE_CLIENT",
    "SIDE_UPSTREAM",
    "SIDE_LOCAL",
]

EV_OPEN = 1
EV_FIRST_BYTE = 2
EV_BYTES = 3
EV_HALF_CLOSE = 4
EV_END = 5

END_CLEAN = 0
END_ERROR = 1
END_CANCELLED = 2

SIDE_CLIENT = 0
SIDE_UPSTREAM = 1
SIDE_LOCAL = 2

TURN_BUDGET = 1024 * 1024  # bytes one direction moves per callback (fairness)
SPLICE_CHUNK = 1024 * 1024  # asked per splice into the pipe; the pipe's capacity bounds it
COPY_BUFFER = 64 * 1024  # recv size in copy mode (bytes)
POOL_PIPES = 32  # reusable empty pipe pairs
REPORT_INTERVAL = 1.0  # seconds between coalesced EV_BYTES of one flow

_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_F_SETPIPE_SZ = 1031


class EngineClosed(RuntimeError):
    """``add`` after ``close``."""


class RelayListener(Protocol):
    def relay_event(self, kind: int, a: int, b: int, t: float) -> None: ...


class _Error(Exception):
    def __init__(self, side: int, err: int) -> None:
        self.side = side
        self.err = err


class _Dir:
    __slots__ = ("src", "dst", "pr", "pw", "in_pipe", "buf", "copy", "src_eof", "shut")

    def __init__(self, src: int, dst: int, copy: bool) -> None:
        self.src = src  # side index of the source fd
        self.dst = dst
        self.pr = -1
        self.pw = -1
        self.in_pipe = 0
        self.buf = b""  # user-space bytes owed to dst
        self.copy = copy
        self.src_eof = False
        self.shut = False


class _Flow:
    __slots__ = (
        "id",
        "fds",
        "dirs",
        "listener",
        "counts",
        "rep",
        "next_report",
        "first_down",
        "ended",
        "readers",
        "writers",
        "report_handle",
    )

    def __init__(self, flow_id: int, fds: tuple[int, int], listener: Any, copy: bool) -> None:
        self.id = flow_id
        self.fds = list(fds)
        self.dirs = (_Dir(0, 1, copy), _Dir(1, 0, copy))
        self.listener = listener
        self.counts = [0, 0]
        self.rep = (0, 0)
        self.next_report = 0.0
        self.first_down = False
        self.ended = False
        self.readers = [False, False]  # add_reader active per fd
        self.writers = [False, False]
        self.report_handle: asyncio.TimerHandle | None = None


class Engine:
    """Relay flows on the running loop; see the module docstring."""

    implementation = "python"

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, *, pipe_size: int = 0) -> None:
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._pipe_size = pipe_size
        self._flows: dict[int, _Flow] = {}
        self._next_id = 1
        self._pool: list[tuple[int, int]] = []
        self._events: list[tuple[_Flow, int, int, int, float]] = []
        self._flush_scheduled = False
        self._closed = False

    # -- API ---------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self._flows)

    @property
    def closed(self) -> bool:
        return self._closed

    def add(
        self,
        client_fd: int,
        upstream_fd: int,
        listener: RelayListener,
        preamble: bytes = b"",
        client_eof: bool = False,
        copy: bool = False,
    ) -> int:
        if self._closed:
            raise EngineClosed("relay engine closed")
        flow_id = self._next_id
        self._next_id += 1
        flow = _Flow(flow_id, (client_fd, upstream_fd), listener, copy)
        flow.dirs[0].buf = bytes(preamble)
        flow.dirs[0].src_eof = client_eof
        self._flows[flow_id] = flow
        self._loop.call_soon(self._start, flow)
        return flow_id

    def cancel(self, flow_id: int) -> bool:
        flow = self._flows.get(flow_id)
        if flow is None or flow.ended or self._closed:
            return False
        self._end(flow, END_CANCELLED, 0)
        return True

    def counters(self, flow_id: int) -> tuple[int, int] | None:
        flow = self._flows.get(flow_id)
        return None if flow is None else (flow.counts[0], flow.counts[1])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for flow in list(self._flows.values()):
            if not flow.ended:
                self._end(flow, END_CANCELLED, 0)
        self._flush()
        for pr, pw in self._pool:
            os.close(pr)
            os.close(pw)
        self._pool.clear()

    # -- events --------------------------------------------------------------------------

    def _emit(self, flow: _Flow, kind: int, a: int, b: int) -> None:
        self._events.append((flow, kind, a, b, time.monotonic()))
        if not self._flush_scheduled and not self._closed:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        events, self._events = self._events, []
        for flow, kind, a, b, t in events:
            if kind == EV_END:
                self._flows.pop(flow.id, None)
            try:
                flow.listener.relay_event(kind, a, b, t)
            except Exception as exc:  # a listener's bug must not stop the other flows' events
                if not self._loop.is_closed():
                    self._loop.call_exception_handler(
                        {"message": "relay event listener failed", "exception": exc}
                    )

    # -- one flow --------------------------------------------------------------------------

    def _start(self, flow: _Flow) -> None:
        if flow.ended:
            return
        self._emit(flow, EV_OPEN, 0, 0)
        try:
            for fd in flow.fds:
                os.set_blocking(fd, False)
        except OSError as exc:
            self._end(flow, END_ERROR, (SIDE_CLIENT << 16) | (exc.errno or 0))
            return
        try:
            for d in flow.dirs:
                if not d.copy:
                    self._take_pipe(d)
        except OSError as exc:
            self._end(flow, END_ERROR, (SIDE_LOCAL << 16) | (exc.errno or 0))
            return
        self._service(flow)

    def _take_pipe(self, d: _Dir) -> None:
        if self._pool:
            d.pr, d.pw = self._pool.pop()
            return
        d.pr, d.pw = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._pipe_size > 0:
            import fcntl

            fcntl.fcntl(d.pw, _F_SETPIPE_SZ, self._pipe_size)

    def _drop_pipe(self, d: _Dir) -> None:
        if d.pr < 0:
            return
        if d.in_pipe == 0 and len(self._pool) < POOL_PIPES and not self._closed:
            self._pool.append((d.pr, d.pw))
        else:
            os.close(d.pr)
            os.close(d.pw)
        d.pr = d.pw = -1
        d.in_pipe = 0

    def _service(self, flow: _Flow) -> None:
        try:
            for d in flow.dirs:
                self._pump(flow, d)
        except _Error as exc:
            self._end(flow, END_ERROR, (exc.side << 16) | exc.err)
            return
        if flow.dirs[0].shut and flow.dirs[1].shut:
            self._end(flow, END_CLEAN, 0)
            return
        self._interest(flow)
        self._report(flow)

    def _pump(self, flow: _Flow, d: _Dir) -> None:
        """Move what one direction can move now (at most TURN_BUDGET bytes from src)."""
        if d.shut:
            return
        src, dst = flow.fds[d.src], flow.fds[d.dst]
        moved = 0
        while True:
            while d.buf:
                try:
                    n = os.write(dst, d.buf)
                except BlockingIOError:
                    return
                except InterruptedError:
                    continue
                except OSError as exc:
                    raise _Error(d.dst, exc.errno or 0) from None
                d.buf = d.buf[n:]
            while d.in_pipe:
                try:
                    n = os.splice(d.pr, dst, d.in_pipe, flags=_SPLICE_FLAGS)
                except BlockingIOError:
                    return
                except InterruptedError:
                    continue
                except OSError as exc:
                    if exc.errno == _errno.EINVAL:  # dst cannot take spliced pages
                        try:
                            d.buf = os.read(d.pr, d.in_pipe)
                        except OSError as exc2:
                            raise _Error(SIDE_LOCAL, exc2.errno or 0) from None
                        d.in_pipe = 0
                        d.copy = True
                        self._drop_pipe(d)
                        break
                    raise _Error(d.dst, exc.errno or 0) from None
                d.in_pipe -= n
            if d.buf:
                continue
            if d.src_eof:
                try:
                    _shutdown_wr(dst)
                except OSError as exc:
                    raise _Error(d.dst, exc.errno or 0) from None
                d.shut = True
                self._drop_pipe(d)
                self._emit(flow, EV_HALF_CLOSE, d.src, 0)
                return
            if moved >= TURN_BUDGET:
                return  # level-triggered: the loop calls again
            try:
                if d.copy:
                    data = os.read(src, COPY_BUFFER)
                    n = len(data)
                    d.buf = data
                else:
                    n = os.splice(src, d.pw, SPLICE_CHUNK, flags=_SPLICE_FLAGS)
                    d.in_pipe = n
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == _errno.EINVAL and not d.copy:
                    d.copy = True
                    self._drop_pipe(d)
                    continue
                raise _Error(d.src, exc.errno or 0) from None
            if n == 0:
                d.src_eof = True
                continue
            moved += n
            flow.counts[d.src] += n
            if d.src == SIDE_UPSTREAM and not flow.first_down:
                flow.first_down = True
                self._emit(flow, EV_FIRST_BYTE, 0, 0)

    def _interest(self, flow: _Flow) -> None:
        """Read src while its direction holds nothing for dst; else wait for dst to drain."""
        want_r = [False, False]
        want_w = [False, False]
        for d in flow.dirs:
            if d.shut:
                continue
            if d.buf or d.in_pipe or d.src_eof:
                want_w[d.dst] = True
            else:
                want_r[d.src] = True
        loop = self._loop
        for side in (0, 1):
            fd = flow.fds[side]
            if want_r[side] != flow.readers[side]:
                flow.readers[side] = want_r[side]
                if want_r[side]:
                    loop.add_reader(fd, self._on_ready, flow)
                else:
                    loop.remove_reader(fd)
            if want_w[side] != flow.writers[side]:
                flow.writers[side] = want_w[side]
                if want_w[side]:
                    loop.add_writer(fd, self._on_ready, flow)
                else:
                    loop.remove_writer(fd)

    def _on_ready(self, flow: _Flow) -> None:
        if not flow.ended:
            self._service(flow)

    def _report(self, flow: _Flow) -> None:
        counts = (flow.counts[0], flow.counts[1])
        if counts == flow.rep:
            return
        now = time.monotonic()
        if now >= flow.next_report:
            flow.rep = counts
            flow.next_report = now + REPORT_INTERVAL
            self._emit(flow, EV_BYTES, counts[0], counts[1])
        elif flow.report_handle is None:
            flow.report_handle = self._loop.call_later(flow.next_report - now, self._report_due, flow)

    def _report_due(self, flow: _Flow) -> None:
        flow.report_handle = None
        if not flow.ended:
            self._report(flow)

    def _end(self, flow: _Flow, cause: int, b: int) -> None:
        flow.ended = True
        if flow.report_handle is not None:
            flow.report_handle.cancel()
            flow.report_handle = None
        loop = self._loop
        loop_open = not loop.is_closed()
        for side in (0, 1):
            fd = flow.fds[side]
            if fd < 0:
                continue
            if flow.readers[side] and loop_open:
                loop.remove_reader(fd)
            if flow.writers[side] and loop_open:
                loop.remove_writer(fd)
            flow.readers[side] = flow.writers[side] = False
            os.close(fd)
            flow.fds[side] = -1
        for d in flow.dirs:
            self._drop_pipe(d)
            d.buf = b""
        self._emit(flow, EV_BYTES, flow.counts[0], flow.counts[1])
        self._emit(flow, EV_END, cause, b)


def _shutdown_wr(fd: int) -> None:
    import socket

    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_WR)
    finally:
        sock.detach()
