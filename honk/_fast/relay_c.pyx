# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled relay engine: a splice(2) forwarder driven by one worker thread.

Design (and why):
  * One :class:`Engine` per event loop owns one worker thread that runs an
    ``epoll_wait`` loop without the GIL. No Python code runs per chunk, per
    readiness event or per flow inside the worker; Python is touched only by
    the asyncio thread when it adds a flow, cancels one, reads counters or
    drains events. One thread (not one per flow) keeps the per-connection cost
    at two ``epoll_ctl`` calls and two non-blocking switches; pipes are taken
    only by directions that turn out to be bulk.
  * Every flow is two fds (client, upstream) registered edge-triggered
    (``EPOLLIN|EPOLLOUT|EPOLLRDHUP|EPOLLET``) once, so readiness never needs
    re-arming: the worker remembers "readable"/"writable" per fd and clears
    them only on ``EAGAIN``.
  * A direction starts "through": ``recv`` into the worker's 16 KiB scratch
    buffer and ``send`` straight on, with no pipe. A short read proves src
    drained (the man page's rule for stream sockets), so, unless the fd
    announced FIN/HUP, the direction waits for the next edge without paying
    the ``EAGAIN`` read; a short send keeps the rest in the direction's buffer.
    Most flows (requests, handshakes, echoes) never need more: no pipe, one
    syscall fewer per read, and 1 KB of memory per idle flow. A read that fills
    the scratch buffer marks a bulk direction, which takes a pipe (from a small
    pool) and splices from then on.
  * A splicing direction moves data src -> pipe -> dst with
    ``splice(SPLICE_F_MOVE|SPLICE_F_NONBLOCK)``: zero-copy. The pipe is
    drained before src is read again, so backpressure is implicit: while dst
    answers ``EAGAIN`` the bytes stay in the pipe, src is not read and its
    receive window closes; ``EPOLLOUT`` on dst resumes the direction.
  * A direction whose splice fails with ``EINVAL`` (an fd type splice cannot
    serve) switches to recv/send through a per-direction 64 KiB buffer, chosen
    automatically per flow; ``add(copy=True)`` forces it (tests). The same
    buffer carries the handshake's preamble, which is written to the upstream
    before anything read from the client.
  * EOF from src becomes ``shutdown(dst, SHUT_WR)`` once the pipe is empty
    (half-close); the other direction keeps flowing. Both directions shut ->
    the flow ends cleanly; the last direction skips its ``shutdown``, since
    ``close`` sends the FIN (only for fds the worker alone owns). Any other error ends the flow with (side, errno):
    side 0 is an error on the client fd, 1 on the upstream fd, 2 local (no
    pipe, no memory). ``EPOLLERR`` is read with ``SO_ERROR`` so that a reset
    is noticed even on a direction that is already finished.
  * Pipes start at the kernel's default 64 KiB (short flows never pay more than
    that). A direction whose splice fills its pipe is bulk: its pipe grows once
    to ``pipe_size`` (default BULK_PIPE_SIZE, 1 MiB) with F_SETPIPE_SZ, which
    moves more per splice and costs less CPU per byte. At most MAX_BIG_PIPES
    grown pipes exist at once (half of the default ``pipe-user-pages-soft``:
    beyond that limit the kernel would shrink every new pipe of the user to
    two pages); a refusal (EPERM, ENOMEM) leaves the default size. Grown pipes
    are closed, not pooled, when their direction ends.
  * A flow does at most 1 MiB per direction per turn before the worker looks
    at other fds again (fairness); remaining work is retried with a zero
    timeout, since edge-triggered readiness is not re-announced.
  * Events go to asyncio through a queue: the worker collects records
    (flow id, kind, a, b, time) during one loop turn and appends them under
    the mutex at the end of the turn, writing the eventfd only when the queue
    was empty. The asyncio thread (``loop.add_reader(eventfd, drain)``) swaps
    the queue out and calls ``listener.relay_event(kind, a, b, t)``. A flow's
    END is published only after the turn that ended it, so the worker never
    touches a slot that the asyncio side may already be reusing.
  * Byte events are coalesced to one per second per flow, the first a second
    after OPEN, plus final totals just before END; FIRST_BYTE carries the totals
    at that moment (the client's bytes are known before the answer). The first
    HALF_CLOSE waits for the flow's next report too (at once when one is due) and
    the second is not sent: that EOF ends the flow, and END says so. A short flow
    is told OPEN, FIRST_BYTE, BYTES, END: each event is a call on the loop's
    thread, and the response deadline and the half-close linger run at most a
    second late (the tracker's timeouts are seconds to minutes). Exact live
    totals are available at any moment from :meth:`Engine.counters` (relaxed
    atomic loads of the worker's counters).
  * Event times come from ``CLOCK_MONOTONIC``: the same clock as
    ``time.monotonic()`` (honk's MonotonicClock). Code driven by a FakeClock
    must not use them; the adapter stamps ``last_activity`` with its own
    clock when it drains an event.
  * Commands into the worker (ADD, CANCEL, SHUTDOWN) go through a command
    queue under the same mutex plus a wake eventfd in the epoll set, written when
    the queue was empty. (Skipping the write while the worker is awake, checking
    the queue around each wait instead, measured slower: Shadowsocks at c=64 fell
    from 0.81-0.84 to 0.65-0.75 x ss-local.)

Framed flows (Shadowsocks AEAD, SIP004; VMess bodies; TLS; ``add(..., framing=)``, ``hs_relay(..., framing)``):
  * The asyncio thread turns the ``ShadowsocksFraming`` into an ``Aead`` record: the
    client direction's subkey and next nonce (the outbound already sent the salt and
    the address chunk) and the master key; the worker owns it from the command on.
    The worker calls OpenSSL's EVP AEAD (AES-GCM, ChaCha20-Poly1305) itself, without
    the GIL: no Python runs per chunk.
  * Both directions copy (never splice). Up: one ``recv`` of up to FRAMED_READ bytes
    (16 maximal chunks) becomes maximal chunks (payload up to 0x3FFF) in the engine's
    output buffer and goes out in one ``send``; the preamble or the handshake's early
    payload is sealed the same way before anything else. Down: one ``recv`` lands
    right after the bytes kept from the last read (an incomplete salt or chunk, at
    most CHUNK_WIRE), every complete chunk is opened, the plaintext goes out in one
    ``send`` and the incomplete rest is kept again. The server's subkey is derived
    (HKDF-SHA1, two or three HMAC-SHA1) once its salt is in. A short send keeps the
    rest in the direction's buffer, as for plain bytes: backpressure is unchanged.
  * What the upstream sends wrong ends the flow as ``END_ERROR`` on side 1 with a
    framing errno (counted, see :meth:`Engine.framing_errors`): FRAMING_AUTH
    (EBADMSG: a tag did not verify; plaintext opened in the same read is dropped),
    FRAMING_PROTOCOL (EPROTO: a length over 0x3FFF), FRAMING_TRUNCATED (ENODATA:
    EOF inside the salt or a chunk). EOF before the first byte, or between chunks,
    is a clean half-close. Client EOF: nothing more is sealed, and the upstream is
    shut (SHUT_WR) once the pending chunks are out.
  * VMess bodies (a ``VmessFraming``, ``framing.engine_keys()``; the outbound already
    sent the request header): up, chunks of a 2-byte length XOR the next two bytes of a
    SHAKE128 stream over the request IV, then the payload sealed with a nonce of a
    16-bit chunk count and IV bytes 2..11 (plain for security none); the client's EOF
    queues the empty chunk before the FIN. Down, the response header first (a sealed
    length and a sealed header under their own AES-128-GCM keys; its first byte must
    echo the request's check byte, else FRAMING_AUTH), then chunks as above with the
    response IV and key (up to VMESS_WIRE on the wire); the empty chunk ends the body
    and anything after it is FRAMING_PROTOCOL. EOF before any response byte is
    FRAMING_SILENT (ENOMSG: v2ray closes on an id it does not know); inside the header
    or a chunk, FRAMING_TRUNCATED. The SHAKE128 sponge (Keccak-f[1600]) is written out
    here because OpenSSL 3.0 cannot squeeze an XOF incrementally.
  * TLS flows (a ``TlsFraming``: Trojan, VLESS or VMess over TLS, handshake and request header
    done in Python over memory BIOs): the worker drives the ``SSL*`` of the framing's
    SSLObject, found behind CPython's ``_ssl._SSLSocket`` and checked (its app data is the
    object, its context's method is this module's libssl) or refused with ValueError. Up:
    a recv of up to FRAMED_READ plaintext, ``SSL_write`` (one record per 16 KiB) into the
    write BIO, ``BIO_read`` into fout, one ``send``; the preamble (the client's early
    bytes) is sealed first. Down: a recv into the read BIO, ``SSL_read`` until it wants
    more, a VLESS response header checked and stripped (version, addons length, addons,
    across records and reads), the rest sent to the client; what SSL wrote meanwhile (a
    KeyUpdate reply) goes upstream. The client's EOF is one ``SSL_shutdown`` (our
    close_notify, then SHUT_WR; the server may still answer); the server's close_notify
    or FIN is a clean half-close unless it came before any plaintext (FRAMING_SILENT:
    Trojan's ``closed-before-data``, VLESS's ``no-response``) or inside the VLESS header
    (FRAMING_TRUNCATED). A record that does not decrypt or parse, an alert, or a wrong
    VLESS version is FRAMING_PROTOCOL; the END event's ``pad`` carries the OpenSSL error
    code (or the version byte) to ``framing.released``, so ``error_for`` can tell them
    apart. A write that finds the upstream gone (EPIPE, ECONNRESET) before any plaintext
    reads what the server sent last: its close (or a reset) alone is the refusal (FRAMING_SILENT).
    FIRST_BYTE is the first plaintext byte (session tickets are no answer). A close_notify
    read with records before it counts once their plaintext is delivered. VMess inside
    (``TlsFraming.inner``, a ``VmessFraming``; hs_connect on TCP + TLS too): client bytes are
    sealed as chunks into fout (past WS_HEADROOM) before they are written, the server's
    plaintext goes into fin behind the kept rest of the last chunk and is opened as on
    plain TCP, at most FRAMED_READ bytes at a time; the client's EOF writes the ending
    chunk before the close_notify (over WebSocket: the chunk only). The engine
    holds the framing (``_framings``) until the flow's END is drained, and Python does
    not touch the SSLObject in between; the worker clears its OpenSSL error queue after
    every failure.
  * TLS handshakes (``hs_connect`` with a ``TlsFraming`` whose handshake has not begun: a
    Trojan, VLESS or VMess node the engine dials itself): once the TCP connect is done the worker
    runs ``SSL_do_handshake`` over the memory BIOs, sending what it writes (a short send
    waits in ``hs_out`` for EPOLLOUT) and feeding what the server sends, without the GIL.
    When it is done, the head (the request header; VMess's as it is, the body after it in
    chunks) and the client's early bytes are sealed
    into the write BIO behind the client's Finished, the SOCKS5 success goes to the client,
    and EV_OPEN's b says what the handshake was (TLS_RESUMED, TLS_13) for Python's session
    cache. A failure (OpenSSL's: FRAMING_PROTOCOL with its error code; the socket's: its
    errno; the server's close: ECONNRESET) replies ``0x01`` as Python's TlsFailed does, and
    before the END is delivered the framing learns how far the handshake got
    (``handshake_reported``: begun, finished, the certificate verification result).
  * Counters count what each socket delivered: plaintext from the client, wire bytes
    (salt, tags, records and all) from the upstream.
  * Memory: two engine-wide FRAMED_BUF buffers (allocated with the first framed flow);
    per flow, the ``Aead`` record, a CHUNK_WIRE buffer once a read ends inside a
    chunk, and the directions' buffers when a send comes up short.

Listener mode (the SOCKS5 CONNECT fast path, :mod:`honk.inbound.fastpath`):
  * WebSocket inside TLS (a ``TlsFraming`` with ``websocket``: Python made the upgrade):
    client bytes are sealed as masked binary frames of at most 64 KiB (the header
    written into the read buffer's headroom, the mask from RAND_bytes), the server's
    plaintext is unframed in place before the inner protocol sees it. The last ping
    of each read is answered with a pong, a close frame ends the server's side as a close_notify does,
    a reserved bit, unknown opcode, masked, oversized or long control frame ends the
    flow (WS_ERR_*, reported to the framing at END like a VLESS version byte). The
    client's EOF sends nothing upstream and leaves its write side open: WebSocket has
    no half-close.
  * ``listen(fd, listener)`` registers a dup of a listening socket; the worker
    accepts (``honk_hs_accept``: non-blocking, close-on-exec, ACCEPT_BURST per readiness) and
    reads each client's first bytes into its ``Hs`` record (epoll tag 3).
  * Only the common case is served in C: a complete greeting offering no-auth
    (answered ``05 00``), then a complete CONNECT with a valid IPv4, IPv6 or
    domain target. What the bytes mean is decided by the ``socks5hs`` kernel
    (``socks5hs.h``, its twin ``socks5hs_py``, held by tests to ``honk.proto.socks5``),
    which also holds the one errno -> reply table; the worker only reads and writes. The worker then
    emits ONE ``EV_REQUEST`` and keeps the client, unread, until the asyncio
    side answers with ONE command: CONNECT (dial this sockaddr with TCP_NODELAY
    and SO_MARK; once connected -- at once when the kernel finished the handshake
    inside connect(), as over loopback (counted, ``connects_at_once``), else on
    EPOLLOUT (a failed connect comes with EPOLLERR, whose SO_ERROR the loop
    reads) -- reply ``05 00`` with getsockname's address, queued
    in the down direction ahead of upstream bytes, emit EV_OPEN and relay; a
    failed connect is replied with the code its errno maps to and ends), RELAY
    (the same with an fd Python dialled) or REJECT (reply a code, close).
    CANCEL with a code during the connect replies that code (the deadline's 0x06:
    deadlines stay on Python's injected clock).
  * Everything else -- another first byte, authentication, BIND, UDP ASSOCIATE,
    malformed or incomplete messages, errors, EOF, a handshake idle for
    HS_HANDOVER_AFTER seconds -- is handed over (EV_HANDOVER: the fd, the bytes
    read and how many reply bytes were sent), so refusals and their log lines
    come from the Python codec alone, with no second implementation in C.
  * ``Hs`` records are freed at the end of the turn that finished them (events of
    that turn may still name them), or by the asyncio side after a handover.

Layout: this file is the byte-moving core (the worker loop, commands, splice and copy
directions, reports, END) and the Python API. The rest is one job per file, included at
the end so the worker calls it as plain C: ``relay_framed.pxi`` (Shadowsocks and VMess
chunk framing), ``relay_tls.pxi`` (TLS records and WebSocket frames), ``relay_listen.pxi``
(listener mode: accept, handshake I/O, the engine's own dial). What a SOCKS5 client's bytes
mean, the replies, and the errno -> reply table are the ``socks5hs`` kernel's (``socks5hs.h``).

Public API (identical in ``relay_py.Engine``): ``Engine(loop=None,
pipe_size=0)``, ``add(client_fd, upstream_fd, listener, preamble=b"",
client_eof=False, copy=False, *, framing=None) -> id`` (takes ownership of both fds),
``cancel(id, code=0) -> bool``, ``counters(id) -> (up, down) | None``, ``close()``,
``framing_errors() -> (auth, protocol)``, ``tls_supported()`` (module level),
``listen(fd, listener) -> lid``, ``unlisten(lid, drop=False)``, ``accepted(lid)``,
``hs_connect(token, ip, port, mark, listener, framing=None, head=b"") -> id``, ``hs_relay(token, fd,
listener, framing=None) -> id``, ``hs_reject(token, code)``,
``active``, ``closed``, ``implementation``, ``wakeups``, ``connects_at_once``. Event kinds and end causes are the
constants of :mod:`honk._fast.relay_py`.
"""

import threading
import weakref

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.errno cimport EAGAIN, EINTR, EINVAL, EMFILE, ENFILE, ENOBUFS, ENOMEM, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memmove, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport close, read, write

from honk._fast import relay_py as _py

cdef extern from *:
    """
    #include <sys/epoll.h>
    #include <sys/eventfd.h>
    #include <sys/ioctl.h>
    #include <sys/socket.h>
    #include <poll.h>
    #include <fcntl.h>
    #include <errno.h>
    #include <string.h>
    #include <unistd.h>
    #include <netinet/in.h>
    #include <netinet/tcp.h>
    #include <arpa/inet.h>
    #include "socks5hs.h"
    static inline uint64_t honk_load64(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void honk_store64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    static inline int honk_nonblock(int fd) { int one = 1; return ioctl(fd, FIONBIO, &one); }
    static inline int honk_so_error(int fd) {
        int err = 0; socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return errno;
        return err;
    }
    static inline int honk_epoll_add(int ep, int fd, uint64_t data, uint32_t events) {
        struct epoll_event ev; ev.events = events; ev.data.u64 = data;
        return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    static inline void honk_epoll_del(int ep, int fd) {
        struct epoll_event ev; epoll_ctl(ep, EPOLL_CTL_DEL, fd, &ev);
    }
    static inline int honk_epoll_mod(int ep, int fd, uint64_t data, uint32_t events) {
        struct epoll_event ev; ev.events = events; ev.data.u64 = data;
        return epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    }
    static inline void honk_send_reply(int fd, int code) {
        char out[HONK_HS_REPLY_MAX]; int n = honk_build_reply(out, code, -1);
        send(fd, out, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    /* an upstream socket for sockaddr addr: non-blocking, TCP_NODELAY, SO_MARK if mark >= 0
       (*mark_denied set on EPERM), connect started. Returns the fd, or -errno. */
    static int honk_dial(const char *addr, int addr_len, int mark, char *mark_denied) {
        const struct sockaddr *sa = (const struct sockaddr *)addr;
        int one = 1, err;
        int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return -errno;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (mark >= 0 && !*mark_denied) {
            if (setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) < 0 && errno == EPERM)
                *mark_denied = 1;
        }
        if (connect(fd, sa, (socklen_t)addr_len) < 0 && errno != EINPROGRESS) {
            err = errno; close(fd); return -err;
        }
        return fd;
    }
    /* 1 when the connect started on fd has already finished (over loopback it often finishes
       within connect() itself), else 0: still in progress, or failed (epoll says which) */
    static inline int honk_connect_done(int fd) {
        struct pollfd p; p.fd = fd; p.events = POLLOUT; p.revents = 0;
        return poll(&p, 1, 0) == 1 && (p.revents & (POLLOUT | POLLERR | POLLHUP)) == POLLOUT;
    }
    /* "host", port of a sockaddr (ip text into host, >= 46 bytes); -1 if not IP */
    static int honk_sockaddr_text(const char *addr, char *host) {
        const struct sockaddr *sa = (const struct sockaddr *)addr;
        if (sa->sa_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
            inet_ntop(AF_INET, &a->sin_addr, host, 46); return ntohs(a->sin_port);
        }
        if (sa->sa_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
            inet_ntop(AF_INET6, &a->sin6_addr, host, 46); return ntohs(a->sin6_port);
        }
        host[0] = 0; return -1;
    }
    /* sockaddr for an IP literal and port into out (28 bytes); returns its length or 0 */
    static int honk_sockaddr(const char *ip, int port, char *out) {
        memset(out, 0, 28);
        struct sockaddr_in *a = (struct sockaddr_in *)out;
        if (inet_pton(AF_INET, ip, &a->sin_addr) == 1) {
            a->sin_family = AF_INET; a->sin_port = htons((uint16_t)port); return sizeof(*a);
        }
        struct sockaddr_in6 *b = (struct sockaddr_in6 *)out;
        if (inet_pton(AF_INET6, ip, &b->sin6_addr) == 1) {
            b->sin6_family = AF_INET6; b->sin6_port = htons((uint16_t)port); return sizeof(*b);
        }
        return 0;
    }
    """
    uint64_t honk_load64(uint64_t* p) nogil
    void honk_store64(uint64_t* p, uint64_t v) nogil
    int honk_nonblock(int fd) nogil
    int honk_so_error(int fd) nogil
    int honk_epoll_add(int ep, int fd, uint64_t data, uint32_t events) nogil
    void honk_epoll_del(int ep, int fd) nogil
    int honk_epoll_mod(int ep, int fd, uint64_t data, uint32_t events) nogil
    void honk_send_reply(int fd, int code) nogil
    int honk_dial(const char* addr, int addr_len, int mark, char* mark_denied) nogil
    int honk_connect_done(int fd) nogil
    int honk_sockaddr_text(const char* addr, char* host) nogil
    int honk_sockaddr(const char* ip, int port, char* out) nogil

    ctypedef union epoll_data_t:
        uint64_t u64
    struct epoll_event:
        uint32_t events
        epoll_data_t data
    int epoll_create1(int flags) nogil
    int epoll_wait(int epfd, epoll_event* events, int maxevents, int timeout) nogil
    int EPOLL_CLOEXEC, EPOLLIN, EPOLLOUT, EPOLLRDHUP, EPOLLERR, EPOLLHUP, EPOLLET, EPOLLEXCLUSIVE
    int eventfd(unsigned int initval, int flags) nogil
    int EFD_NONBLOCK, EFD_CLOEXEC
    ssize_t splice(int fd_in, void* off_in, int fd_out, void* off_out, size_t len, unsigned int flags) nogil
    int SPLICE_F_MOVE, SPLICE_F_NONBLOCK
    int pipe2(int* fds, int flags) nogil
    int fcntl(int fd, int cmd, ...) nogil
    int F_SETPIPE_SZ, F_DUPFD_CLOEXEC, O_NONBLOCK, O_CLOEXEC
    ssize_t recv(int fd, void* buf, size_t n, int flags) nogil
    ssize_t send(int fd, const void* buf, size_t n, int flags) nogil
    int shutdown(int fd, int how) nogil
    int SHUT_WR, MSG_DONTWAIT, MSG_NOSIGNAL
    int EBADMSG, EPROTO, ENODATA, ENOMSG, EIO, EPIPE, ECONNRESET

# the fast path's accept and SOCKS5 handshake, and the errno -> reply table: socks5hs.h
from honk._fast.socks5hs_h cimport (
    HONK_HS_MORE, HONK_HS_HANDOVER, HONK_HS_HOST_MAX, HONK_HS_REPLY_MAX, honk_hs_accept, honk_hs_greeting,
    honk_hs_request, honk_hs_target, honk_reply_code, honk_build_reply,
)


cdef extern from "<openssl/rand.h>" nogil:
    int RAND_bytes(unsigned char* buf, int num)


# Event kinds and end causes: one definition, in the pure-Python twin.
EV_OPEN = _py.EV_OPEN
EV_FIRST_BYTE = _py.EV_FIRST_BYTE
EV_BYTES = _py.EV_BYTES
EV_HALF_CLOSE = _py.EV_HALF_CLOSE
EV_END = _py.EV_END
END_CLEAN = _py.END_CLEAN
END_ERROR = _py.END_ERROR
END_CANCELLED = _py.END_CANCELLED
SIDE_CLIENT = _py.SIDE_CLIENT
SIDE_UPSTREAM = _py.SIDE_UPSTREAM
SIDE_LOCAL = _py.SIDE_LOCAL
EngineClosed = _py.EngineClosed

# The same values as C constants for the worker (checked at import below).
cdef enum:
    K_OPEN = 1
    K_FIRST_BYTE = 2
    K_BYTES = 3
    K_HALF_CLOSE = 4
    K_END = 5
    C_CLEAN = 0
    C_ERROR = 1
    C_CANCELLED = 2
    S_LOCAL = 2
    CMD_ADD = 1
    CMD_CANCEL = 2
    CMD_SHUTDOWN = 3
    # listener mode (see "Listener mode" in the module docstring)
    K_REQUEST = 10
    K_HANDOVER = 11
    K_DROPPED = 12
    K_RESTED = 13
    CMD_LISTEN = 4
    CMD_UNLISTEN = 5
    CMD_CONNECT = 6
    CMD_RELAY = 7
    CMD_REJECT = 8
    HS_GREETING = 1
    HS_REQUEST = 2
    HS_WAITING = 3
    HS_DEAD = 4
    TAG_LST = 2               # epoll data: low bits 0/1 = a flow's side, 2 = Lst*, 3 = Hs*
    TAG_HS = 3

assert (K_OPEN, K_FIRST_BYTE, K_BYTES, K_HALF_CLOSE, K_END) == (
    EV_OPEN, EV_FIRST_BYTE, EV_BYTES, EV_HALF_CLOSE, EV_END)
assert (C_CLEAN, C_ERROR, C_CANCELLED, S_LOCAL) == (END_CLEAN, END_ERROR, END_CANCELLED, SIDE_LOCAL)
assert (K_REQUEST, K_HANDOVER, K_DROPPED, K_RESTED) == (_py.EV_REQUEST, _py.EV_HANDOVER, _py.EV_DROPPED,
                                                     _py.EV_RESTED)
EV_REQUEST = _py.EV_REQUEST
EV_HANDOVER = _py.EV_HANDOVER
EV_DROPPED = _py.EV_DROPPED

DEF BLOCK_BITS = 8                 # 256 flows per block of slots
DEF BLOCK_SIZE = 256
DEF MAX_BLOCKS = 4096              # at most 1,048,576 concurrent flows per engine
DEF MAX_EVENTS = 256               # readiness events taken per epoll_wait
DEF TURN_BUDGET = 1048576          # bytes one direction may move per loop turn
DEF SPLICE_CHUNK = 1048576         # asked per splice into the pipe; the pipe's capacity bounds it
DEF COPY_BUFFER = 65536            # per-direction buffer in copy mode (bytes)
DEF THROUGH_CHUNK = 16384          # a direction's reads go recv -> send through the worker's scratch buffer until one fills it (== sizeof scratch)
DEF POOL_PIPES = 32                # reusable empty pipe pairs kept by the worker (default-size pipes only)
DEF DEFAULT_PIPE = 65536           # the kernel's default pipe capacity; a splice that fills it marks a bulk direction
DEF BULK_PIPE_SIZE = 1048576       # a bulk direction's pipe grows to this: ~30% less CPU/GiB than 64 KiB (fewer splices per byte)
DEF MAX_BIG_PIPES = 32             # grown pipes at once: 32 MiB, half the default pipe-user-pages-soft (64 MiB per user)
DEF REPORT_INTERVAL = 1.0          # seconds between coalesced BYTES events of one flow
DEF DRAIN_ROUNDS = 4               # batches one _drain call delivers before the loop's other callbacks run
DEF EVENT_DEFER = 0.02            # seconds BYTES, FIRST_BYTE and HALF_CLOSE may wait for an urgent event before waking the loop's thread
DEF ACCEPT_BURST = 64              # accepts per listener readiness before other fds get a turn
DEF ACCEPT_BACKOFF = 0.1           # seconds a listener rests after EMFILE/ENFILE/ENOBUFS/ENOMEM instead of spinning
DEF HS_HANDOVER_AFTER = 1.0        # seconds (CLOCK_MONOTONIC) a handshake may idle in the worker; then Python's watchdog

DEF SS_MAX_PAYLOAD = 0x3FFF        # SIP004: a chunk's payload length is capped at 0x3FFF
DEF SS_TAG = 16                    # SIP004: bytes of an AEAD tag
DEF SS_HEAD = 18                   # a chunk's sealed length field: 2 bytes + its tag
DEF SS_OVERHEAD = 34               # bytes a chunk adds to its payload: SS_HEAD + the payload's tag
DEF CHUNK_WIRE = 16417             # the largest chunk on the wire: SS_HEAD + SS_MAX_PAYLOAD + SS_TAG
DEF VMESS_WIRE = 65537             # the largest VMess chunk on the wire: a 2-byte length of up to 0xFFFF bytes
DEF VMESS_HEADER_MAX = 259         # a VMess response header: check, option, command id and length, command body (4 + 255)
DEF FRAMED_READ = 262128           # bytes one framed read asks for: 16 maximal chunks (16 x 0x3FFF)
DEF TLS_BULK_READ = 65536          # a read of this many wire or plaintext bytes (four records) is a bulk direction's
DEF FRAMED_BUF = 327665            # VMESS_WIRE + FRAMED_READ: size of fin (kept bytes, then a read) and of fout

assert HS_HANDOVER_AFTER == _py.HS_HANDOVER_AFTER
assert FRAMED_READ == _py.FRAMED_READ and SS_MAX_PAYLOAD == _py.SS_MAX_PAYLOAD
assert VMESS_HEADER_MAX == _py.VMESS_HEADER_MAX
assert (EBADMSG, EPROTO, ENODATA, ENOMSG) == (
    _py.FRAMING_AUTH, _py.FRAMING_PROTOCOL, _py.FRAMING_TRUNCATED, _py.FRAMING_SILENT)
FRAMING_AUTH = _py.FRAMING_AUTH
FRAMING_PROTOCOL = _py.FRAMING_PROTOCOL
FRAMING_TRUNCATED = _py.FRAMING_TRUNCATED
FRAMING_SILENT = _py.FRAMING_SILENT

DEF TLS_ERR_UNKNOWN = 0x7FFFFFFF  # TlsState.err of a failed read that left OpenSSL's error queue empty
DEF TLS_STAGE_DONE = 3             # TlsState.stage once the response header (if any) is behind
DEF TLS_RESUMED = 1                # EV_OPEN's b for a TLS handshake the worker drove: the session was resumed
DEF TLS_13 = 2                     # ... and TLS 1.3 was spoken
assert TLS_RESUMED == _py.TLS_RESUMED and TLS_13 == _py.TLS_13
DEF WS_SEND_FRAME = 65536          # payload bytes per client frame (honk.proto.websocket.SEND_FRAME)
DEF WS_MAX_FRAME = 16777216        # a larger server frame is refused (honk.proto.websocket.MAX_FRAME_PAYLOAD)
DEF WS_HEADROOM = 14               # the longest client frame header: 2 + an 8-byte length + the mask
DEF WS_MAX_CONTROL = 125           # RFC 6455 5.5: a control frame's payload is at most 125 bytes (TlsState.ws_ctl)
DEF WS_OP_BINARY = 0x2             # RFC 6455 5.2 opcodes: 0x0-0x2 data (continuation, text, binary)
DEF WS_OP_CLOSE = 0x8              # ... 0x8-0xA control
DEF WS_OP_PING = 0x9
DEF WS_OP_PONG = 0xA
DEF WS_ERR_RESERVED = 1            # WS_ERR_*: index + 1 in honk.proto.websocket.ENGINE_ERRORS
DEF WS_ERR_OPCODE = 2
DEF WS_ERR_MASKED = 3
DEF WS_ERR_CONTROL = 4
DEF WS_ERR_TOO_LARGE = 5
DEF WS_PAD = 257                   # END's pad for a WebSocket error: -(WS_PAD + WS_ERR_*), past a VLESS byte's
# for the test that holds these to honk.proto.websocket's (the kernel imports nothing above it)
WS_LIMITS = (WS_SEND_FRAME, WS_MAX_FRAME, WS_MAX_CONTROL)
WS_OPCODES = (WS_OP_BINARY, WS_OP_CLOSE, WS_OP_PING, WS_OP_PONG)
WS_ERRORS = {"reserved-bits": WS_ERR_RESERVED, "bad-opcode": WS_ERR_OPCODE, "masked-server-frame": WS_ERR_MASKED,
             "bad-control-frame": WS_ERR_CONTROL, "frame-too-large": WS_ERR_TOO_LARGE}
cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef int _vec_push(Vec* v, const void* item) noexcept nogil:
    cdef size_t cap
    cdef char* data
    if v.n == v.cap:
        cap = v.cap * 2 if v.cap else 64
        data = <char*>realloc(v.data, cap * v.size)
        if data == NULL:
            return -1
        v.data = data
        v.cap = cap
    memcpy(v.data + v.n * v.size, item, v.size)
    v.n += 1
    return 0


cdef inline void _vec_swap(Vec* a, Vec* b) noexcept nogil:
    cdef Vec t = a[0]
    a[0] = b[0]
    b[0] = t


cdef inline void _vec_init(Vec* v, size_t size) noexcept nogil:
    v.data = NULL
    v.n = 0
    v.cap = 0
    v.size = size


cdef inline void _vec_free(Vec* v) noexcept nogil:
    free(v.data)
    v.data = NULL
    v.n = v.cap = 0


cdef class Engine:
    """One relay worker thread bound to one event loop; see the module docstring."""

    def __cinit__(self):
        self.epfd = -1
        self.wake_fd = -1
        self.event_fd = -1
        self.n_pool = 0
        self.live = NULL
        self.blocks = NULL
        self.free_slots = NULL
        self.fin = NULL
        self.fout = NULL
        self._closed = 1  # until __init__ has everything in place
        _vec_init(&self.cmds, sizeof(Cmd))
        _vec_init(&self.wcmds, sizeof(Cmd))
        _vec_init(&self.events, sizeof(Event))
        _vec_init(&self.spare, sizeof(Event))
        _vec_init(&self.local_events, sizeof(Event))
        self.events_since = -1.0
        _vec_init(&self.again, sizeof(Flow*))
        _vec_init(&self.dirty, sizeof(Flow*))
        _vec_init(&self.hs_dead, sizeof(Hs*))
        _vec_init(&self.lst_all, sizeof(Lst*))
        self.hs_head = NULL
        self.hs_tail = NULL
        self.lst_n = 0

    def __init__(self, loop=None, *, int pipe_size=0):
        import asyncio

        if loop is None:
            loop = asyncio.get_running_loop()
        self.implementation = "compiled"
        self.pipe_size = BULK_PIPE_SIZE if pipe_size == 0 else pipe_size
        self._listeners = {}
        self._lsts = {}
        self._held = {}
        self._framings = {}
        self._handshakes = set()
        self.generation = 1
        self.blocks = <Flow**>calloc(MAX_BLOCKS, sizeof(Flow*))
        if self.blocks == NULL:
            raise MemoryError()
        pthread_mutex_init(&self.lock, NULL)
        self.lock_ready = 1
        self.epfd = epoll_create1(EPOLL_CLOEXEC)
        self.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        self.event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.epfd < 0 or self.wake_fd < 0 or self.event_fd < 0:
            err = errno
            self._release()
            raise OSError(err, "relay engine setup failed")
        if honk_epoll_add(self.epfd, self.wake_fd, 0, EPOLLIN) < 0:
            err = errno
            self._release()
            raise OSError(err, "relay engine setup failed")
        self._loop = weakref.ref(loop)
        loop.add_reader(self.event_fd, self._drain)
        self._closed = 0
        self.running = 1
        self._thread = threading.Thread(target=self._run, name="honk-relay", daemon=True)
        self._thread.start()

    def _run(self):
        with nogil:
            self._worker()

    # -- the asyncio side ------------------------------------------------------------

    @property
    def active(self):
        """Flows added and not yet ended (their END event not yet drained)."""
        return len(self._listeners)

    @property
    def closed(self):
        return bool(self._closed)

    @property
    def wakeups(self):
        """How many times the loop's thread was called to deliver events (see _publish)."""
        return self.n_wakeups

    @property
    def connects_at_once(self):
        """How many of the worker's upstream connects had finished when connect() returned
        (see _hs_start): their flows opened in the same turn."""
        return honk_load64(&self.n_at_once)

    def queued_events(self):
        """Events the worker handed over that the loop's thread has not taken yet."""
        cdef size_t n
        pthread_mutex_lock(&self.lock)
        n = self.events.n
        pthread_mutex_unlock(&self.lock)
        return n

    cdef Flow* _slot(self, uint32_t slot):
        return &self.blocks[slot >> BLOCK_BITS][slot & (BLOCK_SIZE - 1)]

    def add(self, int client_fd, int upstream_fd, listener, bytes preamble=b"",
            bint client_eof=False, bint copy=False, *, framing=None):
        """Relay between two connected stream fds; returns the flow id.

        The engine owns both fds from now on and closes them when the flow
        ends. ``preamble`` is written to the upstream before any byte read
        from the client; ``client_eof`` means the client already sent EOF.
        ``framing`` (a ``ShadowsocksFraming``) makes a framed flow: client bytes
        (the preamble too) are sealed on their way up, upstream bytes opened on
        their way down. ``listener.relay_event(kind, a, b, t)`` receives the
        flow's events on the loop's thread. Raises EngineClosed after ``close()``,
        ValueError for a framing the engine cannot carry.
        """
        cdef Cmd c
        cdef uint32_t slot
        cdef Flow* f
        cdef size_t n = PyBytes_GET_SIZE(preamble)
        cdef bint was_empty
        cdef int rc
        cdef uint64_t one = 1
        cdef Aead* aead = NULL
        cdef TlsState* tls = NULL
        if self._closed:
            raise EngineClosed("relay engine closed")
        if framing is not None and getattr(framing, "kind", None) == "tls":
            tls = _tls_new(framing)
        elif framing is not None:
            aead = _aead_new(framing)
        try:
            slot = self._new_slot()
        except BaseException:
            _aead_free(aead)
            _tls_release(framing, tls)
            raise
        f = self._slot(slot)
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_ADD
        c.flow = f
        c.id = (self.generation << 32) | slot
        self.generation += 1
        c.fd[0] = client_fd
        c.fd[1] = upstream_fd
        c.client_eof = client_eof
        c.copy = copy
        c.aead = aead
        c.tls = tls
        if n:
            c.preamble = <char*>malloc(n)
            if c.preamble == NULL:
                _aead_free(aead)
                _tls_release(framing, tls)
                self._free_slot(slot)
                raise MemoryError()
            memcpy(c.preamble, PyBytes_AS_STRING(preamble), n)
            c.preamble_len = n
        pthread_mutex_lock(&self.lock)
        was_empty = self.cmds.n == 0
        rc = _vec_push(&self.cmds, &c)
        pthread_mutex_unlock(&self.lock)
        if rc < 0:
            free(c.preamble)
            _aead_free(aead)
            _tls_release(framing, tls)
            self._free_slot(slot)
            raise MemoryError()
        if was_empty:
            write(self.wake_fd, &one, 8)
        self._listeners[c.id] = listener
        if tls != NULL:
            self._framings[c.id] = framing
        return c.id

    def framing_errors(self):
        """(auth, protocol): framed flows ended so far because an upstream tag did not verify
        (END errno FRAMING_AUTH), or because the upstream broke the framing (FRAMING_PROTOCOL:
        a length over 0x3FFF; FRAMING_TRUNCATED: EOF inside the salt or a chunk)."""
        return (honk_load64(&self.n_auth), honk_load64(&self.n_proto))

    cdef uint32_t _new_slot(self) except? 0xFFFFFFFF:
        cdef uint32_t slot
        cdef Flow* block
        cdef Flow* f
        if self.n_free:
            self.n_free -= 1
            slot = self.free_slots[self.n_free]
        else:
            if self.n_slots >= <uint32_t>(MAX_BLOCKS * BLOCK_SIZE):
                raise OSError(ENOMEM, "too many concurrent relay flows")
            if self.blocks[self.n_slots >> BLOCK_BITS] == NULL:
                block = <Flow*>calloc(BLOCK_SIZE, sizeof(Flow))
                if block == NULL:
                    raise MemoryError()
                self.blocks[self.n_slots >> BLOCK_BITS] = block
            slot = self.n_slots
            self.n_slots += 1
        f = self._slot(slot)
        # The previous owner of this slot has ended (its END was drained), so the
        # worker does not touch it until it takes the command that starts it.
        honk_store64(&f.bytes_up, 0)
        honk_store64(&f.bytes_down, 0)
        return slot

    cdef object _push(self, Cmd* c):
        cdef bint was_empty
        cdef int rc
        cdef uint64_t one = 1
        pthread_mutex_lock(&self.lock)
        was_empty = self.cmds.n == 0
        rc = _vec_push(&self.cmds, c)
        pthread_mutex_unlock(&self.lock)
        if rc < 0:
            raise MemoryError()
        if was_empty:
            write(self.wake_fd, &one, 8)

    # -- listener mode (asyncio side) ------------------------------------------------------

    def listen(self, int fd, listener):
        """Accept on the listening socket ``fd`` in the worker; returns the listener id.

        The engine works on its own dup of ``fd`` (the caller keeps ``fd``: closing
        it after ``shutdown(SHUT_RD)`` stops the listening at once). ``listener``
        receives ``socks_request(token, src_host, src_port, host, port)``,
        ``socks_handover(fd, data, answered, err, src_host, src_port)`` and
        ``socks_dropped()`` on the loop's thread.
        """
        cdef Cmd c
        cdef Lst* l
        cdef int dup_fd
        if self._closed:
            raise EngineClosed("relay engine closed")
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        if dup_fd < 0:
            raise OSError(errno, "dup of the listening socket failed")
        honk_nonblock(dup_fd)
        l = <Lst*>calloc(1, sizeof(Lst))
        if l == NULL or _vec_push(&self.lst_all, &l) < 0:
            free(l)
            close(dup_fd)
            raise MemoryError()
        self.next_lid += 1
        l.id = self.next_lid
        l.fd = dup_fd
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_LISTEN
        c.lst = l
        self._lsts[l.id] = (listener, <size_t>l)
        self._push(&c)
        return l.id

    def unlisten(self, uint64_t lid, bint drop=False):
        """Stop accepting on listener ``lid``; ``drop`` also closes the clients still in
        their handshake in the worker (each reported by ``socks_dropped``)."""
        cdef Cmd c
        entry = self._lsts.get(lid)
        if entry is None or self._closed:
            return
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_UNLISTEN
        c.lst = <Lst*><size_t>entry[1]
        c.code = 1 if drop else 0
        self._push(&c)

    def accepted(self, uint64_t lid):
        """How many connections listener ``lid`` has accepted so far."""
        entry = self._lsts.get(lid)
        if entry is None or self._closed:  # after close() the Lst records are freed
            return 0
        return honk_load64(&(<Lst*><size_t>entry[1]).accepted)

    cdef Hs* _take_token(self, token) except NULL:
        if self._held.pop(token, None) is None:
            raise ValueError("unknown or already answered handshake token")
        return <Hs*><size_t>token

    def hs_connect(self, token, str ip, int port, int mark, listener, framing=None, bytes head=b""):
        """Answer a REQUEST: dial ``ip``:``port`` (non-blocking, TCP_NODELAY, SO_MARK
        ``mark`` unless -1), reply success with the bound address and relay; a failed
        connect is replied with its errno's code. Returns the flow id (events go to
        ``listener``: EV_OPEN once connected, then the usual ones).

        A proxy node the engine dials itself: ``head`` (its request header) goes to the
        upstream first, then the flow is relayed through ``framing`` (a Shadowsocks or VMess
        framing, as ``add``). ``head`` is sent as it is, except after a Shadowsocks framing
        whose salt is not sent yet: then it is the first chunk's plaintext, and the engine
        sends the encryptor's salt (a fresh framing's: ``framing.new_salt()``) and seals it
        (no Python crypto on the flow's path). A
        ``TlsFraming`` whose handshake has not begun: the worker shakes hands once connected
        (see "TLS handshakes"), then ``head`` is the first plaintext it seals; with VMess
        inside (``TlsFraming.inner``) ``head`` is VMess's sealed request header, written as
        it is ahead of the body's chunks."""
        cdef Cmd c
        cdef char addr[28]
        cdef int alen
        cdef bytes raw = ip.encode("ascii")
        cdef size_t n = PyBytes_GET_SIZE(head)
        if self._closed:
            raise EngineClosed("relay engine closed")
        alen = honk_sockaddr(raw, port, addr)
        if alen == 0:
            raise ValueError(f"not an IP literal: {ip!r}")
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_CONNECT
        memcpy(c.addr, addr, 28)
        c.addr_len = alen
        c.mark = mark
        salt = _unsent_salt(framing)
        tls = framing is not None and getattr(framing, "kind", None) == "tls"
        if tls:
            c.tls = _tls_new(framing, True)
        elif framing is not None:
            c.aead = _aead_new(framing, salt)
        if salt is not None:
            try:
                c.head = _salted_head(c.aead, salt, head, &c.head_len)
            except BaseException:
                _aead_free(c.aead)
                raise
        elif n:
            c.head = <char*>malloc(n)
            if c.head == NULL:
                _aead_free(c.aead)
                _tls_release(framing, c.tls)
                raise MemoryError()
            memcpy(c.head, PyBytes_AS_STRING(head), n)
            c.head_len = n
        try:
            flow_id = self._start_flow(&c, token, listener)
        except BaseException:
            _aead_free(c.aead)
            _tls_release(framing, c.tls)
            free(c.head)
            raise
        if tls:
            self._framings[flow_id] = framing
            self._handshakes.add(flow_id)
        return flow_id

    def hs_relay(self, token, int upstream_fd, listener, framing=None):
        """Answer a REQUEST with a connected upstream fd (the engine owns it from now on):
        reply success and relay, through ``framing`` if given (as ``add``). Returns the flow id."""
        cdef Cmd c
        if self._closed:
            raise EngineClosed("relay engine closed")
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_RELAY
        c.fd[1] = upstream_fd
        if framing is not None and getattr(framing, "kind", None) == "tls":
            c.tls = _tls_new(framing)
        elif framing is not None:
            c.aead = _aead_new(framing)
        try:
            flow_id = self._start_flow(&c, token, listener)
        except BaseException:
            _aead_free(c.aead)
            _tls_release(framing, c.tls)
            raise
        if c.tls != NULL:
            self._framings[flow_id] = framing
        return flow_id

    cdef object _start_flow(self, Cmd* c, token, listener):
        cdef uint32_t slot
        c.hs = self._take_token(token)
        try:
            slot = self._new_slot()
        except BaseException:
            self._held[token] = True
            raise
        c.flow = self._slot(slot)
        c.id = (self.generation << 32) | slot
        self.generation += 1
        try:
            self._push(c)
        except BaseException:
            self._held[token] = True
            self._free_slot(slot)
            raise
        self._listeners[c.id] = listener
        return c.id

    def hs_reject(self, token, int code):
        """Answer a REQUEST with reply ``code`` and close the client."""
        cdef Cmd c
        cdef Hs* h
        if self._closed:
            return
        h = self._take_token(token)
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_REJECT
        c.hs = h
        c.code = code
        try:
            self._push(&c)
        except BaseException:
            self._held[token] = True
            raise

    cdef void _free_slot(self, uint32_t slot):
        cdef uint32_t* grown
        if self.n_free == self.cap_free:
            grown = <uint32_t*>realloc(self.free_slots, (self.cap_free * 2 + 64) * sizeof(uint32_t))
            if grown == NULL:
                return  # the slot is lost, nothing else
            self.free_slots = grown
            self.cap_free = self.cap_free * 2 + 64
        self.free_slots[self.n_free] = slot
        self.n_free += 1

    def cancel(self, uint64_t flow_id, int code=0):
        """End one flow now (END with cause END_CANCELLED); False if it is not live.

        ``code``: a listener-mode flow still connecting replies it to the client (0: none)."""
        cdef Cmd c
        cdef bint was_empty
        cdef uint64_t one = 1
        if self._closed or flow_id not in self._listeners:
            return False
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_CANCEL
        c.flow = self._slot(<uint32_t>(flow_id & 0xFFFFFFFF))
        c.id = flow_id
        c.code = code
        pthread_mutex_lock(&self.lock)
        was_empty = self.cmds.n == 0
        _vec_push(&self.cmds, &c)
        pthread_mutex_unlock(&self.lock)
        if was_empty:
            write(self.wake_fd, &one, 8)
        return True

    def counters(self, uint64_t flow_id):
        """Live (bytes_up, bytes_down) read from the client / upstream so far, or None once ended."""
        cdef Flow* f
        if flow_id not in self._listeners:
            return None
        f = self._slot(<uint32_t>(flow_id & 0xFFFFFFFF))
        return (honk_load64(&f.bytes_up), honk_load64(&f.bytes_down))

    def _drain(self):
        """Deliver queued events (the loop's reader callback for the eventfd).

        While it delivers, ``draining`` tells the worker not to write the eventfd for what it
        appends meanwhile (a system call on its side, a wake-up and a read on this one): the
        queue is looked at again when a batch is done, up to DRAIN_ROUNDS batches; then the
        loop's other callbacks get their turn, and the eventfd is written here for the rest."""
        cdef uint64_t value
        cdef int rounds = 0
        read(self.event_fd, &value, 8)  # before the swap: a later append signals again
        try:
            while rounds < DRAIN_ROUNDS and not (rounds and self._closed):  # a listener may close()
                pthread_mutex_lock(&self.lock)
                _vec_swap(&self.events, &self.spare)
                self.draining = self.spare.n != 0
                pthread_mutex_unlock(&self.lock)
                if self.spare.n == 0:
                    return
                if rounds == 0:
                    self.n_wakeups += 1
                rounds += 1
                self._deliver()
        finally:
            self._drained()

    cdef void _drained(self) noexcept:
        """Stop draining; what the worker appended since the last batch waits for the next call
        (the eventfd is written for it here, as the worker would have)."""
        cdef uint64_t one = 1
        cdef bint more
        self.spare.n = 0
        pthread_mutex_lock(&self.lock)
        more = self.draining and self.events.n != 0
        self.draining = 0
        pthread_mutex_unlock(&self.lock)
        if more and self.event_fd >= 0:
            write(self.event_fd, &one, 8)

    cdef object _deliver(self):
        """Deliver the events in ``spare`` to their listeners, in order; empties it."""
        cdef size_t i
        cdef Event* e
        cdef object listener
        listeners = self._listeners
        for i in range(self.spare.n):
            e = (<Event*>self.spare.data) + i
            if e.kind >= K_REQUEST:
                try:
                    _listener_event(self, e)
                except BaseException as exc:
                    self._report_error(exc)
                continue
            if e.kind == K_END:
                listener = listeners.pop(e.id, None)
                self._free_slot(<uint32_t>(e.id & 0xFFFFFFFF))
                framing = self._framings.pop(e.id, None)
                if framing is not None:  # the worker is done with its SSL*: Python may read it again
                    try:
                        if e.id in self._handshakes:
                            self._handshakes.discard(e.id)
                            _report_handshake(framing)
                        if e.pad > 0:
                            framing.released(_openssl_reason(<unsigned long>e.pad))
                        elif e.pad <= -WS_PAD:
                            framing.released("", None, -e.pad - WS_PAD)
                        elif e.pad < 0:
                            framing.released("", -e.pad - 1)
                        else:
                            framing.released()
                    except BaseException as exc:
                        self._report_error(exc)
            else:
                listener = listeners.get(e.id)
            if listener is None:
                continue
            try:
                listener.relay_event(e.kind, e.a, e.b, e.t)
            except BaseException as exc:  # a listener's bug must not stop the other flows' events
                self._report_error(exc)
        self.spare.n = 0

    def _report_error(self, exc):
        loop = self._loop() if self._loop is not None else None
        if loop is not None and not loop.is_closed():
            loop.call_exception_handler({"message": "relay event listener failed", "exception": exc})

    def close(self):
        """End every flow (END_CANCELLED, delivered before this returns), stop the worker
        and close every fd the engine holds. Idempotent; call it on the loop's thread."""
        cdef Cmd c
        cdef uint64_t one = 1
        cdef Hs* h
        if self._closed:
            return
        self._closed = 1
        memset(&c, 0, sizeof(Cmd))
        c.kind = CMD_SHUTDOWN
        pthread_mutex_lock(&self.lock)
        _vec_push(&self.cmds, &c)
        pthread_mutex_unlock(&self.lock)
        write(self.wake_fd, &one, 8)
        self._thread.join()
        self.running = 0
        loop = self._loop()
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self.event_fd)
        self._drain()
        for token in list(self._held):  # REQUESTs never answered: the worker is gone
            h = <Hs*><size_t>token
            close(h.fd)
            free(h)
        self._held.clear()
        self._release()

    def _release(self):
        cdef int i
        cdef size_t k
        cdef Cmd* c
        cdef Lst* lp
        if self.running:
            return  # the worker still uses all of it
        # Commands the worker never took (none after a normal close) still own fds.
        for k in range(self.cmds.n):
            c = (<Cmd*>self.cmds.data) + k
            if c.kind == CMD_ADD:
                close(c.fd[0])
                close(c.fd[1])
                free(c.preamble)
                _aead_free(c.aead)
                free(c.tls)
            elif c.kind == CMD_CONNECT or c.kind == CMD_RELAY or c.kind == CMD_REJECT:
                close(c.hs.fd)
                free(c.hs)
                if c.kind == CMD_RELAY:
                    close(c.fd[1])
                free(c.tls)
                _aead_free(c.aead)
                free(c.head)
            elif c.kind == CMD_LISTEN:
                pass  # closed with every Lst below
        self.cmds.n = 0
        for k in range(self.lst_all.n):
            lp = (<Lst**>self.lst_all.data)[k]
            if lp.fd >= 0:
                close(lp.fd)
            free(lp)
        _vec_free(&self.lst_all)
        for k in range(self.hs_dead.n):
            free((<Hs**>self.hs_dead.data)[k])
        _vec_free(&self.hs_dead)
        for i in range(self.n_pool):
            close(self.pool[i])
        self.n_pool = 0
        free(self.fin)
        free(self.fout)
        self.fin = self.fout = NULL
        for fd in (self.epfd, self.wake_fd, self.event_fd):
            if fd >= 0:
                close(fd)
        self.epfd = self.wake_fd = self.event_fd = -1
        if self.blocks != NULL:
            for i in range(MAX_BLOCKS):
                free(self.blocks[i])
            free(self.blocks)
            self.blocks = NULL
        free(self.free_slots)
        self.free_slots = NULL
        self.n_free = self.cap_free = 0
        _vec_free(&self.cmds)
        _vec_free(&self.wcmds)
        _vec_free(&self.events)
        _vec_free(&self.spare)
        _vec_free(&self.local_events)
        _vec_free(&self.again)
        _vec_free(&self.dirty)
        if self.lock_ready:
            pthread_mutex_destroy(&self.lock)
            self.lock_ready = 0

    def __dealloc__(self):
        # Reached only when the worker is not running: the thread holds a reference.
        if not self.running:
            self._release()

    # -- the worker --------------------------------------------------------------------

    cdef void _worker(self) noexcept nogil:
        cdef epoll_event evs[MAX_EVENTS]
        cdef int n, i, timeout, side, err
        cdef uint64_t data, value
        cdef uint32_t ev
        cdef double now, due, wait
        cdef Flow* f
        cdef Flow** items
        cdef size_t k, m
        cdef Vec work
        cdef Hs* h
        cdef Lst* l
        cdef int tag
        _vec_init(&work, sizeof(Flow*))
        while True:
            timeout = -1
            due = -1.0
            if self.dirty.n:
                due = (<Flow**>self.dirty.data)[0].next_report
                items = <Flow**>self.dirty.data
                for k in range(1, self.dirty.n):
                    if items[k].next_report < due:
                        due = items[k].next_report
            if self.hs_head != NULL and (due < 0 or self.hs_head.deadline < due):
                due = self.hs_head.deadline
            for k in range(<size_t>self.lst_n):
                if self.lst_ptrs[k].paused_until > 0 and (due < 0 or self.lst_ptrs[k].paused_until < due):
                    due = self.lst_ptrs[k].paused_until
            if self.local_events.n and self.events_since >= 0 and (due < 0 or self.events_since + EVENT_DEFER < due):
                due = self.events_since + EVENT_DEFER  # deferred events (_publish)
            if self.again.n:
                timeout = 0
            elif due >= 0:
                wait = due - _now()
                timeout = 0 if wait <= 0 else <int>(wait * 1000.0) + 1
            n = epoll_wait(self.epfd, evs, MAX_EVENTS, timeout)
            now = _now()
            if n < 0:
                n = 0  # EINTR: just go round
            # Flows whose turn budget ran out: their readiness is not announced again.
            if self.again.n:
                _vec_swap(&self.again, &work)
                items = <Flow**>work.data
                for k in range(work.n):
                    f = items[k]
                    f.queued = 0
                    if not f.ended:
                        self._service(f, now)
                work.n = 0
            for i in range(n):
                data = evs[i].data.u64
                if data == 0:
                    read(self.wake_fd, &value, 8)
                    self._take_commands(now)
                    continue
                tag = <int>(data & 3)
                if tag == TAG_LST:
                    _accept(self, <Lst*>(data & ~(<uint64_t>3)), now)
                    continue
                if tag == TAG_HS:
                    h = <Hs*>(data & ~(<uint64_t>3))
                    if h.state == HS_GREETING or h.state == HS_REQUEST:
                        _hs_read(self, h, now)
                    continue
                f = <Flow*>(data & ~(<uint64_t>3))
                if f.ended:
                    continue  # ended earlier in this turn
                side = <int>(data & 1)
                ev = evs[i].events
                if ev & EPOLLERR:
                    err = honk_so_error(f.fd[side])
                    if err:
                        self._end(f, C_ERROR, (side << 16) | err, now)
                        continue
                if ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR):
                    f.readable[side] = 1
                if ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR):
                    f.rdhup[side] = 1
                if ev & (EPOLLOUT | EPOLLHUP | EPOLLERR):
                    f.writable[side] = 1
                self._service(f, now)
            # Handshakes idle for HS_HANDOVER_AFTER go to Python, whose watchdog runs on the
            # injected clock.
            while self.hs_head != NULL and self.hs_head.deadline <= now:
                _hs_release(self, self.hs_head, K_HANDOVER)
            # Listeners resting after EMFILE & co go back to accepting.
            for k in range(<size_t>self.lst_n):
                l = self.lst_ptrs[k]
                if l.paused_until > 0 and l.paused_until <= now:
                    l.paused_until = 0
                    if l.fd >= 0:
                        honk_epoll_add(self.epfd, l.fd, (<uint64_t>l) | TAG_LST, EPOLLIN | EPOLLEXCLUSIVE)
            if self.stopping:
                while self.live != NULL:
                    self._end(self.live, C_CANCELLED, 0, now)
                while self.hs_head != NULL:
                    _hs_release(self, self.hs_head, K_DROPPED)
            # Coalesced byte reports that are due; ended flows leave the list now,
            # before their END is published (after which their slot may be reused).
            if self.dirty.n:
                items = <Flow**>self.dirty.data
                m = 0
                for k in range(self.dirty.n):
                    f = items[k]
                    if f.ended:
                        continue
                    if f.next_report <= now:
                        f.dirty = 0
                        self._report(f, now)
                        if f.half_pending:
                            self._emit(f, K_HALF_CLOSE, f.half_pending - 1, 0, now)
                            f.half_pending = 0
                        continue
                    items[m] = f
                    m += 1
                self.dirty.n = m
            if self.again.n:
                items = <Flow**>self.again.data
                m = 0
                for k in range(self.again.n):
                    if not items[k].ended:
                        items[m] = items[k]
                        m += 1
                self.again.n = m
            self._publish(now)
            # Handshakes answered this turn: no event of this turn names them any more.
            for k in range(self.hs_dead.n):
                free((<Hs**>self.hs_dead.data)[k])
            self.hs_dead.n = 0
            if self.stopping:
                break
        _vec_free(&work)

    cdef void _take_commands(self, double now) noexcept nogil:
        cdef size_t k
        cdef int lk
        cdef Cmd* c
        pthread_mutex_lock(&self.lock)
        _vec_swap(&self.cmds, &self.wcmds)
        pthread_mutex_unlock(&self.lock)
        for k in range(self.wcmds.n):
            c = (<Cmd*>self.wcmds.data) + k
            if c.kind == CMD_ADD:
                self._add(c, now)
            elif c.kind == CMD_CANCEL:
                if c.flow.id == c.id and not c.flow.ended:
                    c.flow.fail_code = c.code
                    self._end(c.flow, C_CANCELLED, 0, now)
            elif c.kind == CMD_SHUTDOWN:
                self.stopping = 1
                for lk in range(self.lst_n):
                    if self.lst_ptrs[lk].fd >= 0:
                        _unlisten(self, self.lst_ptrs[lk], 0, now)
            elif c.kind == CMD_CONNECT or c.kind == CMD_RELAY:
                _hs_start(self, c, now)
            elif c.kind == CMD_REJECT:
                _hs_reject(self, c.hs, c.code)
            elif c.kind == CMD_LISTEN:
                # EPOLLEXCLUSIVE: a connection wakes one of the engines accepting on the socket, not all
                # (honk.inbound.fastpath.FASTPATH_WORKERS); so the listener is only ever added and deleted
                if honk_epoll_add(self.epfd, c.lst.fd, (<uint64_t>c.lst) | TAG_LST, EPOLLIN | EPOLLEXCLUSIVE) < 0:
                    close(c.lst.fd)
                    c.lst.fd = -1
                elif self.lst_n < 64:
                    self.lst_ptrs[self.lst_n] = c.lst
                    self.lst_n += 1
            elif c.kind == CMD_UNLISTEN:
                _unlisten(self, c.lst, c.code, now)
        self.wcmds.n = 0

    cdef void _add(self, Cmd* c, double now) noexcept nogil:
        cdef Flow* f = c.flow
        cdef uint64_t up = f.bytes_up
        cdef uint64_t down = f.bytes_down
        cdef int di
        memset(f, 0, sizeof(Flow))
        f.bytes_up = up
        f.bytes_down = down
        f.id = c.id
        f.fd[0] = c.fd[0]
        f.fd[1] = c.fd[1]
        for di in range(2):
            f.d[di].pr = -1
            f.d[di].pw = -1
            f.d[di].copy = c.copy
        f.d[0].buf = c.preamble
        f.d[0].len = c.preamble_len
        f.d[0].cap = c.preamble_len
        f.d[0].src_eof = c.client_eof
        f.aead = c.aead
        f.tls = c.tls
        # link into the live list first: _end unlinks
        f.next = self.live
        if self.live != NULL:
            self.live.prev = f
        self.live = f
        f.next_report = now + REPORT_INTERVAL  # the first BYTES waits its interval too
        self._emit(f, K_OPEN, 0, 0, now)
        if f.aead != NULL and _framed_start(self, f, now) < 0:
            return
        if f.tls != NULL and _tls_start(self, f, now) < 0:
            return
        for di in range(2):
            if honk_nonblock(f.fd[di]) < 0:
                self._end(f, C_ERROR, (di << 16) | errno, now)
                return
        for di in range(2):
            if honk_epoll_add(self.epfd, f.fd[di], (<uint64_t>f) | <uint64_t>di,
                              EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET) < 0:
                self._end(f, C_ERROR, (S_LOCAL << 16) | errno, now)
                return
        # Sockets are almost always writable at first; readability is announced by
        # the edge-triggered registration itself.
        f.writable[0] = 1
        f.writable[1] = 1
        self._service(f, now)

    # -- listener mode (worker side) ------------------------------------------------------

    cdef int _take_pipe(self, Dir* d) noexcept nogil:
        cdef int fds[2]
        if self.n_pool >= 2:
            self.n_pool -= 2
            d.pr = self.pool[self.n_pool]
            d.pw = self.pool[self.n_pool + 1]
            return 0
        if pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0:
            return -1
        d.pr = fds[0]
        d.pw = fds[1]
        return 0

    cdef void _drop_pipe(self, Dir* d) noexcept nogil:
        if d.pr < 0:
            return
        if d.big:  # grown pipes go back to the kernel: they count against the user's pipe pages
            d.big = 0
            self.n_big -= 1
            close(d.pr)
            close(d.pw)
        elif d.in_pipe == 0 and self.n_pool <= 2 * POOL_PIPES - 2:
            self.pool[self.n_pool] = d.pr
            self.pool[self.n_pool + 1] = d.pw
            self.n_pool += 2
        else:
            close(d.pr)
            close(d.pw)
        d.pr = d.pw = -1
        d.in_pipe = 0

    cdef void _service(self, Flow* f, double now) noexcept nogil:
        cdef int r0, r1
        if f.connecting:
            if f.tls != NULL and f.tls.handshaking:
                if not f.writable[1] and not f.tls.hs_started:
                    return  # the TCP connect has not finished
                if _tls_handshake(self, f, now) < 0 or f.tls.handshaking:
                    return
            else:
                if not f.writable[1]:
                    return
                _connected(self, f, now)
            if f.ended:
                return
        r0 = self._pump(f, 0, now)
        if r0 < 0:
            return
        r1 = self._pump(f, 1, now)
        if r1 < 0:
            return
        if f.d[0].shut and f.d[1].shut:
            self._end(f, C_CLEAN, 0, now)
            return
        if (r0 > 0 or r1 > 0) and not f.queued:
            f.queued = 1
            _vec_push(&self.again, &f)
        self._report(f, now)

    cdef int _pump(self, Flow* f, int di, double now) noexcept nogil:
        """Move what one direction can move now: 0 = waiting, 1 = budget spent, -1 = ended."""
        cdef Dir* d = &f.d[di]
        cdef int src_side = di
        cdef int dst_side = 1 - di
        cdef int src = f.fd[src_side]
        cdef int dst = f.fd[dst_side]
        cdef ssize_t n
        cdef size_t moved = 0
        cdef char* grown
        cdef uint64_t* counter = &f.bytes_up if di == 0 else &f.bytes_down
        if d.shut:
            return 0
        while True:
            # 1. user-space bytes owed to dst (preamble, copy buffer)
            while d.off < d.len:
                if not f.writable[dst_side]:
                    return 0
                n = send(dst, d.buf + d.off, d.len - d.off, MSG_NOSIGNAL | MSG_DONTWAIT)
                if n < 0:
                    if errno == EAGAIN:
                        f.writable[dst_side] = 0
                        return 0
                    if errno == EINTR:
                        continue
                    self._end(f, C_ERROR, (dst_side << 16) | errno, now)
                    return -1
                d.off += <size_t>n
            if d.len:
                d.off = d.len = 0
                if not d.copy:  # the preamble is sent: give its memory back
                    free(d.buf)
                    d.buf = NULL
                    d.cap = 0
            # 2. bytes in the pipe
            while d.in_pipe:
                if not f.writable[dst_side]:
                    return 0
                n = splice(d.pr, NULL, dst, NULL, d.in_pipe, SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                if n < 0:
                    if errno == EAGAIN:
                        f.writable[dst_side] = 0
                        return 0
                    if errno == EINTR:
                        continue
                    if errno == EINVAL:  # dst cannot take spliced pages: copy from here on
                        if d.cap < d.in_pipe:
                            grown = <char*>realloc(d.buf, d.in_pipe if d.in_pipe > COPY_BUFFER else COPY_BUFFER)
                            if grown == NULL:
                                self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                                return -1
                            d.buf = grown
                            d.cap = d.in_pipe if d.in_pipe > COPY_BUFFER else COPY_BUFFER
                        n = read(d.pr, d.buf, d.in_pipe)
                        if n < 0:
                            self._end(f, C_ERROR, (S_LOCAL << 16) | errno, now)
                            return -1
                        d.off = 0
                        d.len = <size_t>n
                        d.in_pipe -= <size_t>n
                        d.copy = 1
                        self._drop_pipe(d)
                        break
                    self._end(f, C_ERROR, (dst_side << 16) | errno, now)
                    return -1
                d.in_pipe -= <size_t>n
            if d.len:
                continue  # bytes recovered from the pipe go out first
            # 3. EOF from src: forward it once everything before it is out
            if d.src_eof:
                # The flow's last open direction needs no shutdown: _end's close() sends the
                # FIN (dst has nothing unread: its own EOF came first). Not for fds dup'ed from
                # asyncio transports, whose close() may not be the last reference.
                if (not (f.owned and f.d[1 - di].shut) and not (di == 0 and f.tls != NULL and f.tls.ws)
                        and shutdown(dst, SHUT_WR) < 0):
                    self._end(f, C_ERROR, (dst_side << 16) | errno, now)
                    return -1
                d.shut = 1
                self._drop_pipe(d)
                if not f.d[1 - di].shut:  # the last direction's EOF ends the flow: its END says it
                    self._half_closed(f, di, now)
                return 0
            if not f.readable[src_side]:
                return 0
            if moved >= TURN_BUDGET:
                return 1
            # 4. read src
            if f.aead != NULL or f.tls != NULL:  # framed: after room for a kept partial chunk (see _framed)
                n = recv(src, self.fin + VMESS_WIRE, FRAMED_READ, MSG_DONTWAIT)
            elif d.copy:
                if _reserve(self, f, d, COPY_BUFFER, now) < 0:
                    return -1
                n = recv(src, d.buf, d.cap, MSG_DONTWAIT)
                if n > 0:
                    d.off = 0
                    d.len = <size_t>n
            elif d.pr < 0:
                n = recv(src, self.scratch, THROUGH_CHUNK, MSG_DONTWAIT)
                if n > 0:
                    # counted before it is sent on: whoever sees the bytes arrive sees them counted
                    moved += <size_t>n
                    self._took(f, di, counter, <size_t>n, now)
                    if self._pass_through(f, di, <size_t>n, now) < 0:
                        return -1
                    continue
            else:
                n = splice(src, NULL, d.pw, NULL, SPLICE_CHUNK, SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                if n > 0:
                    d.in_pipe = <size_t>n
                    if n >= DEFAULT_PIPE and not d.grow_tried:
                        # a bulk direction: a bigger pipe moves more per splice. The kernel
                        # may refuse (pipe-user-pages-soft/-hard, pipe-max-size): keep 64 KiB.
                        d.grow_tried = 1
                        if self.pipe_size > DEFAULT_PIPE and self.n_big < MAX_BIG_PIPES:
                            if fcntl(d.pw, F_SETPIPE_SZ, self.pipe_size) > 0:
                                d.big = 1
                                self.n_big += 1
            if n > 0:
                moved += <size_t>n
                self._took(f, di, counter, <size_t>n, now)
                if f.aead != NULL and _framed(self, f, di, <size_t>n, now) < 0:
                    return -1
                if f.tls != NULL and (_tls_up(self, f, <size_t>n, now) if di == 0 else _tls_down(self, f, <size_t>n, now)) < 0:
                    return -1
                continue
            if n == 0:
                if f.aead != NULL and _framed_eof(self, f, di, now) < 0:
                    return -1
                if f.tls != NULL and _tls_eof(self, f, di, now) < 0:
                    return -1
                d.src_eof = 1
                f.readable[src_side] = 0
                continue
            # the pipe is empty here, so EAGAIN means src has nothing
            if errno == EAGAIN:
                f.readable[src_side] = 0
                return 0
            if errno == EINTR:
                continue
            if errno == EINVAL and not d.copy:  # src cannot splice: copy from here on
                d.copy = 1
                self._drop_pipe(d)
                continue
            self._end(f, C_ERROR, (src_side << 16) | errno, now)
            return -1

    cdef int _pass_through(self, Flow* f, int di, size_t n, double now) noexcept nogil:
        """Send the n bytes just read into scratch on to dst; 0, or -1 if the flow ended.

        A short send keeps the rest in d.buf (sent first on the next turn). A read that
        filled scratch marks a bulk direction, which takes a pipe and splices from now on;
        a shorter one drained src (unless its FIN was announced: then read on to EOF).
        """
        cdef Dir* d = &f.d[di]
        if self._send_rest(f, di, self.scratch, n, now) < 0:
            return -1
        if n == THROUGH_CHUNK:
            if self._take_pipe(d) < 0:
                d.copy = 1  # no descriptor for a pipe: a bulk direction copies rather than ends its flow
        elif not f.rdhup[di]:
            f.readable[di] = 0
        return 0

    cdef int _send_rest(self, Flow* f, int di, const char* data, size_t n, double now) noexcept nogil:
        """Send n bytes on to dst; a short send keeps the rest in d.buf (sent first next time).
        0, or -1 if the flow ended."""
        cdef Dir* d = &f.d[di]
        cdef int dst_side = 1 - di
        cdef ssize_t sent = send(f.fd[dst_side], data, n, MSG_NOSIGNAL | MSG_DONTWAIT)
        cdef char* grown
        if sent < 0:
            if errno != EAGAIN and errno != EINTR:
                self._end(f, C_ERROR, (dst_side << 16) | errno, now)
                return -1
            sent = 0
        if <size_t>sent < n:
            f.writable[dst_side] = 0
            if d.cap < n - <size_t>sent:
                grown = <char*>realloc(d.buf, n - <size_t>sent)
                if grown == NULL:
                    self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                    return -1
                d.buf = grown
                d.cap = n - <size_t>sent
            memcpy(d.buf, data + sent, n - <size_t>sent)
            d.off = 0
            d.len = n - <size_t>sent
        return 0

    # -- framed flows (Shadowsocks AEAD, SIP004) --------------------------------------------

    cdef inline void _took(self, Flow* f, int di, uint64_t* counter, size_t n, double now) noexcept nogil:
        """n bytes read from side di: counted, and the first from the upstream announced."""
        honk_store64(counter, counter[0] + <uint64_t>n)
        if di == 1 and not f.first_down and f.tls == NULL:  # TLS: at its first plaintext byte
            f.first_down = 1
            self._emit(f, K_FIRST_BYTE, <int64_t>f.bytes_up, <int64_t>f.bytes_down, now)

    cdef int _owe(self, Flow* f, int di, const char* data, size_t n, double now) noexcept nogil:
        """Send n bytes on to direction di's dst, behind what it already owes. 0, or -1 if ended."""
        cdef Dir* d = &f.d[di]
        if d.off < d.len or not f.writable[1 - di]:
            return self._append(f, d, data, n, now)
        return self._send_rest(f, di, data, n, now)

    cdef int _append(self, Flow* f, Dir* d, const char* data, size_t n, double now) noexcept nogil:
        """Queue n bytes behind what d owes its dst. 0, or -1 if the flow ended for want of memory."""
        if d.off:
            memmove(d.buf, d.buf + d.off, d.len - d.off)
            d.len -= d.off
            d.off = 0
        if _reserve(self, f, d, d.len + n, now) < 0:
            return -1
        memcpy(d.buf + d.len, data, n)
        d.len += n
        return 0

    cdef void _report(self, Flow* f, double now) noexcept nogil:
        cdef uint64_t up = f.bytes_up
        cdef uint64_t down = f.bytes_down
        if up == f.rep_up and down == f.rep_down:
            return
        if now >= f.next_report:
            f.rep_up = up
            f.rep_down = down
            f.next_report = now + REPORT_INTERVAL
            self._emit(f, K_BYTES, <int64_t>up, <int64_t>down, now)
        else:
            self._report_later(f)

    cdef void _report_later(self, Flow* f) noexcept nogil:
        """Put f on the "report later" list (once): the worker looks at it when its report is due."""
        if not f.dirty:
            f.dirty = 1
            _vec_push(&self.dirty, &f)

    cdef void _half_closed(self, Flow* f, int di, double now) noexcept nogil:
        """The first direction's EOF went through: HALF_CLOSE goes out with the flow's next
        report (at once when one is due), so a flow that ends within its report interval is
        told only its END, which says both."""
        if now >= f.next_report:
            self._emit(f, K_HALF_CLOSE, di, 0, now)
            return
        f.half_pending = <uint8_t>(di + 1)
        self._report_later(f)

    cdef void _end(self, Flow* f, int cause, int side_errno, double now) noexcept nogil:
        """End a flow: close its fds, recycle its pipes, publish final totals and END.

        ``side_errno`` is ``(side << 16) | errno`` for C_ERROR (0 otherwise).
        """
        cdef int di
        cdef int32_t pad
        cdef Event e
        if (cause == C_ERROR and f.tls != NULL and (side_errno >> 16) == 1 and not f.tls.got_any
                and not f.tls.handshaking and ((side_errno & 0xFFFF) == EPIPE or (side_errno & 0xFFFF) == ECONNRESET)
                and _tls_refused(self, f)):
            side_errno = (1 << 16) | ENOMSG  # the write only found out later: the server refused first
            honk_store64(&self.n_proto, self.n_proto + 1)
        f.ended = 1
        if f.connecting and f.fd[0] >= 0:  # listener mode: the client still waits for its reply
            if cause == C_ERROR:
                if f.tls != NULL and f.tls.hs_started:  # a failed TLS handshake, as Python's TlsFailed
                    honk_send_reply(f.fd[0], 1)
                elif (side_errno >> 16) == 1:
                    honk_send_reply(f.fd[0], honk_reply_code(side_errno & 0xFFFF))
                elif (side_errno >> 16) == S_LOCAL:
                    honk_send_reply(f.fd[0], 1)
            elif cause == C_CANCELLED and f.fail_code:
                honk_send_reply(f.fd[0], f.fail_code)
        for di in range(2):
            if f.fd[di] >= 0:
                # An fd dup'ed from an asyncio transport may share its file with a descriptor
                # that is still open, which would keep the epoll entry alive after close().
                if not f.owned:
                    honk_epoll_del(self.epfd, f.fd[di])
                close(f.fd[di])
                f.fd[di] = -1
            self._drop_pipe(&f.d[di])
            free(f.d[di].buf)
            f.d[di].buf = NULL
        _aead_free(f.aead)
        f.aead = NULL
        pad = 0
        if f.tls != NULL:  # the SSL* is Python's again once this END is published
            if f.tls.err:
                pad = <int32_t>(f.tls.err & 0x7FFFFFFF)
            elif f.tls.has_bad_version:
                pad = -1 - <int32_t>f.tls.bad_version
            elif f.tls.ws_error:
                pad = -WS_PAD - <int32_t>f.tls.ws_error
            free(f.tls.hs_out)
            _aead_free(f.tls.inner)
            free(f.tls)
            f.tls = NULL
        if f.prev != NULL:
            f.prev.next = f.next
        else:
            self.live = f.next
        if f.next != NULL:
            f.next.prev = f.prev
        f.prev = f.next = NULL
        self._emit(f, K_BYTES, <int64_t>f.bytes_up, <int64_t>f.bytes_down, now)
        e.id = f.id
        e.kind = K_END
        e.pad = pad  # TLS flows: what ended it, for TlsFraming.released (see _drain)
        e.a = cause
        e.b = side_errno if cause == C_ERROR else 0
        e.t = now
        _vec_push(&self.local_events, &e)
        self.events_urgent = 1

    cdef void _emit(self, Flow* f, int kind, int64_t a, int64_t b, double now) noexcept nogil:
        cdef Event e
        e.id = f.id
        e.kind = kind
        e.pad = 0
        e.a = a
        e.b = b
        e.t = now
        _vec_push(&self.local_events, &e)
        if kind == K_OPEN:
            self.events_urgent = 1

    cdef void _publish(self, double now) noexcept nogil:
        """Hand this turn's events to the loop's thread. Byte counts, first bytes and half-closes
        wait up to EVENT_DEFER for an urgent event (a request, OPEN, END) to ride with: a short
        flow then wakes the loop's thread three times, not four. Their times travel in the events,
        so waiting changes no measurement; order is kept."""
        cdef bint was_empty, wake
        cdef size_t k
        cdef uint64_t one = 1
        cdef Event* items
        if self.local_events.n == 0:
            return
        if not self.events_urgent and not self.stopping:
            if self.events_since < 0:
                self.events_since = now
            if now - self.events_since < EVENT_DEFER:
                return
        self.events_urgent = 0
        self.events_since = -1.0
        pthread_mutex_lock(&self.lock)
        was_empty = self.events.n == 0
        wake = was_empty and not self.draining  # a draining loop's thread looks again itself
        if was_empty:
            _vec_swap(&self.events, &self.local_events)
        else:
            items = <Event*>self.local_events.data
            for k in range(self.local_events.n):
                _vec_push(&self.events, items + k)
            self.local_events.n = 0
        pthread_mutex_unlock(&self.lock)
        if wake:
            write(self.event_fd, &one, 8)


# The framings and the listener mode, each in its own file (included: one compiled module,
# so the worker calls them as C without the GIL).
include "relay_framed.pxi"
include "relay_tls.pxi"
include "relay_listen.pxi"
