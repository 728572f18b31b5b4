# Included by relay_c.pyx. Listener mode, the SOCKS5 CONNECT fast path: accepting clients,
# reading their handshakes (judged by socks5hs.h), dialling the upstream the asyncio side
# chose, and delivering the listener's events.

cdef object _listener_event(Engine self, Event* e):
    cdef Hs* h = <Hs*>e.a
    cdef char host[HONK_HS_HOST_MAX]
    cdef char src[46]
    cdef int src_port, port
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
    port = honk_hs_target(<uint8_t*>h.buf, h.req_off, host)
    target = host.decode("ascii")
    token = <size_t>h
    self._held[token] = True
    if listener is None:
        self.hs_reject(token, 1)
        return
    listener.socks_request(token, src_host, src_port, target, port)


cdef void _accept(Engine self, Lst* l, double now) noexcept nogil:
    cdef int k, fd
    cdef Hs* h
    cdef char peer[28]
    cdef uint8_t peer_len
    for k in range(ACCEPT_BURST):
        if l.fd < 0:
            return
        fd = honk_hs_accept(l.fd, peer, &peer_len)
        if fd < 0:
            if errno == EINTR:
                continue
            if errno == EINVAL:  # shut down under us (stop_accepting): nothing more comes
                _unlisten(self, l, 0, now)
            elif errno == EMFILE or errno == ENFILE or errno == ENOBUFS or errno == ENOMEM:
                # Out of descriptors or memory: the listener stays readable, so leave
                # epoll for a while rather than spin; the timer pass below re-arms it.
                honk_epoll_del(self.epfd, l.fd)
                l.paused_until = now + ACCEPT_BACKOFF
                _emit_lst(self, l.id, K_RESTED, errno, now)  # Python counts and warns
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
            _hs_release(self, h, K_HANDOVER)
            continue
        _hs_read(self, h, now)  # the greeting is often there already


cdef void _hs_unlink(Engine self, Hs* h) noexcept nogil:
    if h.prev != NULL:
        h.prev.next = h.next
    else:
        self.hs_head = h.next
    if h.next != NULL:
        h.next.prev = h.prev
    else:
        self.hs_tail = h.prev
    h.prev = h.next = NULL


cdef void _hs_release(Engine self, Hs* h, int kind) noexcept nogil:
    """End the worker's part of a handshake it still reads: HANDOVER (Python takes the fd
    and the bytes) or DROPPED (closed here)."""
    _hs_unlink(self, h)
    if kind == K_DROPPED:
        close(h.fd)
        h.fd = -1
        h.state = HS_DEAD
        _vec_push(&self.hs_dead, &h)
        _emit_lst(self, h.lid, K_DROPPED, 0, 0.0)
        return
    honk_epoll_del(self.epfd, h.fd)
    h.state = HS_DEAD  # Python frees it after the drain; nothing here touches it again
    _emit_lst(self, h.lid, K_HANDOVER, <int64_t>h, 0.0)


cdef void _hs_read(Engine self, Hs* h, double now) noexcept nogil:
    """Read what the client sent and move its handshake on. Only the common case is
    served here (a complete greeting offering no-auth, then a complete CONNECT); anything
    else goes to Python with the bytes read so far (see the module docstring). What the
    bytes mean is socks5hs.h's to say; this reads, answers the greeting and hands on."""
    cdef ssize_t n
    cdef int end, off
    cdef uint8_t* b = <uint8_t*>h.buf
    cdef char hello[2]
    while True:
        if h.len >= HS_BUF:
            _hs_release(self, h, K_HANDOVER)
            return
        n = recv(h.fd, h.buf + h.len, HS_BUF - h.len, MSG_DONTWAIT)
        if n < 0:
            if errno == EAGAIN:
                return
            if errno == EINTR:
                continue
            h.err = errno
            _hs_release(self, h, K_HANDOVER)
            return
        if n == 0:  # EOF: Python reads it again and says what it means
            _hs_release(self, h, K_HANDOVER)
            return
        h.len += <uint16_t>n
        if h.state == HS_GREETING:
            off = honk_hs_greeting(b, h.len)
            if off == HONK_HS_HANDOVER:  # incomplete, or no "no-auth": Python answers it
                _hs_release(self, h, K_HANDOVER)
                return
            hello[0] = 5
            hello[1] = 0
            if send(h.fd, hello, 2, MSG_NOSIGNAL | MSG_DONTWAIT) != 2:
                h.err = errno
                _hs_release(self, h, K_HANDOVER)
                return
            h.answered = 2
            h.req_off = <uint16_t>off
            h.state = HS_REQUEST
        end = honk_hs_request(b, h.len, h.req_off)
        if end == HONK_HS_MORE:
            continue  # nothing after the greeting yet: read until EAGAIN
        if end == HONK_HS_HANDOVER:
            _hs_release(self, h, K_HANDOVER)
            return
        h.req_end = <uint16_t>end
        h.state = HS_WAITING
        _hs_unlink(self, h)
        _emit_lst(self, h.lid, K_REQUEST, <int64_t>h, now)
        return


cdef void _hs_reject(Engine self, Hs* h, int code) noexcept nogil:
    honk_send_reply(h.fd, code)
    close(h.fd)
    h.fd = -1
    h.state = HS_DEAD
    _vec_push(&self.hs_dead, &h)


cdef void _hs_start(Engine self, Cmd* c, double now) noexcept nogil:
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
    if c.kind == CMD_RELAY and c.fd[1] >= 0 and f.aead != NULL and _framed_start(self, f, now) < 0:
        close(c.fd[1])
        return
    if c.kind == CMD_CONNECT and f.aead != NULL and _framed_start(self, f, now) < 0:
        free(c.head)
        return
    if c.kind == CMD_CONNECT and f.tls != NULL and _framed_buffers(self, f, now) < 0:
        free(c.head)  # (a TLS head is plaintext: sealed with the early bytes after the handshake)
        return
    if c.head_len and f.tls != NULL and f.tls.inner != NULL:
        f.tls.raw_len = <uint32_t>c.head_len  # VMess's sealed request header: written as it is
    if c.head_len and _put_head(self, f, c.head, c.head_len, now) < 0:
        return
    if c.kind == CMD_RELAY and c.fd[1] >= 0 and f.tls != NULL and _tls_start(self, f, now) < 0:
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


cdef int _put_head(Engine self, Flow* f, char* head, size_t n, double now) noexcept nogil:
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


cdef void _connected(Engine self, Flow* f, double now) noexcept nogil:
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


cdef int _hs_send(Engine self, Flow* f, double now) noexcept nogil:
    """Send what the handshake wrote into the write BIO; a short send keeps the rest in
    hs_out. 0, or -1 if the flow ended."""
    cdef TlsState* t = f.tls
    cdef ssize_t n
    cdef int k
    cdef char* grown
    while True:
        k = _wbio_take(self, f, now)
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


cdef void _unlisten(Engine self, Lst* l, int drop, double now) noexcept nogil:
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
                _hs_release(self, h, K_DROPPED)
            h = nxt


cdef void _emit_lst(Engine self, uint64_t lid, int kind, int64_t a, double now) noexcept nogil:
    cdef Event e
    e.id = lid
    e.kind = kind
    e.pad = 0
    e.a = a
    e.b = 0
    e.t = now
    _vec_push(&self.local_events, &e)
    self.events_urgent = 1
