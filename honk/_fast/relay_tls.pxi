# Included by relay_c.pyx. TLS flows (a TlsFraming: Trojan, VLESS or VMess over TLS, with or
# without WebSocket): the SSL* of the framing's SSLObject, WebSocket frames inside the records,
# and the worker's steps for a TLS flow, its handshake included.

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



cdef void _tls_release(framing, TlsState* t):
    """Undo _tls_new for a flow the engine refused before the worker took it."""
    if t != NULL:
        _aead_free(t.inner)
        free(t)
        framing.unclaim()


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



cdef int _tls_handshake(Engine self, Flow* f, double now) noexcept nogil:
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
            if _tls_start(self, f, now) < 0:
                return -1
            _connected(self, f, now)
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
        if _hs_send(self, f, now) < 0:
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


cdef int _tls_start(Engine self, Flow* f, double now) noexcept nogil:
    """A TLS flow starts: the preamble (the client's early bytes) is sealed with SSL_write into
    the up direction's buffer, followed by our close_notify when the client is already done.
    Nothing is sent yet (the fds are not registered). 0, or -1 if the flow ended."""
    cdef TlsState* t = f.tls
    cdef Dir* d = &f.d[0]
    if _framed_buffers(self, f, now) < 0:
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
    if d.src_eof and _tls_ending(self, f, now) < 0:
        return -1
    return _wbio_owed(self, f, now)


cdef int _tls_ending(Engine self, Flow* f, double now) noexcept nogil:
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


cdef int _tls_up(Engine self, Flow* f, size_t n, double now) noexcept nogil:
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
    return _tls_flush(self, f, now)


cdef int _tls_down(Engine self, Flow* f, size_t n, double now) noexcept nogil:
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
                if _tls_deliver(self, f, o, now) < 0:
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
        _framing_failed(self, f, EPROTO, now)
        return -1
    ERR_clear_error()
    if o and _tls_deliver(self, f, o, now) < 0:
        return -1
    if close_notify:
        t.closed = 1
    if f.d[0].src_eof:
        honk_bio_reset(t.wbio)  # nothing may follow our close_notify
    elif _tls_flush(self, f, now) < 0:
        return -1
    if t.closed:
        if _tls_eof(self, f, 1, now) < 0:
            return -1
        f.d[1].src_eof = 1
        f.readable[1] = 0
    return 0


cdef int _tls_deliver(Engine self, Flow* f, size_t n, double now) noexcept nogil:
    """n plaintext bytes in fout from the server: the first is announced, a VLESS response
    header is checked and stripped, the rest goes to the client. 0, or -1 if the flow ended."""
    cdef TlsState* t = f.tls
    cdef uint8_t* p = <uint8_t*>self.fout
    cdef size_t pos = 0, k
    if t.ws:
        if _ws_unframe(t, p, &n) < 0:
            _framing_failed(self, f, EPROTO, now)
            return -1
        if n == 0:
            return 0  # headers, control frames or what followed a close
    if not t.got_any:
        t.got_any = 1
        if not f.first_down:
            f.first_down = 1
            self._emit(f, K_FIRST_BYTE, <int64_t>f.bytes_up, <int64_t>f.bytes_down, now)
    if t.inner != NULL:
        return _tls_vmess(self, f, p, n, now)
    while t.stage < TLS_STAGE_DONE and pos < n:
        if t.stage == 0:
            if p[pos] != t.version:  # another protocol answered
                t.bad_version = p[pos]
                t.has_bad_version = 1
                _framing_failed(self, f, EPROTO, now)
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


cdef int _tls_vmess(Engine self, Flow* f, uint8_t* p, size_t n, double now) noexcept nogil:
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
    used = _vmess_opened(self, f, a, q, a.pend_len + n, &o, now)
    if used < 0 or _keep(self, f, a, q + used, a.pend_len + n - <size_t>used, VMESS_WIRE, now) < 0:
        return -1
    return self._owe(f, 1, self.fout, o, now) if o else 0


cdef int _tls_eof(Engine self, Flow* f, int di, double now) noexcept nogil:
    """EOF on a TLS flow's side di. From the client: our close_notify goes upstream (before the
    FIN). From the upstream (its FIN or close_notify): clean, unless the inner protocol's answer
    never came (FRAMING_SILENT) or stopped inside its header (FRAMING_TRUNCATED). 0, or -1."""
    cdef TlsState* t = f.tls
    if di == 0:
        if t.ws and t.inner == NULL:
            return 0  # no half-close in WebSocket: nothing goes up, the write side stays open
        if _tls_ending(self, f, now) < 0:
            return -1
        return _tls_flush(self, f, now)
    if not t.got_any:
        _framing_failed(self, f, ENOMSG, now)
        return -1
    if t.stage < TLS_STAGE_DONE or (t.inner != NULL and (t.inner.pend_len or t.inner.plen >= 0
                                                          or not t.inner.keyed)):
        _framing_failed(self, f, ENODATA, now)  # inside VLESS's header, or VMess's header or a chunk
        return -1
    return 0


cdef int _tls_refused(Engine self, Flow* f) noexcept nogil:
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


cdef int _tls_flush(Engine self, Flow* f, double now) noexcept nogil:
    """Send what SSL wrote into its write BIO on to the upstream: straight from fout when the up
    direction owes nothing, else behind what it owes. 0, or -1 if the flow ended."""
    cdef Dir* d = &f.d[0]
    cdef int k
    if d.off < d.len or not f.writable[1]:
        return _wbio_owed(self, f, now)
    while True:
        k = _wbio_take(self, f, now)
        if k <= 0:
            return k
        if self._owe(f, 0, self.fout, <size_t>k, now) < 0:
            return -1


cdef int _wbio_take(Engine self, Flow* f, double now) noexcept nogil:
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


cdef int _wbio_owed(Engine self, Flow* f, double now) noexcept nogil:
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
        if _reserve(self, f, d, d.len + pend, now) < 0:
            return -1
        k = BIO_read(t.wbio, d.buf + d.len, <int>pend)
        if k <= 0:
            ERR_clear_error()
            self._end(f, C_ERROR, (S_LOCAL << 16) | EIO, now)
            return -1
        d.len += <size_t>k
        pend = BIO_ctrl_pending(t.wbio)
    return 0
