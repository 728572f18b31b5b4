"""TLS from a node to its server: stdlib ``ssl`` over asyncio, failures typed by cause.

Shared by every leaf that speaks TLS to its server: ``https://`` proxies and the TLS transport
of VMess, VLESS and Trojan nodes. The handshake runs under the dial
deadline; its failures are :class:`TlsFailed` (a ``DialError`` of phase
``tls``) with a stable ``reason``:

* ``certificate-untrusted``: the chain does not lead to a trusted CA (a
  self-signed certificate, or a CA missing from the trust store);
* ``certificate-expired`` (or not yet valid);
* ``certificate-name``: the certificate is not for the server name (SNI);
* ``handshake``: anything else the TLS layer refused (protocol versions,
  alerts, a server that does not speak TLS);
* ``timeout`` is a :class:`~honk.core.errors.DialTimeout` of phase ``tls``.

Verification is on unless the node's link says otherwise
(:func:`tls_verification`); the trust store is the system's, which honours
``SSL_CERT_FILE``, unless the node names its own CA. ALPN protocols are offered
when the node names them.

A dial resumes the TLS 1.3 session of the last handshake with the same server
(address and server name) when it has a ticket for it: the server skips its
certificate and signature, the client skips verifying them again, which is
most of a handshake's CPU on both ends. The key exchange stays ephemeral, so
forward secrecy is kept; TLS 1.2 sessions are never resumed (their resumption
would reuse the old master secret). A server that refuses the ticket gets a
full handshake in the same round trips. Each context keeps its own sessions
(:class:`_ResumingContext`), so a rebuilt context (a replaced CA file) starts
afresh and a session is only offered under the trust it was verified with.

A full handshake with a server whose certificate chain was verified in the last
:data:`VERIFY_CACHE_TTL` seconds, for the same server name, accepts that chain
without verifying it again (:mod:`honk._fast.tlsverify`, compiled builds): the
same certificates, names and flags, under the same context's trust, never past
the chain's earliest ``notAfter``. The server still proves it holds the key
(its CertificateVerify signature is checked on every handshake); only the
chain's verification, about a seventh of a client handshake's CPU with OpenSSL
3.0, is not repeated. Contexts that do not verify get no cache. Compiled builds also
have OpenSSL decode the server's EC certificate key with its built-in method
instead of the provider decoders (:func:`honk._fast.tlsverify.prefer_builtin_keys`):
90 µs less per certificate parsed, every full handshake.

A node's own CA is its ``ca`` parameter (:func:`ca_path`): the path of a PEM file
holding one or more CA certificates (a relative path is taken from the daemon's
working directory). It replaces the system store for that node
only: a server certificate must chain to one of them, so a private CA does not
widen what other nodes trust, and the node does not fall back to public CAs.
:func:`client_context` builds each distinct context once (loading a trust store
costs milliseconds) and checks at every dial, by one ``stat``, whether the file
it was built from changed, so a replaced file counts from the next dial; a
missing, unreadable or non-PEM file is a :class:`~honk.core.errors.ConfigRefused`
naming the node and the path.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import os
import socket
import ssl
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from honk._fast import tlsverify
from honk.config.links import CA_KEY, INSECURE_KEYS, insecure_claimed
from honk.core.clock import Clock, timeout_at
from honk.core.errors import ConfigRefused, DialError, DialTimeout, HonkError, UpstreamFailed
from honk.proto.tls_framing import HandshakeReport
from honk.relay.stream import StreamConn

__all__ = [
    "TlsConnection",
    "TlsFailed",
    "ca_path",
    "client_context",
    "tls_connect",
    "tls_handshake",
    "tls_verification",
]

MAX_CA_BYTES = 1 << 20  # a node's CA file is a few certificates; anything bigger is a wrong path
CONTEXT_CACHE = 64  # distinct (verification, ALPN, trust store) contexts kept; nodes share them
RESUMED_SERVERS = 128  # servers per context whose TLS 1.3 session is kept for resumption
HARVEST_RETRY = 60.0  # seconds before a server that sent no session ticket is looked at again
# seconds a trust store's file version is believed before its file is looked at again: a replaced
# CA file counts within a second, and a burst of dials costs no stat calls per dial
TRUST_STORE_RECHECK = 1.0
# seconds a verified certificate chain is accepted again without re-verifying it (never past its
# notAfter): long enough that a burst of dials verifies once, short beside a certificate's life
VERIFY_CACHE_TTL = 300.0
HANDSHAKE_READ = 64 * 1024  # bytes asked per read while tls_handshake runs (a flight of certificates fits)
# Threads that take the server's flight of a tls_handshake (key exchange, chain and signature
# checks: nearly all of a handshake's CPU) off the event loop's thread; OpenSSL runs them
# without the GIL, so flows keep moving meanwhile and a burst of handshakes uses every core.
HANDSHAKE_THREADS = max(2, os.cpu_count() or 1)


# OpenSSL's X509 verification codes (X509_V_ERR_*) as honk's reasons.
_VERIFY_REASONS = {
    9: "certificate-expired",  # CERT_NOT_YET_VALID
    10: "certificate-expired",  # CERT_HAS_EXPIRED
    62: "certificate-name",  # HOSTNAME_MISMATCH
    64: "certificate-name",  # IP_ADDRESS_MISMATCH
}


class TlsFailed(DialError):
    """The TLS handshake with the node's server failed; ``reason`` says why."""

    def __init__(self, outbound: str, reason: str, message: str) -> None:
        super().__init__(outbound, "tls", f"{reason}: {message}")
        self.reason = reason


def tls_verification(params: tuple[tuple[str, str], ...]) -> bool:
    """Whether to verify the server certificate; ConfigRefused for unknown or conflicting values."""
    try:
        return not insecure_claimed(value for key, value in params if key in INSECURE_KEYS)
    except ValueError as exc:
        if str(exc) == "invalid":
            raise ConfigRefused("certificate verification parameters must be booleans") from None
        raise ConfigRefused("certificate verification parameters disagree") from None


def ca_path(params: tuple[tuple[str, str], ...]) -> str:
    """The node's CA file (its ``ca`` parameter), "" when it names none; ConfigRefused when they disagree."""
    paths = {value.strip() for key, value in params if key == CA_KEY and value.strip()}
    if len(paths) > 1:
        raise ConfigRefused("the node's ca parameters name different files")
    return paths.pop() if paths else ""


class _BadCa(Exception):
    """A CA file unfit to verify with (the caller names the node)."""


def _file_version(path: str | None) -> tuple[str, int, int] | None:
    """(path, mtime, size): what tells a replaced file from the one a context was built with."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None  # the store the context falls back to, or the read below, says what is wrong
    return (path, st.st_mtime_ns, st.st_size)


def client_context(verify: bool, alpn: Sequence[str], ca: str, node: str, now: float) -> ssl.SSLContext:
    """The context ``node`` dials with: shared by every dial with the same verification, ALPN
    and trust store, and rebuilt when that store's file changes (a node's ``ca`` file, or the
    system's default bundle), so building it stays off the per-dial path while a replaced
    file still counts from the first dial :data:`TRUST_STORE_RECHECK` seconds later (``now``
    on the dialler's clock). An unusable ``ca`` file is ConfigRefused."""
    try:
        return _shared_context(verify, tuple(alpn), ca, _store_version(ca, now))
    except _BadCa as exc:
        raise ConfigRefused(f"{node}: {exc}") from None


# trust store -> (when its file was looked at, its version then); the system's store is keyed by
# the variables that can point it elsewhere, so setting SSL_CERT_FILE counts at once
_store_seen: dict[tuple[str, str | None, str | None], tuple[float, tuple[object, ...]]] = {}


def _store_version(ca: str, now: float) -> tuple[object, ...]:
    """What identifies the trust store ``ca`` ("": the system's) as of its last look."""
    key = (ca, None, None) if ca else ("", os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    seen = _store_seen.get(key)
    if seen is not None and seen[0] <= now < seen[0] + TRUST_STORE_RECHECK:
        return seen[1]
    if ca:
        version: tuple[object, ...] = ("node", _file_version(ca) or (ca, 0, 0))
    else:
        paths = ssl.get_default_verify_paths()  # SSL_CERT_FILE / SSL_CERT_DIR or the system's
        version = ("system", _file_version(paths.cafile), paths.capath)
    if len(_store_seen) >= CONTEXT_CACHE:
        _store_seen.clear()
    _store_seen[key] = (now, version)
    return version


_ServerKey = tuple[tuple[str, int], str]  # (server address, server name)
_offered: contextvars.ContextVar[ssl.SSLSession | None] = contextvars.ContextVar(
    "honk_tls_offer", default=None
)


@dataclass(slots=True)
class _Resumption:
    """What one server's next handshake resumes from."""

    session: ssl.SSLSession | None = None  # offered until the server refuses it
    harvest: ssl.SSLObject | None = None  # a full handshake whose ticket (if any) is taken at the next offer
    next_harvest: float = 0.0  # clock time before which no connection is kept to harvest
    # a full handshake handed to the relay engine, whose session is taken when its flow ends
    # (see learn_relayed); since when it waits
    relayed: ssl.SSLObject | None = None
    relayed_since: float = 0.0


class _ResumingContext(ssl.SSLContext):
    """A client context that keeps, per server, the TLS 1.3 session to resume.

    The event loop builds each connection's ``SSLObject`` through :meth:`wrap_bio`
    with no way to pass a session, so :func:`tls_connect` sets the one to offer in
    a context variable around the dial, and :meth:`wrap_bio` picks it up.

    A TLS 1.3 ticket arrives after the handshake, so a full handshake is kept
    (:meth:`learn`) and its session taken at the next dial (:meth:`offer`).
    Taking a session copies it, certificate and all, which costs about as much
    as a third of a handshake: so it is done once per full handshake, and a
    server that sent no ticket is not asked again for :data:`HARVEST_RETRY`
    seconds. A session the server accepted is offered again until it refuses.
    """

    def __init__(self, protocol: int = ssl.PROTOCOL_TLS_CLIENT) -> None:
        super().__init__()  # the protocol is taken by ``SSLContext.__new__``
        self._sessions: OrderedDict[_ServerKey, _Resumption] = OrderedDict()

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        if session is None and not server_side:
            session = _offered.get()
        return super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)

    def offer(self, key: _ServerKey, now: float) -> ssl.SSLSession | None:
        """The session to resume with ``key``'s server, or None for a full handshake."""
        entry = self._sessions.get(key)
        if entry is None:
            return None
        if entry.harvest is not None:
            fresh, entry.harvest = entry.harvest.session, None
            if fresh is not None and fresh.has_ticket:
                entry.session = fresh
            else:
                entry.next_harvest = now + HARVEST_RETRY
        return entry.session

    def _entry(self, key: _ServerKey) -> _Resumption:
        """``key``'s entry, made (the least recently used one goes beyond RESUMED_SERVERS) or
        moved to the most recent end."""
        entry = self._sessions.get(key)
        if entry is None:
            entry = self._sessions[key] = _Resumption()
            if len(self._sessions) > RESUMED_SERVERS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(key)
        return entry

    def learn(self, key: _ServerKey, connection: ssl.SSLObject, now: float) -> None:
        """Note how a handshake with ``key``'s server went: a full TLS 1.3 one may be resumed from."""
        entry = self._entry(key)
        if connection.session_reused:
            return
        entry.session = None  # refused (or never had one): it is not offered again
        if entry.harvest is None and now >= entry.next_harvest and connection.version() == "TLSv1.3":
            entry.harvest = connection

    def learn_relayed(
        self, key: _ServerKey, connection: ssl.SSLObject, now: float, *, reused: bool, tls13: bool
    ) -> bool:
        """:meth:`learn` for a connection the relay engine will drive (:func:`tls_handshake`, or
        the engine's own handshake); ``reused`` and ``tls13`` tell what the handshake was (the
        caller read them before the handover: the connection is the engine's worker's then).

        Such a connection is never kept as ``harvest``: :meth:`offer` reads ``.session`` on the
        loop's thread, while the compiled engine's worker may be inside OpenSSL with the same
        ``SSL*``, a data race. Its session is taken instead either now, before the handover,
        when a ticket already came with the server's Finished (:meth:`take_relayed`), or
        after its flow ended (the framing's release hook). True when the caller should try.
        """
        entry = self._entry(key)
        if reused:
            return False
        entry.session = None
        if now < entry.next_harvest or not tls13 or entry.harvest is not None:
            return False
        # one connection waits for its flow to end at a time; one that waited a whole retry
        # period (a long flow) gives way to a newer one
        if entry.relayed is not None and now < entry.relayed_since + HARVEST_RETRY:
            return False
        entry.relayed, entry.relayed_since = connection, now
        return True

    def take_relayed(self, key: _ServerKey, connection: ssl.SSLObject, now: float, *, final: bool) -> bool:
        """Take ``connection``'s session if it holds a ticket; ``final``: its flow ended, so
        without a ticket the server is not asked again for :data:`HARVEST_RETRY`. Call it only
        while nothing else drives the connection. True when a session was taken (or it is no
        longer this server's candidate)."""
        entry = self._sessions.get(key)
        if entry is None or entry.relayed is not connection:
            return True
        fresh = connection.session
        if fresh is not None and fresh.has_ticket:
            entry.session = fresh
            entry.relayed = None
            return True
        if final:
            entry.relayed = None
            entry.next_harvest = now + HARVEST_RETRY
        return False


def _new_context(cadata: str | None) -> _ResumingContext:
    """What ``ssl.create_default_context`` makes for a client, as a :class:`_ResumingContext`."""
    tlsverify.prefer_builtin_keys()  # a server's EC certificate key decodes 4 x faster (once per process)
    context = _ResumingContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name by default
    if cadata is None:
        context.load_default_certs()
    else:
        context.load_verify_locations(cadata=cadata)
    return context


@functools.lru_cache(maxsize=CONTEXT_CACHE)
def _shared_context(
    verify: bool, alpn: tuple[str, ...], ca: str, store: tuple[object, ...]
) -> ssl.SSLContext:
    if ca:
        try:
            context = _new_context(_read_ca(ca))
        except (ValueError, ssl.SSLError):  # text without a certificate, or a broken one
            raise _BadCa(f"the CA file {ca!r} holds no PEM certificate") from None
    else:
        context = _new_context(None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:  # the trust is loaded and never changes after this: its verified chains may be kept
        tlsverify.install(context, VERIFY_CACHE_TTL)
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def _read_ca(path: str) -> str:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CA_BYTES + 1)
    except OSError as exc:
        raise _BadCa(f"cannot read the CA file {path!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_CA_BYTES:
        raise _BadCa(f"the CA file {path!r} is over {MAX_CA_BYTES} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if not text.strip():  # create_default_context would quietly take the system store for ""
        raise _BadCa(f"the CA file {path!r} holds no PEM certificate")
    return text


def handshake_failed(outbound: str, report: HandshakeReport, detail: str, err: int) -> TlsFailed:
    """The typed failure of a handshake the relay engine drove (``Engine.hs_connect``): as
    :func:`_typed` types Python's own. ``detail``: OpenSSL's reason the compiled engine gave,
    ``err``: the socket errno it met (EPROTO: OpenSSL's failure, not the socket's)."""
    if report.error is not None:  # the twin's own exception
        return _classify(outbound, report.error)
    if report.verify_code:
        reason = _VERIFY_REASONS.get(report.verify_code, "certificate-untrusted")
        return TlsFailed(outbound, reason, report.verify_message or "certificate verification failed")
    if err == errno.EPROTO:
        return TlsFailed(outbound, "handshake", detail or "the handshake failed")
    why = "the server closed the connection" if err == errno.ECONNRESET else os.strerror(err)
    return TlsFailed(outbound, "handshake", f"the connection failed during the handshake: {why}")


def _classify(outbound: str, exc: ssl.SSLError) -> TlsFailed:
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = _VERIFY_REASONS.get(exc.verify_code, "certificate-untrusted")
        return TlsFailed(outbound, reason, exc.verify_message or "certificate verification failed")
    return TlsFailed(outbound, "handshake", exc.reason or type(exc).__name__)


@contextlib.contextmanager
def _typed(outbound: str) -> Iterator[None]:
    """A handshake's failures as TlsFailed / DialTimeout of phase ``tls`` (both handshake paths)."""
    try:
        yield
    except TlsFailed:
        raise
    except TimeoutError:
        raise DialTimeout(outbound, "tls", "no TLS handshake before the deadline") from None
    except ssl.SSLError as exc:
        raise _classify(outbound, exc) from None
    except (OSError, HonkError) as exc:
        raise TlsFailed(outbound, "handshake", f"the connection failed during the handshake: {exc}") from None


async def tls_connect(
    sock: socket.socket,
    context: ssl.SSLContext,
    server_name: str,
    clock: Clock,
    deadline: float,
    outbound: str,
) -> StreamConn:
    """TLS over the connected ``sock`` (which it owns from here on, closed on failure).

    With a context from :func:`client_context` the handshake resumes the server's last
    TLS 1.3 session when there is one, and this handshake's session is kept for the next.
    """
    loop = asyncio.get_running_loop()
    resuming = isinstance(context, _ResumingContext)
    token = None
    with _typed(outbound):
        try:
            if resuming:
                key = (sock.getpeername()[:2], server_name)
                token = _offered.set(context.offer(key, clock.now()))
            async with timeout_at(clock, deadline):
                transport, conn = await loop.create_connection(
                    lambda: StreamConn(UpstreamFailed), sock=sock, ssl=context, server_hostname=server_name
                )
        except BaseException:
            sock.close()  # a failed handshake closes its transport; this covers the rest
            raise
        finally:
            if token is not None:
                _offered.reset(token)
    if resuming:
        connection = transport.get_extra_info("ssl_object")
        if connection is not None:
            context.learn(key, connection, clock.now())
    return conn


@dataclass(slots=True)
class TlsConnection:
    """A client handshake finished by :func:`tls_handshake`: the socket, and the ``SSLObject``
    with its two memory BIOs, for the relay engine to drive from here on."""

    sock: socket.socket
    sslobj: ssl.SSLObject
    incoming: ssl.MemoryBIO
    outgoing: ssl.MemoryBIO
    # for the relay to call once it gave the connection back (resumption: the session may be read)
    on_release: Callable[[], None] | None = None
    closed: bool = False  # the server's close_notify came while Python read (receive)

    async def send(self, data: bytes) -> None:
        """``data`` sealed and sent, before the relay owns the connection (a request header)."""
        self.sslobj.write(data)
        await asyncio.get_running_loop().sock_sendall(self.sock, self.outgoing.read())

    async def receive(self) -> bytes:
        """The server's plaintext before the relay owns the connection (a WebSocket upgrade's
        answer): every byte the records read so far hold, b"" once the server closed. Records
        still incomplete stay in ``incoming`` for the relay to finish."""
        loop = asyncio.get_running_loop()
        while True:
            plain = self._pending_plaintext()
            if plain or self.closed:
                return plain
            data = await loop.sock_recv(self.sock, HANDSHAKE_READ)
            if not data:
                return b""
            self.incoming.write(data)

    def _pending_plaintext(self) -> bytes:
        """What the records already in ``incoming`` hold, without reading the socket."""
        plain = bytearray()
        while not self.closed:
            try:
                chunk = self.sslobj.read(HANDSHAKE_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            plain += chunk
        return bytes(plain)


async def tls_handshake(
    sock: socket.socket,
    context: ssl.SSLContext,
    server_name: str,
    clock: Clock,
    deadline: float,
    outbound: str,
) -> TlsConnection:
    """TLS over the connected non-blocking ``sock`` through memory BIOs, for the relay engine.

    The same deadline, resumption and failures as :func:`tls_connect` (``sock`` is closed on
    failure), but no asyncio transport: the result's ``SSLObject`` goes to the relay engine,
    which moves the records itself (:class:`honk.proto.tls_framing.TlsFraming`).
    """
    loop = asyncio.get_running_loop()
    with _typed(outbound):
        try:
            shake = relayed_handshake(context, sock.getpeername()[:2], server_name, clock)
            sslobj, key = shake.sslobj, shake.key
            async with timeout_at(clock, deadline):
                await _drive_handshake(loop, sock, sslobj, shake.incoming, shake.outgoing)
                connection = TlsConnection(sock, sslobj, shake.incoming, shake.outgoing)
                if isinstance(context, _ResumingContext) and context.learn_relayed(
                    key,
                    sslobj,
                    clock.now(),
                    reused=sslobj.session_reused,
                    tls13=sslobj.version() == "TLSv1.3",
                ):
                    _take_early_ticket(connection, outbound)
                    if not context.take_relayed(key, sslobj, clock.now(), final=False):
                        # no ticket yet: its session is taken once the relay has given it back
                        connection.on_release = lambda: context.take_relayed(
                            key, sslobj, clock.now(), final=True
                        )
        except BaseException:
            sock.close()
            raise
    return connection


_handshake_pool: ThreadPoolExecutor | None = None


def _handshake_threads() -> ThreadPoolExecutor:
    global _handshake_pool
    if _handshake_pool is None:
        _handshake_pool = ThreadPoolExecutor(HANDSHAKE_THREADS, thread_name_prefix="honk-tls")
    return _handshake_pool


@dataclass(slots=True)
class RelayedHandshake:
    """A TLS connection for the relay engine to shake hands on (``Engine.hs_connect``): its
    ``SSLObject`` (offering the server's session to resume) and BIOs, and what to learn once the
    engine says how the handshake went (:meth:`opened`)."""

    sslobj: ssl.SSLObject
    incoming: ssl.MemoryBIO
    outgoing: ssl.MemoryBIO
    context: ssl.SSLContext
    key: _ServerKey
    clock: Clock

    def opened(self, reused: bool, tls13: bool, released: Callable[[Callable[[], None]], None]) -> None:
        """The engine finished the handshake: learn it for resumption; a full TLS 1.3 one has its
        session taken once the relay gives the connection back (``released`` sets that hook)."""
        context = self.context
        if not isinstance(context, _ResumingContext):
            return
        sslobj, key, clock = self.sslobj, self.key, self.clock
        if context.learn_relayed(key, sslobj, clock.now(), reused=reused, tls13=tls13):
            released(lambda: context.take_relayed(key, sslobj, clock.now(), final=True))


def relayed_handshake(
    context: ssl.SSLContext, server: tuple[str, int], server_name: str, clock: Clock
) -> RelayedHandshake:
    """A connection to ``server`` (its IP and port) over memory BIOs, offering the server's
    session to resume: what :func:`tls_handshake` and the engine's own handshake start from.
    Raises ``ssl.SSLError`` or ``ValueError`` for a server name OpenSSL refuses."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    key = (server, server_name)
    if isinstance(context, _ResumingContext):
        sslobj = context.wrap_bio(
            incoming, outgoing, server_hostname=server_name, session=context.offer(key, clock.now())
        )
    else:
        sslobj = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    return RelayedHandshake(sslobj, incoming, outgoing, context, key, clock)


async def _drive_handshake(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    sslobj: ssl.SSLObject,
    incoming: ssl.MemoryBIO,
    outgoing: ssl.MemoryBIO,
) -> None:
    hello = True
    while True:
        try:
            if hello:  # the ClientHello costs little: made here
                hello = False
                sslobj.do_handshake()
            else:  # nothing else touches sslobj until this returns (a cancelled wait only closes sock)
                await loop.run_in_executor(_handshake_threads(), sslobj.do_handshake)
            done = True
        except ssl.SSLWantReadError:
            done = False
        if data := outgoing.read():
            await loop.sock_sendall(sock, data)
        if done:
            return
        data = await loop.sock_recv(sock, HANDSHAKE_READ)
        if not data:
            raise ConnectionError("the server closed the connection")
        incoming.write(data)


def _take_early_ticket(connection: TlsConnection, outbound: str) -> None:
    """Read the records that already arrived after the server's Finished (a TLS 1.3 server often
    sends its session tickets with it), so the session can be taken before the handover.

    Only bytes already here are read, and before the request header is sent, so the server
    cannot have said anything yet (Trojan and VLESS servers answer the request)."""
    try:
        data = connection.sock.recv(HANDSHAKE_READ)
    except (BlockingIOError, InterruptedError):
        data = b""
    except OSError:
        return  # the relay meets the error on its first read
    if data:
        connection.incoming.write(data)
    try:
        early = connection.sslobj.read(1)
    except ssl.SSLWantReadError:
        return
    except ssl.SSLError:
        return  # the relay meets a broken record on its own read and types it
    if early:
        raise TlsFailed(outbound, "handshake", "the server sent data before the request")
