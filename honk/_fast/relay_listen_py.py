"""The relay engine twin's listener mode: the SOCKS5 CONNECT fast path on the event loop.

The twin of ``relay_listen.pxi``: accepting a fast-path listener's clients, reading their
handshakes (judged by the ``socks5hs`` twin), answering the asyncio side's commands
(``hs_connect``, ``hs_relay``, ``hs_reject``) with the engine's own dial and TLS handshake,
and delivering the listener's events. :class:`ListenerMode` is a part of
:class:`honk._fast.relay_py.Engine`, whose state (flows, events, the loop) it shares.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import select
import socket
import ssl
import time
from typing import Any

from honk._fast import relay_py as _core  # the engine this is a part of (imported either way round)
from honk._fast import socks5hs_py as _socks5hs  # handshakes are judged by the twin kernel

_HS_GREETING, _HS_REQUEST, _HS_WAITING, _HS_DEAD = 1, 2, 3, 4
ACCEPT_BURST = 64  # accepts per listener readiness
ACCEPT_BACKOFF = 0.1  # seconds a listener rests after EMFILE/ENFILE/ENOBUFS/ENOMEM instead of spinning
_ACCEPT_EXHAUSTED = frozenset({_errno.EMFILE, _errno.ENFILE, _errno.ENOBUFS, _errno.ENOMEM})


class _Shake:
    """The TLS handshake of an hs_connect flow (the twin of the compiled TlsState's fields)."""

    __slots__ = ("error", "facts", "plain", "raw", "started", "task")

    def __init__(self, plain: bytes, raw: bytes = b"") -> None:
        self.raw = raw  # a head written as it is once it is done (VMess's sealed request header)
        self.plain = plain  # the head (unless raw) and the client's early bytes, sealed once it is done
        self.task: asyncio.Task[None] | None = None
        self.started = False
        self.facts = -1  # once finished: TLS_RESUMED | TLS_13
        self.error: ssl.SSLError | None = None


class _Lst:
    __slots__ = ("id", "sock", "listener", "accepted")

    def __init__(self, lid: int, sock: Any, listener: Any) -> None:
        self.id = lid
        self.sock = sock  # the engine's own dup of the listening socket; None once closed
        self.listener = listener
        self.accepted = 0


class _Hs:
    __slots__ = ("fd", "lid", "state", "answered", "buf", "req_off", "req_end", "peer", "err", "timer")

    def __init__(self, fd: int, lid: int, peer: tuple[str, int]) -> None:
        self.fd = fd
        self.lid = lid
        self.state = _HS_GREETING
        self.answered = 0
        self.buf = bytearray()
        self.req_off = 0
        self.req_end = 0
        self.peer = peer
        self.err = 0
        self.timer: asyncio.TimerHandle | None = None


def _connect_done(fd: int) -> bool:
    """Whether the connect started on ``fd`` has finished already (over loopback the kernel
    often finishes it within connect() itself); a failed one is left to the writer callback."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    ready = poller.poll(0)
    return bool(ready) and ready[0][1] & (select.POLLOUT | select.POLLERR | select.POLLHUP) == select.POLLOUT


class ListenerMode:
    """Listener mode of the twin engine (the methods ``Engine`` takes from here)."""

    def listen(self, fd: int, listener: Any) -> int:

        if self._closed:
            raise _core.EngineClosed("relay engine closed")
        sock = socket.socket(fileno=os.dup(fd))
        sock.setblocking(False)
        lid = len(self._lsts) + 1
        while lid in self._lsts:
            lid += 1
        lst = _Lst(lid, sock, listener)
        self._lsts[lid] = lst
        self._loop.add_reader(sock.fileno(), self._accept, lst)
        return lid

    def unlisten(self, lid: int, drop: bool = False) -> None:
        lst = self._lsts.get(lid)
        if lst is not None and not self._closed:
            self._unlisten(lst, drop)

    def _unlisten(self, lst: _Lst, drop: bool) -> None:
        if lst.sock is not None:
            if not self._loop.is_closed():
                self._loop.remove_reader(lst.sock.fileno())
            lst.sock.close()
            lst.sock = None
        if drop:
            for hs in [h for h in self._hs.values() if h.lid == lst.id]:
                self._hs_release(hs, _core.EV_DROPPED)

    def accepted(self, lid: int) -> int:
        lst = self._lsts.get(lid)
        return 0 if lst is None else lst.accepted

    def _accept(self, lst: _Lst) -> None:
        for _ in range(ACCEPT_BURST):
            if lst.sock is None:
                return
            try:
                conn, addr = lst.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == _errno.EINVAL:  # shut down under us: nothing more comes
                    self._unlisten(lst, False)
                elif exc.errno in _ACCEPT_EXHAUSTED:
                    # Out of descriptors or memory: rest, then listen again, rather than spin.
                    fd = lst.sock.fileno()
                    self._loop.remove_reader(fd)
                    self._loop.call_later(ACCEPT_BACKOFF, self._resume_accepting, lst)
                    self._queue_lst(lst.id, _core.EV_RESTED, exc.errno)
                return
            conn.setblocking(False)
            hs = _Hs(conn.detach(), lst.id, (addr[0], addr[1]))
            token = self._next_token
            self._next_token += 1
            self._hs[token] = hs
            lst.accepted += 1
            hs.timer = self._loop.call_later(_core.HS_HANDOVER_AFTER, self._hs_expired, token)
            self._loop.add_reader(hs.fd, self._hs_read, token)
            self._hs_read(token)

    def _resume_accepting(self, lst: _Lst) -> None:
        if lst.sock is not None and not self._closed:
            self._loop.add_reader(lst.sock.fileno(), self._accept, lst)

    def _hs_expired(self, token: int) -> None:
        hs = self._hs.get(token)
        if hs is not None:
            hs.timer = None
            self._hs_release(hs, _core.EV_HANDOVER, token)

    def _hs_release(self, hs: _Hs, kind: int, token: int | None = None) -> None:
        if token is None:
            token = next(t for t, h in self._hs.items() if h is hs)
        del self._hs[token]
        if hs.timer is not None:
            hs.timer.cancel()
            hs.timer = None
        if not self._loop.is_closed():
            self._loop.remove_reader(hs.fd)
        if kind == _core.EV_DROPPED:
            os.close(hs.fd)
            hs.fd = -1
        elif kind == _core.EV_REQUEST:
            self._held[token] = hs
        hs.state = _HS_WAITING if kind == _core.EV_REQUEST else _HS_DEAD
        self._queue_lst(hs.lid, kind, (token, hs))

    def _hs_read(self, token: int) -> None:
        hs = self._hs.get(token)
        if hs is None:
            return
        buf = hs.buf
        while True:
            if len(buf) >= _core.HS_BUF:
                return self._hs_release(hs, _core.EV_HANDOVER, token)
            try:
                data = os.read(hs.fd, _core.HS_BUF - len(buf))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                hs.err = exc.errno or 0
                return self._hs_release(hs, _core.EV_HANDOVER, token)
            if not data:
                return self._hs_release(hs, _core.EV_HANDOVER, token)
            buf += data
            if hs.state == _HS_GREETING:
                off = _socks5hs.greeting(buf)
                if off == _socks5hs.HANDOVER:  # incomplete, or no "no-auth": Python answers it
                    return self._hs_release(hs, _core.EV_HANDOVER, token)
                try:
                    sent = os.write(hs.fd, b"\x05\x00")
                except OSError as exc:
                    hs.err = exc.errno or 0
                    sent = -1
                if sent != 2:
                    return self._hs_release(hs, _core.EV_HANDOVER, token)
                hs.answered = 2
                hs.req_off = off
                hs.state = _HS_REQUEST
            end = _socks5hs.request(buf, hs.req_off)
            if end == _socks5hs.MORE:
                continue  # nothing after the greeting yet: read until EAGAIN
            if end == _socks5hs.HANDOVER:
                return self._hs_release(hs, _core.EV_HANDOVER, token)
            hs.req_end = end
            return self._hs_release(hs, _core.EV_REQUEST, token)

    def _queue_lst(self, lid: int, kind: int, payload: Any) -> None:
        self._events.append((lid, kind, payload, 0, time.monotonic()))  # type: ignore[arg-type]
        if not self._flush_scheduled and not self._closed:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _listener_event(self, lid: Any, kind: int, payload: Any) -> None:
        lst = self._lsts.get(lid)
        listener = lst.listener if lst is not None else None
        if kind == _core.EV_DROPPED:
            if listener is not None:
                listener.socks_dropped()
            return
        if kind == _core.EV_RESTED:
            if listener is not None:
                listener.socks_rested(payload)
            return
        token, hs = payload
        src_host, src_port = hs.peer
        if kind == _core.EV_HANDOVER:
            if listener is None:
                os.close(hs.fd)
                return
            listener.socks_handover(hs.fd, bytes(hs.buf), hs.answered, hs.err, src_host, src_port)
            return
        host, port = _socks5hs.target(hs.buf, hs.req_off)
        if listener is None:
            self.hs_reject(token, 1)
            return
        listener.socks_request(token, src_host, src_port, host, port)

    def _take_token(self, token: int) -> _Hs:
        hs = self._held.pop(token, None)
        if hs is None:
            raise ValueError("unknown or already answered handshake token")
        return hs

    def hs_connect(
        self, token: int, ip: str, port: int, mark: int, listener: Any, framing: Any = None, head: bytes = b""
    ) -> int:
        import ipaddress

        if self._closed:
            raise _core.EngineClosed("relay engine closed")
        address = ipaddress.ip_address(ip)  # ValueError for anything else, as the compiled engine
        if framing is not None and getattr(framing, "kind", None) == "tls":
            _core._check_framing(framing, handshake=True)
            hs = self._take_token(token)
            framing.claim()
            flow_id = self._start_fast(hs, listener, (address, port, mark), -1)
            flow = self._flows[flow_id]
            flow.framing = framing
            for d in flow.dirs:
                d.copy = True
            if framing.inner is not None:  # VMess's header is sealed already: only the body is chunked
                flow.shake = _Shake(flow.dirs[0].buf, head)
            else:
                flow.shake = _Shake(head + flow.dirs[0].buf)  # sealed once the handshake is done
            flow.dirs[0].buf = b""
            return flow_id
        if framing is not None:
            if _core._salt_unsent(framing):  # the salt and the sealed head go first, as the compiled engine
                _core._check_framing(framing, salted=False)
                head = framing.encryptor.encrypt(head)
            else:
                _core._check_framing(framing)
        hs = self._take_token(token)
        return self._start_fast(hs, listener, (address, port, mark), -1, framing, head)

    def hs_relay(self, token: int, upstream_fd: int, listener: Any, framing: Any = None) -> int:
        if self._closed:
            raise _core.EngineClosed("relay engine closed")
        if framing is not None:
            _core._check_framing(framing)
        hs = self._take_token(token)
        return self._start_fast(hs, listener, None, upstream_fd, framing)

    def hs_reject(self, token: int, code: int) -> None:
        if self._closed:
            return
        hs = self._take_token(token)
        _core._send_quiet(hs.fd, _socks5hs.build_reply(code, -1))
        os.close(hs.fd)
        hs.fd = -1

    def _start_fast(
        self, hs: _Hs, listener: Any, dial: Any, upstream_fd: int, framing: Any = None, head: bytes = b""
    ) -> int:
        flow_id = self._next_id
        self._next_id += 1
        flow = _core._Flow(flow_id, (hs.fd, upstream_fd), listener, False)
        flow.dirs[0].buf = bytes(hs.buf[hs.req_end :])
        if framing is not None:
            flow.dirs[0].buf = flow.frame(framing, flow.dirs[0].buf)
        flow.dirs[0].buf = head + flow.dirs[0].buf
        flow.connecting = True
        hs.fd = -1
        self._flows[flow_id] = flow
        self._loop.call_soon(self._connect, flow, dial)
        return flow_id

    def _connect(self, flow: _core._Flow, dial: Any) -> None:

        if flow.ended:
            return
        if dial is not None:
            address, port, mark = dial
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                self._end(flow, _core.END_ERROR, (_core.SIDE_UPSTREAM << 16) | (exc.errno or 0))
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if mark >= 0 and not self._mark_denied:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_MARK", 36), mark)
                except PermissionError:
                    self._mark_denied = True
            sockaddr = (str(address), port, 0, 0) if family == socket.AF_INET6 else (str(address), port)
            err = sock.connect_ex(sockaddr)
            flow.fds[1] = sock.detach()
            if err not in (0, _errno.EINPROGRESS):
                self._end(flow, _core.END_ERROR, (_core.SIDE_UPSTREAM << 16) | err)
                return
            if _connect_done(
                flow.fds[1]
            ):  # as the compiled worker: opened now, not after a readiness callback
                self.connects_at_once += 1
                self._connected(flow)
                return
        else:
            try:
                os.set_blocking(flow.fds[1], False)
            except OSError as exc:
                self._end(flow, _core.END_ERROR, (_core.SIDE_UPSTREAM << 16) | (exc.errno or 0))
                return
            self._connected(flow)
            return
        flow.writers[1] = True
        self._loop.add_writer(flow.fds[1], self._connected, flow)

    def _connected(self, flow: _core._Flow) -> None:

        if flow.ended:
            return
        if flow.writers[1]:
            flow.writers[1] = False
            self._loop.remove_writer(flow.fds[1])
        sock = socket.socket(fileno=flow.fds[1])
        try:
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        finally:
            sock.detach()
        if err:
            self._end(flow, _core.END_ERROR, (_core.SIDE_UPSTREAM << 16) | err)
            return
        if flow.shake is not None and flow.shake.task is None:
            flow.shake.task = self._loop.create_task(self._shake_hands(flow, flow.shake))
            return
        self._open(flow)

    async def _shake_hands(self, flow: _core._Flow, shake: _Shake) -> None:
        """The TLS handshake of an hs_connect flow, then its head and early bytes sealed; as the
        compiled worker does it, with the same outcomes (see relay_c's "TLS handshakes")."""

        framing = flow.framing
        sslobj = framing.sslobj
        loop = self._loop
        sock = socket.socket(fileno=os.dup(flow.fds[1]))
        try:
            sock.setblocking(False)
            while True:
                shake.started = True
                try:
                    sslobj.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                if out := framing.outgoing.read():
                    await loop.sock_sendall(sock, out)
                if done:
                    break
                data = await loop.sock_recv(sock, _core.FRAMED_READ)
                if not data:
                    raise ConnectionResetError(_errno.ECONNRESET, "the server closed during the handshake")
                framing.incoming.write(data)
        except ssl.SSLError as exc:
            shake.error = exc
            self._end(flow, _core.END_ERROR, (_core.SIDE_UPSTREAM << 16) | _errno.EPROTO)
            return
        except OSError as exc:
            self._end(flow, _core.END_ERROR, (_core.SIDE_UPSTREAM << 16) | (exc.errno or _errno.EIO))
            return
        except Exception as exc:  # a bug: this flow only, and said
            self._loop.call_exception_handler(
                {"message": "TLS handshake of a relay flow failed", "exception": exc}
            )
            self._end(flow, _core.END_ERROR, (_core.SIDE_LOCAL << 16) | _errno.EIO)
            return
        finally:
            sock.close()
        if flow.ended:
            return
        shake.facts = (_core.TLS_RESUMED if sslobj.session_reused else 0) | (
            _core.TLS_13 if sslobj.version() == "TLSv1.3" else 0
        )
        if shake.raw:
            sslobj.write(shake.raw)  # a memory BIO takes it all; encrypt() reads it out with the rest
        flow.dirs[0].buf = framing.encryptor.encrypt(shake.plain)
        self._open(flow)
