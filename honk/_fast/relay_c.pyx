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
    ``accept4``s (non-blocking, close-on-exec, ACCEPT_BURST per readiness) and
    reads each client's first bytes into its ``Hs`` record (epoll tag 3).
  * Only the common case is served in C: a complete greeting offering no-auth
    (answered ``05 00``), then a complete CONNECT with a valid IPv4, IPv6 or
    domain target (the same checks as ``honk.proto.socks5``). The worker then
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
    /* the SOCKS5 reply code for a failed connect: honk.proto.socks5._ERRNO_REPLIES */
    static inline int honk_reply_code(int err) {
        switch (err) {
        case ECONNREFUSED: return 5;
        case ENETUNREACH: case ENETDOWN: return 3;
        case EHOSTUNREACH: case EHOSTDOWN: return 4;
        case ETIMEDOUT: return 6;
        default: return 1;
        }
    }
    /* A SOCKS5 reply into out (>= 22 bytes): BND is fd's local address when fd >= 0
       and getsockname works, else 0.0.0.0:0 (what honk's failures carry). */
    static int honk_build_reply(char *out, int code, int fd) {
        struct sockaddr_storage ss; socklen_t len = sizeof(ss);
        out[0] = 5; out[1] = (char)code; out[2] = 0;
        if (fd >= 0 && getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET6) {
                struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
                out[3] = 4; memcpy(out + 4, &a->sin6_addr, 16); memcpy(out + 20, &a->sin6_port, 2);
                return 22;
            }
            if (ss.ss_family == AF_INET) {
                struct sockaddr_in *a = (struct sockaddr_in *)&ss;
                out[3] = 1; memcpy(out + 4, &a->sin_addr, 4); memcpy(out + 8, &a->sin_port, 2);
                return 10;
            }
        }
        out[3] = 1; memset(out + 4, 0, 6);
        return 10;
    }
    static inline void honk_send_reply(int fd, int code) {
        char out[22]; int n = honk_build_reply(out, code, -1);
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
    static inline int honk_accept(int lfd, char *peer, uint8_t *peer_len) {
        socklen_t len = 28;
        int fd = accept4(lfd, (struct sockaddr *)peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        *peer_len = (uint8_t)(len > 28 ? 28 : len);
        return fd;
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
    static inline void honk_ntop(int af, const void *src, char *dst) { inet_ntop(af, src, dst, 46); }
    """
    uint64_t honk_load64(uint64_t* p) nogil
    void honk_store64(uint64_t* p, uint64_t v) nogil
    int honk_nonblock(int fd) nogil
    int honk_so_error(int fd) nogil
    int honk_epoll_add(int ep, int fd, uint64_t data, uint32_t events) nogil
    void honk_epoll_del(int ep, int fd) nogil
    int honk_epoll_mod(int ep, int fd, uint64_t data, uint32_t events) nogil
    int honk_reply_code(int err) nogil
    int honk_build_reply(char* out, int code, int fd) nogil
    void honk_send_reply(int fd, int code) nogil
    int honk_dial(const char* addr, int addr_len, int mark, char* mark_denied) nogil
    int honk_connect_done(int fd) nogil
    int honk_accept(int lfd, char* peer, uint8_t* peer_len) nogil
    int honk_sockaddr_text(const char* addr, char* host) nogil
    int honk_sockaddr(const char* ip, int port, char* out) nogil
    void honk_ntop(int af, const void* src, char* dst) nogil
    int AF_INET, AF_INET6

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


# Shadowsocks AEAD (SIP004) on OpenSSL's EVP interface: the worker seals and opens chunks
# with these, without the GIL; nothing here allocates per chunk.
cdef extern from *:
    """
    #include <openssl/crypto.h>
    #include <openssl/err.h>
    #include <openssl/evp.h>
    /* SIP004: nonces are 12-byte little-endian counters, one step per AEAD operation */
    static inline void honk_nonce_next(uint8_t *n) {
        for (int i = 0; i < 12; i++) if (++n[i]) break;
    }
    /* out = seal(in[0:n]) followed by the 16-byte tag; 0, or -1 if OpenSSL failed */
    static int honk_seal(EVP_CIPHER_CTX *ctx, uint8_t *nonce, const uint8_t *in, int n, uint8_t *out) {
        int len;
        if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1) return -1;
        if (n > 0 && EVP_EncryptUpdate(ctx, out, &len, in, n) != 1) return -1;
        if (EVP_EncryptFinal_ex(ctx, out + n, &len) != 1) return -1;
        if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, out + n) != 1) return -1;
        honk_nonce_next(nonce);
        return 0;
    }
    /* out[0:n] = open(in[0:n]), checked against the tag at in[n:n+16]; 0, or -1 if it does not verify */
    static int honk_open(EVP_CIPHER_CTX *ctx, uint8_t *nonce, const uint8_t *in, int n, uint8_t *out) {
        int len;
        uint8_t tag[16];
        memcpy(tag, in + n, 16);
        if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1) return -1;
        if (n > 0 && EVP_DecryptUpdate(ctx, out, &len, in, n) != 1) return -1;
        if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag) != 1) return -1;
        if (EVP_DecryptFinal_ex(ctx, out + n, &len) != 1) return -1;
        honk_nonce_next(nonce);
        return 0;
    }
    /* the subkey for salt: HKDF-SHA1(key=master, salt, info="ss-subkey") of len bytes (RFC 5869:
       one HMAC to extract, one per 20-byte block to expand) */
    /* Algorithms fetched once at import (honk_crypto_init, under the GIL): OpenSSL 3's one-shot
       HMAC() and the EVP_sha1()/EVP_aes_*() handles look the algorithm up in the provider store
       at every use, which cost more than the whole key derivation. NULL: fall back to those. */
    static EVP_MD *honk_sha1_md = NULL;
    static EVP_CIPHER *honk_fetched_ciphers[4] = {NULL, NULL, NULL, NULL};
    static void honk_crypto_init(void) {
        if (honk_sha1_md == NULL) honk_sha1_md = EVP_MD_fetch(NULL, "SHA1", NULL);
        if (honk_fetched_ciphers[1] == NULL) honk_fetched_ciphers[1] = EVP_CIPHER_fetch(NULL, "AES-128-GCM", NULL);
        if (honk_fetched_ciphers[2] == NULL) honk_fetched_ciphers[2] = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
        if (honk_fetched_ciphers[3] == NULL) honk_fetched_ciphers[3] = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
        ERR_clear_error();  /* a provider without one of them leaves an error behind */
    }
    /* HMAC-SHA1 (RFC 2104) of msg under a key of at most 64 bytes, on ctx; 0, or -1 */
    static int honk_hmac_sha1(EVP_MD_CTX *ctx, const uint8_t *key, size_t klen,
                              const uint8_t *msg, size_t mlen, uint8_t *out) {
        const EVP_MD *md = honk_sha1_md != NULL ? honk_sha1_md : EVP_sha1();
        uint8_t pad[64], inner[20];
        unsigned int n = 0;
        int rc = -1;
        size_t i;
        memset(pad, 0x36, 64);
        for (i = 0; i < klen; i++) pad[i] ^= key[i];
        if (EVP_DigestInit_ex(ctx, md, NULL) != 1 || EVP_DigestUpdate(ctx, pad, 64) != 1
            || EVP_DigestUpdate(ctx, msg, mlen) != 1 || EVP_DigestFinal_ex(ctx, inner, &n) != 1) goto done;
        memset(pad, 0x5c, 64);
        for (i = 0; i < klen; i++) pad[i] ^= key[i];
        if (EVP_DigestInit_ex(ctx, md, NULL) != 1 || EVP_DigestUpdate(ctx, pad, 64) != 1
            || EVP_DigestUpdate(ctx, inner, 20) != 1 || EVP_DigestFinal_ex(ctx, out, &n) != 1) goto done;
        rc = 0;
    done:
        OPENSSL_cleanse(pad, sizeof(pad));
        OPENSSL_cleanse(inner, sizeof(inner));
        return rc;
    }
    static int honk_ss_subkey(const uint8_t *master, int len, const uint8_t *salt, uint8_t *out) {
        uint8_t prk[20], block[20], t[20 + 9 + 1];
        int done = 0, prev = 0, take, rc = 0;
        uint8_t i = 1;
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        if (ctx == NULL) return -1;
        if (honk_hmac_sha1(ctx, salt, (size_t)len, master, (size_t)len, prk) < 0) rc = -1;
        while (rc == 0 && done < len) {
            if (prev) memcpy(t, block, 20);
            memcpy(t + prev, "ss-subkey", 9);
            t[prev + 9] = i++;
            if (honk_hmac_sha1(ctx, prk, 20, t, (size_t)(prev + 10), block) < 0) { rc = -1; break; }
            take = len - done < 20 ? len - done : 20;
            memcpy(out + done, block, take);
            done += take;
            prev = 20;
        }
        EVP_MD_CTX_free(ctx);
        OPENSSL_cleanse(prk, sizeof(prk));
        OPENSSL_cleanse(block, sizeof(block));
        OPENSSL_cleanse(t, sizeof(t));
        return rc;
    }
    /* 1 aes-128-gcm, 2 aes-256-gcm, 3 chacha20-ietf-poly1305 */
    static const EVP_CIPHER *honk_ss_cipher(int id) {
        if (id >= 1 && id <= 3 && honk_fetched_ciphers[id] != NULL) return honk_fetched_ciphers[id];
        switch (id) {
        case 1: return EVP_aes_128_gcm();
        case 2: return EVP_aes_256_gcm();
        case 3: return EVP_chacha20_poly1305();
        default: return NULL;
        }
    }
    /* a context for cipher c with 12-byte nonces, keyed when key is not NULL; NULL on failure */
    static EVP_CIPHER_CTX *honk_aead_ctx(const EVP_CIPHER *c, const uint8_t *key, int enc) {
        EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
        if (ctx == NULL) return NULL;
        if (EVP_CipherInit_ex(ctx, c, NULL, NULL, NULL, enc) != 1
            || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1
            || (key != NULL && EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, enc) != 1)) {
            EVP_CIPHER_CTX_free(ctx);
            return NULL;
        }
        return ctx;
    }
    static inline int honk_aead_key(EVP_CIPHER_CTX *ctx, const uint8_t *key, int enc) {
        return EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, enc) == 1 ? 0 : -1;
    }

    /* VMess chunk masks (option M) are a SHAKE128 stream over the body IV, read two bytes at
       a time. OpenSSL 3.0 cannot keep squeezing an XOF, so the sponge is here: Keccak-f[1600]
       (FIPS 202), lanes addressed byte by byte so it does not depend on the host's byte order. */
    #define HONK_SHAKE128_RATE 168
    static const uint64_t honk_keccak_rc[24] = {
        0x0000000000000001ULL, 0x0000000000008082ULL, 0x800000000000808aULL, 0x8000000080008000ULL,
        0x000000000000808bULL, 0x0000000080000001ULL, 0x8000000080008081ULL, 0x8000000000008009ULL,
        0x000000000000008aULL, 0x0000000000000088ULL, 0x0000000080008009ULL, 0x000000008000000aULL,
        0x000000008000808bULL, 0x800000000000008bULL, 0x8000000000008089ULL, 0x8000000000008003ULL,
        0x8000000000008002ULL, 0x8000000000000080ULL, 0x000000000000800aULL, 0x800000008000000aULL,
        0x8000000080008081ULL, 0x8000000000008080ULL, 0x0000000080000001ULL, 0x8000000080008008ULL};
    /* rho offsets and pi destinations along the lane walk that starts at lane 1 */
    static const uint8_t honk_keccak_rho[24] = {
        1, 3, 6, 10, 15, 21, 28, 36, 45, 55, 2, 14, 27, 41, 56, 8, 25, 43, 62, 18, 39, 61, 20, 44};
    static const uint8_t honk_keccak_pi[24] = {
        10, 7, 11, 17, 18, 3, 5, 16, 8, 21, 24, 4, 15, 23, 19, 13, 12, 2, 20, 14, 22, 9, 6, 1};
    static inline uint64_t honk_rotl(uint64_t x, int n) { return (x << n) | (x >> (64 - n)); }
    static void honk_keccak_f(uint64_t *a) {
        uint64_t c[5], t, u;
        for (int round = 0; round < 24; round++) {
            for (int x = 0; x < 5; x++) c[x] = a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20];
            for (int x = 0; x < 5; x++) {
                t = c[(x + 4) % 5] ^ honk_rotl(c[(x + 1) % 5], 1);
                for (int y = 0; y < 25; y += 5) a[y + x] ^= t;
            }
            t = a[1];
            for (int i = 0; i < 24; i++) {
                u = a[honk_keccak_pi[i]];
                a[honk_keccak_pi[i]] = honk_rotl(t, honk_keccak_rho[i]);
                t = u;
            }
            for (int y = 0; y < 25; y += 5) {
                for (int x = 0; x < 5; x++) c[x] = a[y + x];
                for (int x = 0; x < 5; x++) a[y + x] = c[x] ^ (~c[(x + 1) % 5] & c[(x + 2) % 5]);
            }
            a[0] ^= honk_keccak_rc[round];
        }
    }
    static inline uint8_t honk_lane_byte(const uint64_t *a, int i) { return (uint8_t)(a[i >> 3] >> (8 * (i & 7))); }
    static inline void honk_lane_xor(uint64_t *a, int i, uint8_t b) { a[i >> 3] ^= (uint64_t)b << (8 * (i & 7)); }
    /* absorb a short message (less than one rate block) with SHAKE's padding; squeezing starts at *pos = 0 */
    static void honk_shake128_init(uint64_t *a, uint32_t *pos, const uint8_t *msg, int n) {
        memset(a, 0, 25 * sizeof(uint64_t));
        for (int i = 0; i < n; i++) honk_lane_xor(a, i, msg[i]);
        honk_lane_xor(a, n, 0x1F);
        honk_lane_xor(a, HONK_SHAKE128_RATE - 1, 0x80);
        honk_keccak_f(a);
        *pos = 0;
    }
    /* the next two bytes of the stream, big-endian (the rate is even: a pair never straddles blocks) */
    static inline uint16_t honk_shake128_next16(uint64_t *a, uint32_t *pos) {
        if (*pos + 2 > HONK_SHAKE128_RATE) { honk_keccak_f(a); *pos = 0; }
        uint16_t v = (uint16_t)((honk_lane_byte(a, *pos) << 8) | honk_lane_byte(a, *pos + 1));
        *pos += 2;
        return v;
    }
    /* VMess body nonces: a big-endian 16-bit chunk count, then bytes 2..11 of the body IV */
    static inline void honk_vmess_nonce(uint8_t *nonce, uint16_t *count) {
        nonce[0] = (uint8_t)(*count >> 8);
        nonce[1] = (uint8_t)*count;
        (*count)++;
    }
    """
    int honk_seal(EVP_CIPHER_CTX* ctx, uint8_t* nonce, const uint8_t* inp, int n, uint8_t* out) nogil
    int honk_open(EVP_CIPHER_CTX* ctx, uint8_t* nonce, const uint8_t* inp, int n, uint8_t* out) nogil
    int honk_ss_subkey(const uint8_t* master, int len, const uint8_t* salt, uint8_t* out) nogil
    void honk_crypto_init()
    const EVP_CIPHER* honk_ss_cipher(int id) nogil
    EVP_CIPHER_CTX* honk_aead_ctx(const EVP_CIPHER* c, const uint8_t* key, int enc) nogil
    int honk_aead_key(EVP_CIPHER_CTX* ctx, const uint8_t* key, int enc) nogil
    void EVP_CIPHER_CTX_free(EVP_CIPHER_CTX* ctx) nogil
    void OPENSSL_cleanse(void* p, size_t n) nogil
    void honk_shake128_init(uint64_t* a, uint32_t* pos, const uint8_t* msg, int n) nogil
    uint16_t honk_shake128_next16(uint64_t* a, uint32_t* pos) nogil
    void honk_vmess_nonce(uint8_t* nonce, uint16_t* count) nogil


# TLS flows (a ``TlsFraming``): the worker drives the ``SSL*`` of the framing's Python SSLObject
# through its memory BIOs. CPython's ``_ssl._SSLSocket`` starts ``PyObject_HEAD; PyObject *Socket;
# SSL *ssl`` (3.8 to 3.13) and sets itself as the SSL's app data: both are checked before the
# pointer is used, and the SSL's method must be one of the libssl this module links (the same
# library instance as Python's ``_ssl``, or nothing here may touch it).
cdef extern from *:
    """
    #include <openssl/ssl.h>
    #include <openssl/err.h>
    typedef struct { PyObject_HEAD PyObject *socket; SSL *ssl; } honk_pyssl_head;
    static SSL *honk_ssl_of(PyObject *obj) {
        SSL *s;
        const SSL_METHOD *m;
        if (Py_TYPE(obj)->tp_basicsize < (Py_ssize_t)sizeof(honk_pyssl_head)) return NULL;
        s = ((honk_pyssl_head *)obj)->ssl;
        if (s == NULL || SSL_get_app_data(s) != (void *)obj) return NULL;
        m = SSL_CTX_get_ssl_method(SSL_get_SSL_CTX(s));  /* the SSL's own turns version-specific */
        if (m != TLS_client_method() && m != TLS_method()) return NULL;
        return s;
    }
    static inline void honk_bio_reset(BIO *b) { (void)BIO_reset(b); }
    static inline void honk_ssl_release_buffers(SSL *s, int on) {
        if (on) (void)SSL_set_mode(s, SSL_MODE_RELEASE_BUFFERS);
        else (void)SSL_clear_mode(s, SSL_MODE_RELEASE_BUFFERS);
    }
    static inline int honk_ssl_releases_buffers(SSL *s) { return (SSL_get_mode(s) & SSL_MODE_RELEASE_BUFFERS) != 0; }
    """
    SSL* honk_ssl_of(object obj)
    void honk_bio_reset(BIO* b) nogil
    void honk_ssl_release_buffers(SSL* s, int on) nogil
    int honk_ssl_releases_buffers(SSL* s) nogil
    int SSL_read(SSL* s, void* buf, int num) nogil
    int SSL_write(SSL* s, const void* buf, int num) nogil
    int SSL_get_error(const SSL* s, int ret) nogil
    int SSL_shutdown(SSL* s) nogil
    int SSL_is_init_finished(const SSL* s) nogil
    int SSL_in_before(const SSL* s) nogil
    int SSL_do_handshake(SSL* s) nogil
    int SSL_session_reused(const SSL* s) nogil
    int SSL_version(const SSL* s) nogil
    long SSL_get_verify_result(const SSL* s) nogil
    const char* X509_verify_cert_error_string(long n) nogil
    int TLS1_3_VERSION
    BIO* SSL_get_rbio(const SSL* s) nogil
    BIO* SSL_get_wbio(const SSL* s) nogil
    int BIO_read(BIO* b, void* data, int dlen) nogil
    int BIO_write(BIO* b, const void* data, int dlen) nogil
    size_t BIO_ctrl_pending(BIO* b) nogil
    void ERR_clear_error() nogil
    unsigned long ERR_peek_error() nogil
    const char* ERR_reason_error_string(unsigned long e) nogil
    int SSL_ERROR_WANT_READ, SSL_ERROR_ZERO_RETURN

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
# CPython versions whose _ssl._SSLSocket starts PyObject_HEAD, Socket, ssl (honk_ssl_of)
_SSLSOCKET_LAYOUT = ((3, 8), (3, 14))

_tls_checked = None


def tls_supported():
    """Whether this engine can drive the SSLObjects of this Python (the layout it reads, the
    libssl it links): checked once, on a throwaway connection."""
    global _tls_checked
    if _tls_checked is None:  # imported here, once: an import per call costs every TLS dial
        import ssl
        import sys

        _tls_checked = False
        if _SSLSOCKET_LAYOUT[0] <= sys.version_info[:2] < _SSLSOCKET_LAYOUT[1]:
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO())
            _tls_checked = _ssl_of(probe) != NULL
    return _tls_checked


cdef SSL* _ssl_of(sslobj):
    """The SSL* behind a Python SSLObject, or NULL when it cannot be trusted to be one."""
    obj = getattr(sslobj, "_sslobj", None)
    if obj is None or type(obj).__module__ != "_ssl" or type(obj).__name__ != "_SSLSocket":
        return NULL
    return honk_ssl_of(obj)


def _releases_buffers(sslobj):
    """Whether the SSL behind ``sslobj`` gives its record buffers back when they empty (None when
    it cannot be read); tests see what :func:`_tls_buffers` chose."""
    cdef SSL* s = _ssl_of(sslobj)
    if s == NULL:
        return None
    return bool(honk_ssl_releases_buffers(s))


cdef TlsState* _tls_new(framing, bint handshake=False) except NULL:
    """The worker's state for a ``TlsFraming``, which is claimed (see honk.proto.tls_framing);
    ``handshake``: one whose handshake has not begun, for the worker to drive (hs_connect)."""
    cdef TlsState* t
    cdef SSL* s
    if not tls_supported():
        raise ValueError("framing: this Python's SSLObjects cannot be relayed by the engine")
    if framing.claimed:
        raise ValueError("framing: this TLS connection is already relayed")
    s = _ssl_of(framing.sslobj)
    if s == NULL:
        raise ValueError("framing: not an SSLObject the engine can drive")
    if handshake:
        if not SSL_in_before(s):
            raise ValueError("framing: the TLS handshake has already begun")
    elif not SSL_is_init_finished(s):
        raise ValueError("framing: the TLS handshake is not finished")
    t = <TlsState*>calloc(1, sizeof(TlsState))
    if t == NULL:
        raise MemoryError()
    t.handshaking = 1 if handshake else 0
    t.ssl = s
    t.rbio = SSL_get_rbio(s)
    t.wbio = SSL_get_wbio(s)
    if framing.strip_header:
        t.version = <uint8_t>(int(framing.version) & 0xFF)
    else:
        t.stage = TLS_STAGE_DONE
    if getattr(framing, "websocket", False):
        if handshake:
            free(t)
            raise ValueError("framing: a WebSocket connection is upgraded before the engine takes it")
        t.ws = 1
        t.ws_hneed = 2
    inner = getattr(framing, "inner", None)
    if inner is not None:
        try:
            t.inner = _vmess_new(inner)
        except BaseException:
            free(t)
            raise
    framing.claim()
    return t


# -- WebSocket inside TLS (see the module docstring) --------------------------------------------

cdef inline void _ws_mask(uint8_t* p, size_t n, const uint8_t* mask) noexcept nogil:
    """XOR p[:n] with the repeating 4-byte mask (8 bytes a step: the mask repeats in memory order)."""
    cdef uint64_t m8, w
    cdef size_t i = 0
    memcpy(&m8, mask, 4)
    memcpy((<uint8_t*>&m8) + 4, mask, 4)
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        w ^= m8
        memcpy(p + i, &w, 8)
        i += 8
    while i < n:
        p[i] ^= mask[i & 3]
        i += 1


cdef inline size_t _ws_header_len(size_t n) noexcept nogil:
    return (2 if n < 126 else 4 if n < 65536 else 10) + 4


cdef int _ws_frame_head(uint8_t* h, uint8_t opcode, size_t n, uint8_t* mask) noexcept nogil:
    """A final masked frame's header for n payload bytes at h (_ws_header_len(n) bytes), its
    mask drawn into ``mask`` too. 0, or -1 when no random bytes could be had."""
    cdef size_t k = 2, i
    if RAND_bytes(mask, 4) != 1:
        return -1
    h[0] = 0x80 | opcode
    if n < 126:
        h[1] = 0x80 | <uint8_t>n
    elif n < 65536:
        h[1] = 0x80 | 126
        h[2] = <uint8_t>(n >> 8)
        h[3] = <uint8_t>n
        k = 4
    else:
        h[1] = 0x80 | 127
        for i in range(8):
            h[2 + i] = <uint8_t>(n >> (56 - 8 * i))
        k = 10
    memcpy(h + k, mask, 4)
    return 0


cdef int _ws_seal(TlsState* t, uint8_t* p, size_t n, bint headroom) noexcept nogil:
    """p[:n] (client bytes, masked in place) into SSL as binary frames of at most WS_SEND_FRAME
    bytes: with ``headroom`` (WS_HEADROOM writable bytes before p) each frame is one SSL_write,
    its header just before its payload; else the header is a write of its own. 0, or -1."""
    cdef size_t off = 0, k, hl
    cdef uint8_t mask[4]
    cdef uint8_t head[WS_HEADROOM]
    cdef uint8_t* h
    while off < n:
        k = n - off if n - off < WS_SEND_FRAME else WS_SEND_FRAME
        hl = _ws_header_len(k)
        h = p + off - hl if headroom else head  # before the first frame: the headroom; later ones: sent bytes
        if _ws_frame_head(h, WS_OP_BINARY, k, mask) < 0:
            return -1
        _ws_mask(p + off, k, mask)
        if headroom:
            if SSL_write(t.ssl, h, <int>(hl + k)) != <int>(hl + k):
                return -1
        elif (SSL_write(t.ssl, h, <int>hl) != <int>hl
                or SSL_write(t.ssl, p + off, <int>k) != <int>k):
            return -1
        off += k
    return 0


cdef void _ws_control_done(TlsState* t) noexcept nogil:
    """A server control frame is complete: a ping is noted for the batch's pong (only the last
    ping of a batch is answered, RFC 6455 5.5.3, so pongs grow with reads, not with pings), a
    close ends the server's side."""
    if t.ws_op == WS_OP_PING:
        memcpy(t.ws_ping, t.ws_ctl, t.ws_ctl_len)
        t.ws_ping_len = t.ws_ctl_len
        t.ws_ping_due = 1
    elif t.ws_op == WS_OP_CLOSE:
        t.closed = 1


cdef int _ws_answer_ping(TlsState* t) noexcept nogil:
    """The pong for the batch's last ping into SSL (nothing when none came). 0, or -1 (no random
    bytes for its mask)."""
    cdef uint8_t frame[WS_HEADROOM + WS_MAX_CONTROL]
    cdef uint8_t mask[4]
    cdef size_t hl
    if not t.ws_ping_due:
        return 0
    t.ws_ping_due = 0
    hl = _ws_header_len(t.ws_ping_len)
    if _ws_frame_head(frame, WS_OP_PONG, t.ws_ping_len, mask) < 0:
        return -1
    memcpy(frame + hl, t.ws_ping, t.ws_ping_len)
    _ws_mask(frame + hl, t.ws_ping_len, mask)
    if SSL_write(t.ssl, frame, <int>(hl + t.ws_ping_len)) != <int>(hl + t.ws_ping_len):
        return -1
    return 0


cdef int _ws_unframe(TlsState* t, uint8_t* p, size_t* n) noexcept nogil:
    """The server's plaintext p[:n[0]] unframed in place: n[0] becomes the data frames' payload
    bytes, moved to the front. -1 with t.ws_error for a frame that breaks RFC 6455 (the same
    checks as honk.proto.websocket.WsDecoder, in its order)."""
    cdef size_t pos = 0, out = 0, k, size, i
    cdef size_t have = n[0]
    cdef uint8_t b0, b1, op
    while pos < have and not t.closed:
        if not t.ws_in_payload:
            t.ws_hdr[t.ws_hlen] = p[pos]
            t.ws_hlen += 1
            pos += 1
            if t.ws_hlen == 2:
                b0 = t.ws_hdr[0]
                b1 = t.ws_hdr[1]
                op = b0 & 0x0F
                if b0 & 0x70:
                    t.ws_error = WS_ERR_RESERVED
                    return -1
                if not (op <= WS_OP_BINARY or WS_OP_CLOSE <= op <= WS_OP_PONG):
                    t.ws_error = WS_ERR_OPCODE
                    return -1
                if b1 & 0x80:
                    t.ws_error = WS_ERR_MASKED
                    return -1
                t.ws_op = op
                t.ws_hneed = 2 if (b1 & 0x7F) < 126 else 4 if (b1 & 0x7F) == 126 else 10
            if t.ws_hlen < t.ws_hneed:
                continue
            size = t.ws_hdr[1] & 0x7F
            if t.ws_hneed == 4:
                size = (<size_t>t.ws_hdr[2] << 8) | t.ws_hdr[3]
            elif t.ws_hneed == 10:
                size = 0
                for i in range(8):
                    size = (size << 8) | t.ws_hdr[2 + i]
            if t.ws_op >= WS_OP_CLOSE and (size > WS_MAX_CONTROL or not (t.ws_hdr[0] & 0x80)):
                t.ws_error = WS_ERR_CONTROL
                return -1
            if size > WS_MAX_FRAME:
                t.ws_error = WS_ERR_TOO_LARGE
                return -1
            t.ws_hlen = 0
            t.ws_hneed = 2
            t.ws_left = size
            t.ws_ctl_len = 0
            t.ws_in_payload = 1
        else:
            k = have - pos if have - pos < t.ws_left else <size_t>t.ws_left
            if t.ws_op >= WS_OP_CLOSE:
                memcpy(t.ws_ctl + t.ws_ctl_len, p + pos, k)
                t.ws_ctl_len += <uint8_t>k
            else:
                if out != pos:
                    memmove(p + out, p + pos, k)
                out += k
            pos += k
            t.ws_left -= k
        if t.ws_in_payload and t.ws_left == 0:
            t.ws_in_payload = 0
            if t.ws_op >= WS_OP_CLOSE:
                _ws_control_done(t)
    if _ws_answer_ping(t) < 0:
        return -1
    n[0] = out
    return 0


cdef _report_handshake(framing):
    """Tell a framing whose handshake the worker drove how far it got (its flow has ended)."""
    cdef SSL* s = _ssl_of(framing.sslobj)
    if s == NULL:
        return
    cdef long verify = SSL_get_verify_result(s)
    message = X509_verify_cert_error_string(verify).decode("ascii", "replace") if verify else ""
    framing.handshake_reported(not SSL_in_before(s), bool(SSL_is_init_finished(s)), verify, message)


def _openssl_reason(unsigned long code):
    """OpenSSL's words for an error code (a TlsState.err)."""
    cdef const char* text = ERR_reason_error_string(code) if code != TLS_ERR_UNKNOWN else NULL
    return text.decode("ascii", "replace") if text != NULL else "an unreadable record"


# Shadowsocks AEAD ciphers the engine frames: name -> (key and salt size, honk_ss_cipher id).
_CIPHERS = {"aes-128-gcm": (16, 1), "aes-256-gcm": (32, 2), "chacha20-ietf-poly1305": (32, 3)}
honk_crypto_init()  # before any worker starts


# VMess body securities the engine frames: name -> honk_ss_cipher id (0: none, plain chunks).
_VMESS_SECURITIES = {"aes-128-gcm": 1, "chacha20-poly1305": 3, "none": 0}


cdef bytes _sized(value, int size, str what):
    cdef bytes b = bytes(value)
    if len(b) != size:
        raise ValueError(f"framing: {what} must be {size} bytes")
    return b


cdef Aead* _vmess_new(framing) except NULL:
    """The worker's state for a VMess framing object (``framing.engine_keys()``, see relay_py)."""
    cdef Aead* a
    cdef int cid, key_size
    cdef bytes seal_key, seal_iv, open_key, open_iv, len_key, len_nonce, hdr_key, hdr_nonce
    security, k1, v1, k2, v2, k3, n3, k4, n4, check = framing.engine_keys()
    if security not in _VMESS_SECURITIES:
        raise ValueError("framing: unsupported VMess security")
    cid = _VMESS_SECURITIES[security]
    key_size = 32 if cid == 3 else 16
    seal_iv = _sized(v1, 16, "the request body IV")
    open_iv = _sized(v2, 16, "the response body IV")
    len_key = _sized(k3, 16, "a header key")
    len_nonce = _sized(n3, 12, "a header nonce")
    hdr_key = _sized(k4, 16, "a header key")
    hdr_nonce = _sized(n4, 12, "a header nonce")
    seal_key = _sized(k1, key_size, "the request body key") if cid else b""
    open_key = _sized(k2, key_size, "the response body key") if cid else b""
    a = <Aead*>calloc(1, sizeof(Aead))
    if a == NULL:
        raise MemoryError()
    a.vmess = 1
    a.plen = -1
    a.hlen = -1
    a.check = <uint8_t>(int(check) & 0xFF)
    a.tag = SS_TAG if cid else 0
    memcpy(a.hdr_len_key, PyBytes_AS_STRING(len_key), 16)
    memcpy(a.hdr_len_nonce, PyBytes_AS_STRING(len_nonce), 12)
    memcpy(a.hdr_key, PyBytes_AS_STRING(hdr_key), 16)
    memcpy(a.hdr_nonce, PyBytes_AS_STRING(hdr_nonce), 12)
    memcpy(a.seal_nonce, PyBytes_AS_STRING(seal_iv), 12)  # bytes 0..1 become the chunk count
    memcpy(a.open_nonce, PyBytes_AS_STRING(open_iv), 12)
    honk_shake128_init(a.seal_mask, &a.seal_mask_pos, <const uint8_t*>PyBytes_AS_STRING(seal_iv), 16)
    honk_shake128_init(a.open_mask, &a.open_mask_pos, <const uint8_t*>PyBytes_AS_STRING(open_iv), 16)
    if cid:
        a.cipher = honk_ss_cipher(cid)
        a.sealer = honk_aead_ctx(a.cipher, <const uint8_t*>PyBytes_AS_STRING(seal_key), 1)
        a.opener = honk_aead_ctx(a.cipher, <const uint8_t*>PyBytes_AS_STRING(open_key), 0)
        if a.cipher == NULL or a.sealer == NULL or a.opener == NULL:
            _aead_free(a)
            raise OSError(EIO, "framing: OpenSSL refused the cipher")
    return a


cdef Aead* _aead_new(framing, bytes salt=None) except NULL:
    """The worker's framing state for a framing object (see relay_py's module docstring).

    ``salt``: a Shadowsocks framing whose salt is not sent yet (``hs_connect``): the sealer is
    keyed here from that salt and starts at nonce 0; otherwise the encryptor's subkey and nonce."""
    cdef Aead* a
    cdef bytes master, subkey, nonce
    cdef int key_len, cid
    cdef uint8_t key[32]
    if getattr(framing, "kind", "shadowsocks") == "vmess":
        return _vmess_new(framing)
    spec = _CIPHERS.get(getattr(framing, "cipher", None))
    if spec is None:
        raise ValueError("framing: unsupported cipher")
    key_len, cid = spec
    master = bytes(framing.master)
    if len(master) != key_len:
        raise ValueError("framing: key size does not match the cipher")
    if salt is not None:
        if len(salt) != key_len:
            raise ValueError("framing: salt size does not match the cipher")
        if honk_ss_subkey(<const uint8_t*>PyBytes_AS_STRING(master), key_len,
                          <const uint8_t*>PyBytes_AS_STRING(salt), key) < 0:
            raise OSError(EIO, "framing: OpenSSL refused the key derivation")
        subkey = (<char*>key)[:key_len]
        OPENSSL_cleanse(key, 32)
        counter = 0
    else:
        encryptor = framing.encryptor
        if not getattr(encryptor, "salt_sent", True):
            raise ValueError("framing: the client's salt has not been sent")
        subkey = bytes(encryptor.subkey)
        if len(subkey) != key_len:
            raise ValueError("framing: key size does not match the cipher")
        counter = int(encryptor.nonce)
    if not 0 <= counter < 1 << 96:
        raise ValueError("framing: nonce counter out of range")
    nonce = counter.to_bytes(12, "little")
    a = <Aead*>calloc(1, sizeof(Aead))
    if a == NULL:
        raise MemoryError()
    a.key_len = key_len
    a.plen = -1
    memcpy(a.master, PyBytes_AS_STRING(master), key_len)
    memcpy(a.seal_nonce, PyBytes_AS_STRING(nonce), 12)
    a.cipher = honk_ss_cipher(cid)
    a.sealer = honk_aead_ctx(a.cipher, <const uint8_t*>PyBytes_AS_STRING(subkey), 1)
    a.opener = honk_aead_ctx(a.cipher, NULL, 0)
    if a.cipher == NULL or a.sealer == NULL or a.opener == NULL:
        _aead_free(a)
        raise OSError(EIO, "framing: OpenSSL refused the cipher")
    return a


cdef bytes _unsent_salt(framing):
    """The salt of a Shadowsocks framing that has sent nothing yet, else None: its encryptor's,
    or for a fresh framing (no codec objects made) a new one (``framing.new_salt()``)."""
    if framing is None or getattr(framing, "kind", "shadowsocks") != "shadowsocks":
        return None
    if getattr(framing, "fresh", False):
        return framing.new_salt()
    encryptor = framing.encryptor
    if getattr(encryptor, "salt_sent", True):
        return None
    return bytes(encryptor.salt)


cdef char* _salted_head(Aead* a, bytes salt, bytes head, size_t* n) except NULL:
    """The salt and ``head`` sealed as chunks after it, in a malloc'd buffer of n bytes."""
    cdef size_t k = PyBytes_GET_SIZE(salt)
    cdef size_t plain = PyBytes_GET_SIZE(head)
    cdef ssize_t sealed
    cdef char* out = <char*>malloc(k + plain + (plain + SS_MAX_PAYLOAD - 1) // SS_MAX_PAYLOAD * SS_OVERHEAD)
    if out == NULL:
        raise MemoryError()
    memcpy(out, PyBytes_AS_STRING(salt), k)
    sealed = _seal_chunks(a, <const uint8_t*>PyBytes_AS_STRING(head), plain, <uint8_t*>out + k)
    if sealed < 0:
        free(out)
        raise OSError(EIO, "framing: OpenSSL refused to seal the header")
    n[0] = k + <size_t>sealed
    return out


cdef void _tls_release(framing, TlsState* t):
    """Undo _tls_new for a flow the engine refused before the worker took it."""
    if t != NULL:
        _aead_free(t.inner)
        free(t)
        framing.unclaim()


cdef void _aead_free(Aead* a) noexcept nogil:
    if a == NULL:
        return
    EVP_CIPHER_CTX_free(a.sealer)
    EVP_CIPHER_CTX_free(a.opener)
    cdef char* pend = a.pend
    OPENSSL_cleanse(a, sizeof(Aead))  # keys, nonces and mask sponges
    free(pend)
    free(a)


cdef int _open_once(const uint8_t* key, const uint8_t* nonce12, const uint8_t* p, int n, uint8_t* out) noexcept nogil:
    """Open one AES-128-GCM seal (n bytes + tag) with its own key and nonce: 0, EBADMSG, or EIO."""
    cdef uint8_t nonce[12]
    cdef int rc
    cdef EVP_CIPHER_CTX* ctx = honk_aead_ctx(honk_ss_cipher(1), key, 0)
    if ctx == NULL:
        return EIO
    memcpy(nonce, nonce12, 12)
    rc = honk_open(ctx, nonce, p, n, out)
    EVP_CIPHER_CTX_free(ctx)
    return EBADMSG if rc < 0 else 0


cdef ssize_t _vmess_chunk(Aead* a, const uint8_t* p, size_t k, uint8_t* out) noexcept nogil:
    """One VMess chunk of k payload bytes into out (k + 2 + tag bytes; k == 0 is the ending chunk); its size or -1."""
    cdef uint16_t size = <uint16_t>(k + a.tag)
    cdef uint16_t masked = size ^ honk_shake128_next16(a.seal_mask, &a.seal_mask_pos)
    cdef uint8_t nonce[12]
    out[0] = <uint8_t>(masked >> 8)
    out[1] = <uint8_t>(masked & 0xFF)
    if a.sealer == NULL:
        memcpy(out + 2, p, k)
    else:
        memcpy(nonce, a.seal_nonce, 12)  # a copy: honk_seal steps it, which must not reach the IV bytes
        honk_vmess_nonce(nonce, &a.seal_count)
        if honk_seal(a.sealer, nonce, p, <int>k, out + 2) < 0:
            return -1
    return <ssize_t>(2 + size)


cdef int _tls_put(TlsState* t, uint8_t* p, size_t n, bint headroom) noexcept nogil:
    """n bytes of the connection's plaintext stream into its write BIO: as WebSocket frames when
    it carries them (``headroom`` as for _ws_seal), else one SSL_write (a memory BIO takes it
    all). 0, or -1 (the OpenSSL error queue is the caller's to clear)."""
    if t.ws:
        return _ws_seal(t, p, n, headroom)
    return 0 if SSL_write(t.ssl, p, <int>n) == <int>n else -1


cdef int _tls_put_sealed(TlsState* t, const uint8_t* p, size_t n, uint8_t* out) noexcept nogil:
    """n client bytes into the write BIO through the inner VMess framing: sealed as chunks into
    out + WS_HEADROOM (room for n + _vmess_overhead(n) bytes after it), then put. 0, or -1."""
    cdef ssize_t sealed = _seal_chunks(t.inner, p, n, out + WS_HEADROOM)
    if sealed < 0:
        return -1
    return _tls_put(t, out + WS_HEADROOM, <size_t>sealed, 1)


cdef inline size_t _vmess_overhead(size_t n) noexcept nogil:
    """What sealing n bytes as VMess chunks adds: per chunk of up to SS_MAX_PAYLOAD bytes, a
    2-byte length and a tag."""
    return (n + SS_MAX_PAYLOAD - 1) // SS_MAX_PAYLOAD * (2 + SS_TAG)


cdef ssize_t _seal_chunks(Aead* a, const uint8_t* p, size_t n, uint8_t* out) noexcept nogil:
    """Seal n plaintext bytes as maximal chunks into out (at most n + SS_OVERHEAD per chunk); bytes written or -1."""
    cdef size_t pos = 0, o = 0, k
    cdef ssize_t w
    cdef uint8_t head[2]
    if a.vmess:
        while pos < n:  # VMess allows longer chunks; the same bound keeps one buffer size for both
            k = n - pos if n - pos < SS_MAX_PAYLOAD else SS_MAX_PAYLOAD
            w = _vmess_chunk(a, p + pos, k, out + o)
            if w < 0:
                return -1
            o += <size_t>w
            pos += k
        return <ssize_t>o
    while pos < n:
        k = n - pos if n - pos < SS_MAX_PAYLOAD else SS_MAX_PAYLOAD
        head[0] = <uint8_t>(k >> 8)
        head[1] = <uint8_t>(k & 0xFF)
        if honk_seal(a.sealer, a.seal_nonce, head, 2, out + o) < 0:
            return -1
        if honk_seal(a.sealer, a.seal_nonce, p + pos, <int>k, out + o + SS_HEAD) < 0:
            return -1
        o += k + SS_OVERHEAD
        pos += k
    return <ssize_t>o


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


cdef inline void _tls_buffers(TlsState* t, size_t n) noexcept nogil:
    """A TLS flow that just read ``n`` bytes keeps the SSL's record buffers while it moves bulk.
    CPython's contexts set SSL_MODE_RELEASE_BUFFERS, which frees the ~17 KiB read or write buffer
    whenever it empties and allocates it again for the next record: a malloc and a free for every
    16 KiB of a bulk transfer. A flow whose reads are small gives its buffers back again (about
    17 KiB each way, 34 KiB a flow, that an idle flow would otherwise hold)."""
    cdef bint bulk = n >= TLS_BULK_READ
    if bulk != t.keep_bufs:
        honk_ssl_release_buffers(t.ssl, not bulk)
        t.keep_bufs = bulk


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
                    self._listener_event(e)
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

    cdef object _listener_event(self, Event* e):
        cdef Hs* h = <Hs*>e.a
        cdef char host[46]
        cdef char src[46]
        cdef int src_port, off, port, alen
        cdef uint8_t* b
        entry = self._lsts.get(e.id)
        listener = entry[0] if entry is not None else None
        if e.kind == K_DROPPED:
            if listener is not None:
                listener.socks_dropped()
            return
        if e.kind == K_RESTED:  # a = the accept's errno; no handshake record
            if listener is not None:
                listener.socks_rested(<int>e.a)
            return
        src_port = honk_sockaddr_text(h.peer, src)
        src_host = src.decode("ascii")
        if src_port < 0:
            src_port = 0
        if e.kind == K_HANDOVER:
            fd = h.fd
            data = PyBytes_FromStringAndSize(h.buf, h.len)
            answered = h.answered
            err = h.err
            free(h)
            if listener is None:
                close(fd)
                return
            listener.socks_handover(fd, data, answered, err, src_host, src_port)
            return
        # K_REQUEST: the worker checked the request; read the target out of it
        b = <uint8_t*>h.buf
        off = h.req_off
        if b[off + 3] == 1:
            honk_ntop(AF_INET, b + off + 4, host)
            target = host.decode("ascii")
            port = (b[off + 8] << 8) | b[off + 9]
        elif b[off + 3] == 4:
            honk_ntop(AF_INET6, b + off + 4, host)
            target = host.decode("ascii")
            port = (b[off + 20] << 8) | b[off + 21]
        else:
            alen = b[off + 4]
            target = PyBytes_FromStringAndSize(<char*>b + off + 5, alen).decode("ascii")
            port = (b[off + 5 + alen] << 8) | b[off + 6 + alen]
        token = <size_t>h
        self._held[token] = True
        if listener is None:
            self.hs_reject(token, 1)
            return
        listener.socks_request(token, src_host, src_port, target, port)

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
                    self._accept(<Lst*>(data & ~(<uint64_t>3)), now)
                    continue
                if tag == TAG_HS:
                    h = <Hs*>(data & ~(<uint64_t>3))
                    if h.state == HS_GREETING or h.state == HS_REQUEST:
                        self._hs_read(h, now)
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
                self._hs_release(self.hs_head, K_HANDOVER)
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
                    self._hs_release(self.hs_head, K_DROPPED)
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
                        self._unlisten(self.lst_ptrs[lk], 0, now)
            elif c.kind == CMD_CONNECT or c.kind == CMD_RELAY:
                self._hs_start(c, now)
            elif c.kind == CMD_REJECT:
                self._hs_reject(c.hs, c.code)
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
                self._unlisten(c.lst, c.code, now)
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
        if f.aead != NULL and self._framed_start(f, now) < 0:
            return
        if f.tls != NULL and self._tls_start(f, now) < 0:
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

    cdef void _accept(self, Lst* l, double now) noexcept nogil:
        cdef int k, fd
        cdef Hs* h
        cdef char peer[28]
        cdef uint8_t peer_len
        for k in range(ACCEPT_BURST):
            if l.fd < 0:
                return
            fd = honk_accept(l.fd, peer, &peer_len)
            if fd < 0:
                if errno == EINTR:
                    continue
                if errno == EINVAL:  # shut down under us (stop_accepting): nothing more comes
                    self._unlisten(l, 0, now)
                elif errno == EMFILE or errno == ENFILE or errno == ENOBUFS or errno == ENOMEM:
                    # Out of descriptors or memory: the listener stays readable, so leave
                    # epoll for a while rather than spin; the timer pass below re-arms it.
                    honk_epoll_del(self.epfd, l.fd)
                    l.paused_until = now + ACCEPT_BACKOFF
                    self._emit_lst(l.id, K_RESTED, errno, now)  # Python counts and warns
                return  # EAGAIN: edge of the burst, we are called again when readable
            h = <Hs*>malloc(sizeof(Hs))
            if h == NULL:
                close(fd)
                continue
            h.fd = fd
            h.err = 0
            h.lid = l.id
            h.state = HS_GREETING
            h.answered = 0
            h.len = 0
            h.req_off = 0
            h.req_end = 0
            h.peer_len = peer_len
            memcpy(h.peer, peer, 28)
            h.deadline = now + HS_HANDOVER_AFTER
            h.next = NULL
            h.prev = self.hs_tail
            if self.hs_tail != NULL:
                self.hs_tail.next = h
            else:
                self.hs_head = h
            self.hs_tail = h
            honk_store64(&l.accepted, l.accepted + 1)
            if honk_epoll_add(self.epfd, fd, (<uint64_t>h) | TAG_HS, EPOLLIN | EPOLLRDHUP | EPOLLET) < 0:
                h.err = errno
                self._hs_release(h, K_HANDOVER)
                continue
            self._hs_read(h, now)  # the greeting is often there already

    cdef void _hs_unlink(self, Hs* h) noexcept nogil:
        if h.prev != NULL:
            h.prev.next = h.next
        else:
            self.hs_head = h.next
        if h.next != NULL:
            h.next.prev = h.prev
        else:
            self.hs_tail = h.prev
        h.prev = h.next = NULL

    cdef void _hs_release(self, Hs* h, int kind) noexcept nogil:
        """End the worker's part of a handshake it still reads: HANDOVER (Python takes the fd
        and the bytes) or DROPPED (closed here)."""
        self._hs_unlink(h)
        if kind == K_DROPPED:
            close(h.fd)
            h.fd = -1
            h.state = HS_DEAD
            _vec_push(&self.hs_dead, &h)
            self._emit_lst(h.lid, K_DROPPED, 0, 0.0)
            return
        honk_epoll_del(self.epfd, h.fd)
        h.state = HS_DEAD  # Python frees it after the drain; nothing here touches it again
        self._emit_lst(h.lid, K_HANDOVER, <int64_t>h, 0.0)

    cdef void _hs_read(self, Hs* h, double now) noexcept nogil:
        """Read what the client sent and move its handshake on. Only the common case is
        served here (a complete greeting offering no-auth, then a complete CONNECT); anything
        else goes to Python with the bytes read so far (see the module docstring)."""
        cdef ssize_t n
        cdef int nm, k, end, alen, off
        cdef uint8_t* b = <uint8_t*>h.buf
        cdef char hello[2]
        while True:
            if h.len >= HS_BUF:
                self._hs_release(h, K_HANDOVER)
                return
            n = recv(h.fd, h.buf + h.len, HS_BUF - h.len, MSG_DONTWAIT)
            if n < 0:
                if errno == EAGAIN:
                    return
                if errno == EINTR:
                    continue
                h.err = errno
                self._hs_release(h, K_HANDOVER)
                return
            if n == 0:  # EOF: Python reads it again and says what it means
                self._hs_release(h, K_HANDOVER)
                return
            h.len += <uint16_t>n
            if h.state == HS_GREETING:
                if b[0] != 5 or h.len < 2 or h.len < 2 + b[1]:
                    self._hs_release(h, K_HANDOVER)
                    return
                nm = b[1]
                for k in range(nm):
                    if b[2 + k] == 0:
                        break
                else:
                    self._hs_release(h, K_HANDOVER)  # no "no-auth": Python refuses it
                    return
                hello[0] = 5
                hello[1] = 0
                if send(h.fd, hello, 2, MSG_NOSIGNAL | MSG_DONTWAIT) != 2:
                    h.err = errno
                    self._hs_release(h, K_HANDOVER)
                    return
                h.answered = 2
                h.req_off = <uint16_t>(2 + nm)
                h.state = HS_REQUEST
            # HS_REQUEST
            off = h.req_off
            if h.len == off:
                continue  # nothing after the greeting yet: read until EAGAIN
            if h.len < off + 5 or b[off] != 5 or b[off + 1] != 1 or b[off + 2] != 0:
                self._hs_release(h, K_HANDOVER)
                return
            if b[off + 3] == 1:
                end = off + 4 + 4 + 2
            elif b[off + 3] == 4:
                end = off + 4 + 16 + 2
            elif b[off + 3] == 3:
                alen = b[off + 4]
                end = off + 5 + alen + 2
                if alen == 0 or h.len < end:
                    self._hs_release(h, K_HANDOVER)
                    return
                for k in range(alen):
                    if b[off + 5 + k] <= 0x20 or b[off + 5 + k] >= 0x7F:
                        self._hs_release(h, K_HANDOVER)  # Python says bad-domain
                        return
            else:
                self._hs_release(h, K_HANDOVER)
                return
            if h.len < end:
                self._hs_release(h, K_HANDOVER)
                return
            h.req_end = <uint16_t>end
            h.state = HS_WAITING
            self._hs_unlink(h)
            self._emit_lst(h.lid, K_REQUEST, <int64_t>h, now)
            return

    cdef void _hs_reject(self, Hs* h, int code) noexcept nogil:
        honk_send_reply(h.fd, code)
        close(h.fd)
        h.fd = -1
        h.state = HS_DEAD
        _vec_push(&self.hs_dead, &h)

    cdef void _hs_start(self, Cmd* c, double now) noexcept nogil:
        """CONNECT (dial c.addr) or RELAY (c.fd[1] is connected): the flow starts connecting."""
        cdef Hs* h = c.hs
        cdef Flow* f = c.flow
        cdef uint64_t up = f.bytes_up
        cdef uint64_t down = f.bytes_down
        cdef int di, fd
        cdef size_t early
        memset(f, 0, sizeof(Flow))
        f.bytes_up = up
        f.bytes_down = down
        f.id = c.id
        f.fd[0] = h.fd
        f.fd[1] = -1
        f.connecting = 1
        f.fail_code = 1
        f.owned = 1  # accepted by the worker; the upstream fd is the worker's or detached from Python
        f.aead = c.aead
        f.tls = c.tls
        for di in range(2):
            f.d[di].pr = -1
            f.d[di].pw = -1
        h.fd = -1
        h.state = HS_DEAD
        _vec_push(&self.hs_dead, &h)
        f.next = self.live
        if self.live != NULL:
            self.live.prev = f
        self.live = f
        early = h.len - h.req_end
        if early:
            f.d[0].buf = <char*>malloc(early)
            if f.d[0].buf == NULL:
                free(c.head)
                self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                return
            memcpy(f.d[0].buf, h.buf + h.req_end, early)
            f.d[0].len = early
            f.d[0].cap = early
        if c.kind == CMD_RELAY and c.fd[1] >= 0 and f.aead != NULL and self._framed_start(f, now) < 0:
            close(c.fd[1])
            return
        if c.kind == CMD_CONNECT and f.aead != NULL and self._framed_start(f, now) < 0:
            free(c.head)
            return
        if c.kind == CMD_CONNECT and f.tls != NULL and self._framed_buffers(f, now) < 0:
            free(c.head)  # (a TLS head is plaintext: sealed with the early bytes after the handshake)
            return
        if c.head_len and f.tls != NULL and f.tls.inner != NULL:
            f.tls.raw_len = <uint32_t>c.head_len  # VMess's sealed request header: written as it is
        if c.head_len and self._put_head(f, c.head, c.head_len, now) < 0:
            return
        if c.kind == CMD_RELAY and c.fd[1] >= 0 and f.tls != NULL and self._tls_start(f, now) < 0:
            close(c.fd[1])
            return
        # the client fd is registered under its Hs: retag it for the flow (re-arms the edge)
        if honk_epoll_mod(self.epfd, f.fd[0], <uint64_t>f, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET) < 0:
            self._end(f, C_ERROR, (S_LOCAL << 16) | errno, now)
            return
        if c.kind == CMD_RELAY:
            fd = c.fd[1]
            if honk_nonblock(fd) < 0:
                close(fd)
                self._end(f, C_ERROR, (1 << 16) | errno, now)
                return
        else:
            fd = honk_dial(c.addr, c.addr_len, c.mark, &self.mark_denied)
            if fd < 0:
                self._end(f, C_ERROR, (1 << 16) | (-fd), now)
                return
        f.fd[1] = fd
        if honk_epoll_add(self.epfd, fd, (<uint64_t>f) | 1, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET) < 0:
            self._end(f, C_ERROR, (S_LOCAL << 16) | errno, now)
            return
        f.writable[0] = 1
        if c.kind == CMD_CONNECT:
            # Over loopback the kernel often finishes the handshake inside connect(): the flow
            # opens now (SOCKS reply, request header, TLS ClientHello), not a turn later, which
            # under load was a few hundred microseconds of every short flow's life.
            if not honk_connect_done(fd):
                return  # EPOLLOUT (or EPOLLERR) on the upstream says how the connect went
            honk_store64(&self.n_at_once, self.n_at_once + 1)
        f.writable[1] = 1
        self._service(f, now)

    cdef int _put_head(self, Flow* f, char* head, size_t n, double now) noexcept nogil:
        """Put ``head`` (owned from here on) ahead of what the up direction already holds.
        0, or -1 if the flow ended for want of memory."""
        cdef Dir* d = &f.d[0]
        cdef char* joined
        if d.len == 0:
            free(d.buf)
            d.buf = head
            d.off = 0
            d.len = d.cap = n
            return 0
        joined = <char*>realloc(head, n + d.len)
        if joined == NULL:
            free(head)
            self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
            return -1
        memcpy(joined + n, d.buf + d.off, d.len)
        free(d.buf)
        d.buf = joined
        d.off = 0
        d.len = d.cap = n + d.len
        return 0

    cdef void _connected(self, Flow* f, double now) noexcept nogil:
        """The upstream connect finished: reply success (queued ahead of upstream bytes) and relay.

        EPOLLOUT without EPOLLERR means the connect succeeded; a failed one comes with
        EPOLLERR, whose SO_ERROR the worker loop reads (and ends the flow) before this.
        """
        cdef char* reply
        reply = <char*>malloc(22)
        if reply == NULL:
            self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
            return
        f.d[1].buf = reply
        f.d[1].len = honk_build_reply(reply, 0, f.fd[1])
        f.d[1].cap = 22
        f.connecting = 0
        f.next_report = now + REPORT_INTERVAL
        self._emit(f, K_OPEN, 1, f.tls.facts if f.tls != NULL else 0, now)

    cdef int _tls_handshake(self, Flow* f, double now) noexcept nogil:
        """Drive an hs_connect TLS flow's handshake as far as the bytes at hand allow; once it is
        finished, seal the head and early bytes (_tls_start) and reply (_connected). 0 (done, or
        waiting for the upstream), or -1 if the flow ended."""
        cdef TlsState* t = f.tls
        cdef ssize_t n
        cdef int r, err
        while True:
            if t.hs_out_off < t.hs_out_len:  # what a short send left goes first
                n = send(f.fd[1], t.hs_out + t.hs_out_off, t.hs_out_len - t.hs_out_off, MSG_NOSIGNAL | MSG_DONTWAIT)
                if n < 0:
                    if errno == EINTR:
                        continue
                    if errno == EAGAIN:
                        f.writable[1] = 0
                        return 0
                    self._end(f, C_ERROR, (1 << 16) | errno, now)
                    return -1
                t.hs_out_off += <uint32_t>n
                if t.hs_out_off < t.hs_out_len:
                    continue
                free(t.hs_out)
                t.hs_out = NULL
                t.hs_out_len = t.hs_out_off = 0
            t.hs_started = 1
            r = SSL_do_handshake(t.ssl)
            if r == 1:
                ERR_clear_error()
                t.handshaking = 0
                t.facts = (TLS_RESUMED if SSL_session_reused(t.ssl) else 0) | (
                    TLS_13 if SSL_version(t.ssl) == TLS1_3_VERSION else 0)
                # the client's last flight stays in the write BIO, ahead of the sealed head
                if self._tls_start(f, now) < 0:
                    return -1
                self._connected(f, now)
                return -1 if f.ended else 0
            err = SSL_get_error(t.ssl, r)
            if err != SSL_ERROR_WANT_READ:
                t.err = <uint32_t>ERR_peek_error()
                if t.err == 0:
                    t.err = TLS_ERR_UNKNOWN
                ERR_clear_error()
                self._end(f, C_ERROR, (1 << 16) | EPROTO, now)
                return -1
            ERR_clear_error()
            if self._hs_send(f, now) < 0:
                return -1
            if t.hs_out_len:
                return 0  # the server answers nothing before it has all of it
            n = recv(f.fd[1], self.fin + VMESS_WIRE, FRAMED_READ, MSG_DONTWAIT)
            if n > 0:
                if BIO_write(t.rbio, self.fin + VMESS_WIRE, <int>n) != <int>n:
                    ERR_clear_error()
                    self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                    return -1
                continue
            if n == 0:  # the server closed in the middle of the handshake
                self._end(f, C_ERROR, (1 << 16) | ECONNRESET, now)
                return -1
            if errno == EINTR:
                continue
            if errno == EAGAIN:
                f.readable[1] = 0
                return 0
            self._end(f, C_ERROR, (1 << 16) | errno, now)
            return -1

    cdef int _hs_send(self, Flow* f, double now) noexcept nogil:
        """Send what the handshake wrote into the write BIO; a short send keeps the rest in
        hs_out. 0, or -1 if the flow ended."""
        cdef TlsState* t = f.tls
        cdef ssize_t n
        cdef int k
        cdef char* grown
        while True:
            k = self._wbio_take(f, now)
            if k <= 0:
                return k
            n = 0
            if t.hs_out_len == 0:
                while True:
                    n = send(f.fd[1], self.fout, <size_t>k, MSG_NOSIGNAL | MSG_DONTWAIT)
                    if n >= 0 or errno != EINTR:
                        break
                if n < 0:
                    if errno != EAGAIN:
                        self._end(f, C_ERROR, (1 << 16) | errno, now)
                        return -1
                    n = 0
            if n < k:
                f.writable[1] = 0
                grown = <char*>realloc(t.hs_out, t.hs_out_len + <size_t>(k - n))
                if grown == NULL:
                    self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                    return -1
                memcpy(grown + t.hs_out_len, self.fout + n, <size_t>(k - n))
                t.hs_out = grown
                t.hs_out_len += <uint32_t>(k - n)

    cdef void _unlisten(self, Lst* l, int drop, double now) noexcept nogil:
        cdef Hs* h
        cdef Hs* nxt
        if l.fd >= 0:
            honk_epoll_del(self.epfd, l.fd)
            close(l.fd)
            l.fd = -1
        if drop:
            h = self.hs_head
            while h != NULL:
                nxt = h.next
                if h.lid == l.id:
                    self._hs_release(h, K_DROPPED)
                h = nxt

    cdef void _emit_lst(self, uint64_t lid, int kind, int64_t a, double now) noexcept nogil:
        cdef Event e
        e.id = lid
        e.kind = kind
        e.pad = 0
        e.a = a
        e.b = 0
        e.t = now
        _vec_push(&self.local_events, &e)
        self.events_urgent = 1

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
                if self._tls_handshake(f, now) < 0 or f.tls.handshaking:
                    return
            else:
                if not f.writable[1]:
                    return
                self._connected(f, now)
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
                if self._reserve(f, d, COPY_BUFFER, now) < 0:
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
                if f.aead != NULL and self._framed(f, di, <size_t>n, now) < 0:
                    return -1
                if f.tls != NULL and (self._tls_up(f, <size_t>n, now) if di == 0 else self._tls_down(f, <size_t>n, now)) < 0:
                    return -1
                continue
            if n == 0:
                if f.aead != NULL and self._framed_eof(f, di, now) < 0:
                    return -1
                if f.tls != NULL and self._tls_eof(f, di, now) < 0:
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

    cdef int _framed_start(self, Flow* f, double now) noexcept nogil:
        """A framed flow starts: both directions copy (never splice), the engine's framing buffers
        exist, and the preamble in d[0].buf is replaced by its sealed chunks. 0, or -1 if it ended."""
        cdef Dir* d = &f.d[0]
        cdef char* sealed
        cdef ssize_t n
        if self._framed_buffers(f, now) < 0:
            return -1
        if d.len == 0:
            return 0
        sealed = <char*>malloc(d.len + (d.len + SS_MAX_PAYLOAD - 1) // SS_MAX_PAYLOAD * SS_OVERHEAD)
        if sealed == NULL:
            self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
            return -1
        n = _seal_chunks(f.aead, <uint8_t*>d.buf, d.len, <uint8_t*>sealed)
        free(d.buf)
        d.buf = sealed
        d.off = 0
        d.len = d.cap = <size_t>n if n > 0 else 0
        if n < 0:
            self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
            return -1
        return 0

    cdef int _framed(self, Flow* f, int di, size_t n, double now) noexcept nogil:
        """Seal (up) or open (down) the n bytes just read into fin + VMESS_WIRE, then send the
        result on to dst. 0, or -1 if the flow ended.

        Up: the plaintext becomes maximal chunks (payload up to 0x3FFF). Down: the bytes kept
        from the last read (an incomplete salt or chunk) are put back just before the new ones,
        every complete chunk is opened, and the incomplete rest is kept again.
        """
        cdef Aead* a = f.aead
        cdef uint8_t* p
        cdef uint8_t* out = <uint8_t*>self.fout
        cdef ssize_t sealed, used
        cdef size_t total, pos = 0, o = 0
        cdef uint8_t head[2]
        cdef uint8_t key[32]
        if n < FRAMED_READ and not f.rdhup[di]:
            f.readable[di] = 0  # a short read drained src
        if di == 0:
            sealed = _seal_chunks(a, <uint8_t*>self.fin + VMESS_WIRE, n, out)
            if sealed < 0:
                self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
                return -1
            return self._send_rest(f, 0, self.fout, <size_t>sealed, now)
        total = a.pend_len + n
        p = <uint8_t*>self.fin + VMESS_WIRE - a.pend_len
        if a.pend_len:
            memcpy(p, a.pend, a.pend_len)
        if a.vmess:
            used = self._vmess_opened(f, a, p, total, &o, now)
            if used < 0 or self._keep(f, a, p + used, total - <size_t>used, VMESS_WIRE, now) < 0:
                return -1
            return self._send_rest(f, 1, self.fout, o, now) if o else 0
        if not a.keyed and total >= a.key_len:
            # the server's salt is in: its subkey opens everything from here on
            if honk_ss_subkey(a.master, a.key_len, p, key) < 0 or honk_aead_key(a.opener, key, 0) < 0:
                OPENSSL_cleanse(key, 32)
                self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
                return -1
            OPENSSL_cleanse(key, 32)
            a.keyed = 1
            pos = a.key_len
        while a.keyed:
            if a.plen < 0:
                if total - pos < SS_HEAD:
                    break
                if honk_open(a.opener, a.open_nonce, p + pos, 2, head) < 0:
                    self._framing_failed(f, EBADMSG, now)
                    return -1
                a.plen = (head[0] << 8) | head[1]
                if a.plen > SS_MAX_PAYLOAD:  # SIP004: the two high bits are reserved, zero
                    self._framing_failed(f, EPROTO, now)
                    return -1
                pos += SS_HEAD
            if total - pos < <size_t>a.plen + SS_TAG:
                break
            if honk_open(a.opener, a.open_nonce, p + pos, a.plen, out + o) < 0:
                self._framing_failed(f, EBADMSG, now)
                return -1
            o += <size_t>a.plen
            pos += <size_t>a.plen + SS_TAG
            a.plen = -1
        if self._keep(f, a, p + pos, total - pos, CHUNK_WIRE, now) < 0:
            return -1
        return self._send_rest(f, 1, self.fout, o, now) if o else 0

    cdef inline void _took(self, Flow* f, int di, uint64_t* counter, size_t n, double now) noexcept nogil:
        """n bytes read from side di: counted, and the first from the upstream announced."""
        honk_store64(counter, counter[0] + <uint64_t>n)
        if di == 1 and not f.first_down and f.tls == NULL:  # TLS: at its first plaintext byte
            f.first_down = 1
            self._emit(f, K_FIRST_BYTE, <int64_t>f.bytes_up, <int64_t>f.bytes_down, now)

    cdef int _reserve(self, Flow* f, Dir* d, size_t size, double now) noexcept nogil:
        """Grow d's buffer to at least size bytes: 0, or -1 if the flow ended for want of memory."""
        cdef char* grown
        if d.cap >= size:
            return 0
        grown = <char*>realloc(d.buf, size)
        if grown == NULL:
            self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
            return -1
        d.buf = grown
        d.cap = size
        return 0

    cdef int _keep(self, Flow* f, Aead* a, uint8_t* rest, size_t n, size_t cap, double now) noexcept nogil:
        """Keep the incomplete rest of a read (n < cap bytes) in a for the next one. 0, or -1 if
        the flow ended."""
        if n:
            if a.pend == NULL:
                a.pend = <char*>malloc(cap)
                if a.pend == NULL:
                    self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                    return -1
            memcpy(a.pend, rest, n)
        a.pend_len = <uint32_t>n
        return 0

    cdef ssize_t _vmess_opened(self, Flow* f, Aead* a, uint8_t* p, size_t total, size_t* opened,
                               double now) noexcept nogil:
        """Open the VMess response in p[0:total] (kept bytes, then the new ones): its sealed header
        once, then every complete chunk, the plaintext into fout (``opened`` bytes). How many
        bytes of p were used (the incomplete rest is the caller's to keep), or -1 if the flow
        ended."""
        cdef uint8_t* out = <uint8_t*>self.fout
        cdef size_t pos = 0, o = 0
        cdef uint32_t size
        cdef int err
        cdef uint8_t head[2]
        cdef uint8_t header[VMESS_HEADER_MAX]
        cdef uint8_t nonce[12]
        a.got_any = 1
        while not a.keyed:
            if a.hlen < 0:
                if total - pos < SS_HEAD:
                    break
                err = _open_once(a.hdr_len_key, a.hdr_len_nonce, p + pos, 2, head)
                if err:
                    self._framing_failed(f, err, now)
                    return -1
                a.hlen = (head[0] << 8) | head[1]
                if a.hlen < 4 or a.hlen > VMESS_HEADER_MAX:
                    self._framing_failed(f, EPROTO, now)
                    return -1
                pos += SS_HEAD
            if total - pos < <size_t>a.hlen + SS_TAG:
                break
            err = _open_once(a.hdr_key, a.hdr_nonce, p + pos, a.hlen, header)
            if err == 0 and header[0] != a.check:
                err = EBADMSG  # a response to another request
            elif err == 0 and header[2] != 0 and a.hlen < 4 + header[3]:
                err = EPROTO  # a command longer than the header
            if err:
                self._framing_failed(f, err, now)
                return -1
            pos += <size_t>a.hlen + SS_TAG
            a.keyed = 1
        while a.keyed and not a.ended:
            if a.plen < 0:
                if total - pos < 2:
                    break
                size = ((p[pos] << 8) | p[pos + 1]) ^ honk_shake128_next16(a.open_mask, &a.open_mask_pos)
                if size < a.tag:
                    self._framing_failed(f, EPROTO, now)
                    return -1
                a.plen = <int32_t>size
                pos += 2
            if total - pos < <size_t>a.plen:
                break
            if a.opener == NULL:
                memcpy(out + o, p + pos, a.plen)
            else:
                memcpy(nonce, a.open_nonce, 12)
                honk_vmess_nonce(nonce, &a.open_count)
                if honk_open(a.opener, nonce, p + pos, a.plen - a.tag, out + o) < 0:
                    self._framing_failed(f, EBADMSG, now)
                    return -1
            if a.plen == a.tag:
                a.ended = 1  # the empty chunk: the server's side of the body is over
            o += <size_t>(a.plen - a.tag)
            pos += <size_t>a.plen
            a.plen = -1
        if a.ended and total > pos:
            self._framing_failed(f, EPROTO, now)  # bytes after the ending chunk
            return -1
        opened[0] = o
        return <ssize_t>pos

    cdef int _framed_eof(self, Flow* f, int di, double now) noexcept nogil:
        """EOF on a framed flow's side di: from the upstream, a verdict if its answer was cut
        short (or, for VMess, never began); from the client, VMess's ending chunk is queued.
        0, or -1 if the flow ended."""
        cdef Aead* a = f.aead
        if di == 0:
            return self._vmess_end(f, now) if a.vmess else 0
        if a.vmess and not a.got_any:
            self._framing_failed(f, ENOMSG, now)  # the server closed without answering
            return -1
        if a.pend_len or a.plen >= 0 or (a.vmess and not a.keyed):
            self._framing_failed(f, ENODATA, now)  # EOF inside the salt, header or a chunk: truncated
            return -1
        return 0

    cdef int _vmess_end(self, Flow* f, double now) noexcept nogil:
        """The client is done: queue VMess's empty chunk, which goes out before the upstream's FIN.
        0, or -1 if the flow ended."""
        cdef Dir* d = &f.d[0]
        cdef ssize_t w
        if self._reserve(f, d, SS_HEAD, now) < 0:
            return -1
        w = _vmess_chunk(f.aead, NULL, 0, <uint8_t*>d.buf)
        if w < 0:
            self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
            return -1
        d.off = 0
        d.len = <size_t>w
        return 0

    cdef void _framing_failed(self, Flow* f, int err, double now) noexcept nogil:
        """End a framed flow for what its upstream sent, on the upstream side, and count it:
        EBADMSG (a tag did not verify), EPROTO (a length over 0x3FFF), ENODATA (EOF inside
        the salt or a chunk)."""
        if err == EBADMSG:
            honk_store64(&self.n_auth, self.n_auth + 1)
        else:
            honk_store64(&self.n_proto, self.n_proto + 1)
        self._end(f, C_ERROR, (1 << 16) | err, now)

    cdef int _framed_buffers(self, Flow* f, double now) noexcept nogil:
        """A framed flow starts: both directions copy (never splice), and the engine's framing
        buffers exist. 0, or -1 if the flow ended for want of memory."""
        f.d[0].copy = 1
        f.d[1].copy = 1
        if self.fin == NULL:
            self.fin = <char*>malloc(FRAMED_BUF)
            self.fout = <char*>malloc(FRAMED_BUF)
            if self.fin == NULL or self.fout == NULL:
                free(self.fin)
                free(self.fout)
                self.fin = self.fout = NULL
                self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
                return -1
        return 0

    # -- TLS flows (Trojan, VLESS or VMess over TLS) ------------------------------------------

    cdef int _tls_start(self, Flow* f, double now) noexcept nogil:
        """A TLS flow starts: the preamble (the client's early bytes) is sealed with SSL_write into
        the up direction's buffer, followed by our close_notify when the client is already done.
        Nothing is sent yet (the fds are not registered). 0, or -1 if the flow ended."""
        cdef TlsState* t = f.tls
        cdef Dir* d = &f.d[0]
        if self._framed_buffers(f, now) < 0:
            return -1
        cdef bint failed
        cdef uint8_t* sealed
        cdef size_t raw = t.raw_len
        if d.len:
            if t.inner != NULL:  # the preamble has no bound: chunks in a buffer of its own
                failed = raw != 0 and _tls_put(t, <uint8_t*>d.buf, raw, 0) < 0
                if not failed and d.len > raw:
                    sealed = <uint8_t*>malloc(WS_HEADROOM + d.len - raw + _vmess_overhead(d.len - raw))
                    failed = sealed == NULL or _tls_put_sealed(t, <uint8_t*>d.buf + raw, d.len - raw, sealed) < 0
                    free(sealed)
            else:
                failed = _tls_put(t, <uint8_t*>d.buf, d.len, 0) < 0
            if failed:
                ERR_clear_error()
                self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
                return -1
            d.off = d.len = 0
        if d.src_eof and self._tls_ending(f, now) < 0:
            return -1
        return self._wbio_owed(f, now)

    cdef int _tls_ending(self, Flow* f, double now) noexcept nogil:
        """The client is done: VMess's ending chunk, then our close_notify (not over WebSocket,
        which has no half-close), into the write BIO. 0, or -1 if the flow ended."""
        cdef TlsState* t = f.tls
        cdef uint8_t ending[2 + SS_TAG]
        cdef ssize_t w
        if t.inner != NULL:
            w = _vmess_chunk(t.inner, NULL, 0, ending)
            if w < 0 or _tls_put(t, ending, <size_t>w, 0) < 0:
                ERR_clear_error()
                self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
                return -1
        if not t.ws:
            SSL_shutdown(t.ssl)  # once: a second call would wait for the server's and eat its data
            ERR_clear_error()
        return 0

    cdef int _tls_up(self, Flow* f, size_t n, double now) noexcept nogil:
        """The n client bytes just read into fin + VMESS_WIRE: sealed (one record per 16 KiB) and
        sent on. 0, or -1 if the flow ended."""
        cdef bint failed
        if n < FRAMED_READ and not f.rdhup[0]:
            f.readable[0] = 0  # a short read drained src
        _tls_buffers(f.tls, n)
        if f.tls.inner != NULL:  # chunks into fout (FRAMED_READ + their overhead fit), then records
            failed = _tls_put_sealed(f.tls, <uint8_t*>self.fin + VMESS_WIRE, n, <uint8_t*>self.fout) < 0
        else:  # WebSocket frames' headers go into the read's headroom (VMESS_WIRE bytes)
            failed = _tls_put(f.tls, <uint8_t*>self.fin + VMESS_WIRE, n, 1) < 0
        if failed:
            ERR_clear_error()
            self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
            return -1
        return self._tls_flush(f, now)

    cdef int _tls_down(self, Flow* f, size_t n, double now) noexcept nogil:
        """The n upstream wire bytes just read into fin + VMESS_WIRE: into the SSL's read BIO, every
        complete record opened, the plaintext (past a VLESS header) sent to the client. What SSL
        wrote meanwhile (a KeyUpdate reply) goes upstream; a close_notify ends the server's side
        as an EOF does. 0, or -1 if the flow ended."""
        cdef TlsState* t = f.tls
        cdef size_t o = 0
        # VMess inside: the plaintext is reassembled in fin behind up to VMESS_WIRE kept bytes
        cdef size_t cap = FRAMED_READ if t.inner != NULL else FRAMED_BUF
        cdef int r, err
        cdef bint close_notify = 0
        if n < FRAMED_READ and not f.rdhup[1]:
            f.readable[1] = 0
        _tls_buffers(t, n)
        if BIO_write(t.rbio, self.fin + VMESS_WIRE, <int>n) != <int>n:
            ERR_clear_error()
            self._end(f, C_ERROR, (S_LOCAL << 16) | ENOMEM, now)
            return -1
        while True:
            r = SSL_read(t.ssl, self.fout + o, <int>(cap - o))
            if r > 0:
                o += <size_t>r
                if o == cap:
                    if self._tls_deliver(f, o, now) < 0:
                        return -1
                    o = 0
                continue
            err = SSL_get_error(t.ssl, r)
            if err == SSL_ERROR_WANT_READ:
                break
            if err == SSL_ERROR_ZERO_RETURN:
                close_notify = 1  # noted once what came before it is delivered (WebSocket drops what follows a close)
                break
            # a record that does not decrypt or parse, or an alert: the plaintext of this read is dropped
            t.err = <uint32_t>ERR_peek_error()
            if t.err == 0:
                t.err = TLS_ERR_UNKNOWN
            ERR_clear_error()  # the queue is per thread: the next flow starts with it empty
            self._framing_failed(f, EPROTO, now)
            return -1
        ERR_clear_error()
        if o and self._tls_deliver(f, o, now) < 0:
            return -1
        if close_notify:
            t.closed = 1
        if f.d[0].src_eof:
            honk_bio_reset(t.wbio)  # nothing may follow our close_notify
        elif self._tls_flush(f, now) < 0:
            return -1
        if t.closed:
            if self._tls_eof(f, 1, now) < 0:
                return -1
            f.d[1].src_eof = 1
            f.readable[1] = 0
        return 0

    cdef int _tls_deliver(self, Flow* f, size_t n, double now) noexcept nogil:
        """n plaintext bytes in fout from the server: the first is announced, a VLESS response
        header is checked and stripped, the rest goes to the client. 0, or -1 if the flow ended."""
        cdef TlsState* t = f.tls
        cdef uint8_t* p = <uint8_t*>self.fout
        cdef size_t pos = 0, k
        if t.ws:
            if _ws_unframe(t, p, &n) < 0:
                self._framing_failed(f, EPROTO, now)
                return -1
            if n == 0:
                return 0  # headers, control frames or what followed a close
        if not t.got_any:
            t.got_any = 1
            if not f.first_down:
                f.first_down = 1
                self._emit(f, K_FIRST_BYTE, <int64_t>f.bytes_up, <int64_t>f.bytes_down, now)
        if t.inner != NULL:
            return self._tls_vmess(f, p, n, now)
        while t.stage < TLS_STAGE_DONE and pos < n:
            if t.stage == 0:
                if p[pos] != t.version:  # another protocol answered
                    t.bad_version = p[pos]
                    t.has_bad_version = 1
                    self._framing_failed(f, EPROTO, now)
                    return -1
                t.stage = 1
                pos += 1
            elif t.stage == 1:
                t.skip = p[pos]
                t.stage = 2 if t.skip else TLS_STAGE_DONE
                pos += 1
            else:
                k = n - pos if n - pos < t.skip else t.skip
                pos += k
                t.skip -= <uint16_t>k
                if t.skip == 0:
                    t.stage = TLS_STAGE_DONE
        if pos == n:
            return 0
        return self._owe(f, 1, self.fout + pos, n - pos, now)

    cdef int _tls_vmess(self, Flow* f, uint8_t* p, size_t n, double now) noexcept nogil:
        """n bytes of the server's VMess stream (plaintext at p, in fout): put behind the bytes kept
        from the last ones in fin (whose wire bytes are in the read BIO by now), every complete
        chunk opened into fout and sent to the client, the incomplete rest kept. 0, or -1."""
        cdef Aead* a = f.tls.inner
        cdef uint8_t* q = <uint8_t*>self.fin + VMESS_WIRE
        cdef size_t o = 0
        cdef ssize_t used
        memcpy(q, p, n)
        if a.pend_len:
            q -= a.pend_len
            memcpy(q, a.pend, a.pend_len)
        used = self._vmess_opened(f, a, q, a.pend_len + n, &o, now)
        if used < 0 or self._keep(f, a, q + used, a.pend_len + n - <size_t>used, VMESS_WIRE, now) < 0:
            return -1
        return self._owe(f, 1, self.fout, o, now) if o else 0

    cdef int _tls_eof(self, Flow* f, int di, double now) noexcept nogil:
        """EOF on a TLS flow's side di. From the client: our close_notify goes upstream (before the
        FIN). From the upstream (its FIN or close_notify): clean, unless the inner protocol's answer
        never came (FRAMING_SILENT) or stopped inside its header (FRAMING_TRUNCATED). 0, or -1."""
        cdef TlsState* t = f.tls
        if di == 0:
            if t.ws and t.inner == NULL:
                return 0  # no half-close in WebSocket: nothing goes up, the write side stays open
            if self._tls_ending(f, now) < 0:
                return -1
            return self._tls_flush(f, now)
        if not t.got_any:
            self._framing_failed(f, ENOMSG, now)
            return -1
        if t.stage < TLS_STAGE_DONE or (t.inner != NULL and (t.inner.pend_len or t.inner.plen >= 0
                                                              or not t.inner.keyed)):
            self._framing_failed(f, ENODATA, now)  # inside VLESS's header, or VMess's header or a chunk
            return -1
        return 0

    cdef int _tls_refused(self, Flow* f) noexcept nogil:
        """A write to the upstream failed (EPIPE, ECONNRESET) before the server sent any plaintext:
        whether what it had sent was its close (close_notify, EOF, or a reset) and nothing else.
        Trojan and VLESS servers refuse a credential that way (a reset when bytes were left
        unread), and a client byte sent meanwhile meets a reset: the refusal, not the write, is
        the flow's story (as the bridge reports it)."""
        cdef TlsState* t = f.tls
        cdef ssize_t n
        cdef size_t got
        cdef int r, err
        if self.fin == NULL or f.fd[1] < 0:
            return 0
        while True:
            n = recv(f.fd[1], self.fin + VMESS_WIRE, FRAMED_READ, MSG_DONTWAIT)
            if n == 0:
                return 1
            if n < 0:  # a reset before any answer is a refusal too (a server that closes with bytes unread)
                return 1 if errno == ECONNRESET else 0
            if BIO_write(t.rbio, self.fin + VMESS_WIRE, <int>n) != <int>n:
                ERR_clear_error()
                return 0
            while True:
                r = SSL_read(t.ssl, self.fout, FRAMED_BUF)
                if r > 0:
                    if not t.ws:
                        return 0  # it answered after all
                    got = <size_t>r  # over WebSocket only a data frame's payload is an answer
                    if _ws_unframe(t, <uint8_t*>self.fout, &got) < 0 or got:
                        return 0
                    if t.closed:
                        return 1  # a close frame: the refusal
                    continue
                err = SSL_get_error(t.ssl, r)
                ERR_clear_error()
                if err == SSL_ERROR_ZERO_RETURN:
                    return 1
                if err != SSL_ERROR_WANT_READ:
                    return 0
                break

    cdef int _tls_flush(self, Flow* f, double now) noexcept nogil:
        """Send what SSL wrote into its write BIO on to the upstream: straight from fout when the up
        direction owes nothing, else behind what it owes. 0, or -1 if the flow ended."""
        cdef Dir* d = &f.d[0]
        cdef int k
        if d.off < d.len or not f.writable[1]:
            return self._wbio_owed(f, now)
        while True:
            k = self._wbio_take(f, now)
            if k <= 0:
                return k
            if self._owe(f, 0, self.fout, <size_t>k, now) < 0:
                return -1

    cdef int _wbio_take(self, Flow* f, double now) noexcept nogil:
        """Read up to FRAMED_BUF bytes of what SSL wrote into fout: how many (0: none), or -1 if
        the flow ended."""
        cdef size_t pend = BIO_ctrl_pending(f.tls.wbio)
        cdef int k
        if pend == 0:
            return 0
        k = BIO_read(f.tls.wbio, self.fout, <int>(pend if pend < FRAMED_BUF else FRAMED_BUF))
        if k <= 0:
            ERR_clear_error()
            self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
            return -1
        return k

    cdef int _wbio_owed(self, Flow* f, double now) noexcept nogil:
        """Move what SSL wrote into its write BIO behind the bytes the up direction owes the
        upstream (sent by _pump when it is writable). 0, or -1 if the flow ended."""
        cdef TlsState* t = f.tls
        cdef Dir* d = &f.d[0]
        cdef size_t pend = BIO_ctrl_pending(t.wbio)
        cdef int k
        while pend:
            if d.off:  # compact: the unsent bytes move to the front
                memmove(d.buf, d.buf + d.off, d.len - d.off)
                d.len -= d.off
                d.off = 0
            if self._reserve(f, d, d.len + pend, now) < 0:
                return -1
            k = BIO_read(t.wbio, d.buf + d.len, <int>pend)
            if k <= 0:
                ERR_clear_error()
                self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
                return -1
            d.len += <size_t>k
            pend = BIO_ctrl_pending(t.wbio)
        return 0

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
        if self._reserve(f, d, d.len + n, now) < 0:
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
                and self._tls_refused(f)):
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
