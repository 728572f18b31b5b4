# C-level contract of honk._fast.relay_c (the compiled relay engine).
#
# Ownership, in one place:
#   * the asyncio thread owns the slot table (``blocks``/``free_slots``), the
#     Python objects and the ``events``/``spare`` swap on drain;
#   * the worker thread owns every ``Flow`` field except ``bytes_*`` (written
#     by the worker, read atomically by the asyncio thread) from the moment it
#     takes the ADD command until it publishes the flow's END event; after
#     END the worker never touches that slot again;
#   * ``lock`` guards ``cmds``, ``events`` and ``draining`` only; nothing else is shared.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "<openssl/evp.h>" nogil:
    ctypedef struct EVP_CIPHER_CTX:
        pass
    ctypedef struct EVP_CIPHER:
        pass


cdef extern from "<openssl/ssl.h>" nogil:
    ctypedef struct SSL:
        pass
    ctypedef struct BIO:
        pass


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t*, void*)
    int pthread_mutex_destroy(pthread_mutex_t*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_unlock(pthread_mutex_t*)


# One direction of a flow: src fd -> (pipe | user-space buffer) -> dst fd.
cdef struct Dir:
    int pr                # pipe read end; -1 in copy mode and before the direction splices
    int pw                # pipe write end; -1 likewise
    size_t in_pipe        # bytes sitting in the pipe (bytes)
    char* buf             # user-space bytes owed to dst: the preamble, a short send's rest, or the copy buffer
    size_t off            # first unsent byte in buf
    size_t len            # end of the unsent bytes in buf
    size_t cap            # allocated size of buf (bytes)
    uint8_t copy          # recv/send instead of splice (EINVAL from splice, or forced)
    uint8_t src_eof       # src returned EOF (or the handshake saw it)
    uint8_t shut          # shutdown(dst, SHUT_WR) done: this direction is finished
    uint8_t big           # the pipe was grown to the engine's bulk size (not pooled)
    uint8_t grow_tried    # growing was tried once (granted or not)


cdef enum:
    HS_BUF = 1024         # bytes of one client's handshake (greeting, request, early payload) read by the worker


# The framing state of one framed flow: Shadowsocks AEAD (SIP004) or a VMess body
# (``vmess`` set). Built by the asyncio thread (add/hs_relay) from the framing object,
# owned by the worker from the command on, freed when the flow ends.
cdef struct Aead:
    EVP_CIPHER_CTX* sealer    # client -> upstream, keyed with the encryptor's subkey (VMess: the body key; NULL for none)
    EVP_CIPHER_CTX* opener    # upstream -> client, keyed once the server's salt is in (VMess: from the start)
    const EVP_CIPHER* cipher
    char* pend                # upstream bytes of an incomplete salt, header or chunk kept between reads
    uint32_t pend_len
    int32_t plen              # wire length of the open chunk's payload part once its length is read (-1: none)
    uint8_t key_len           # subkey and salt size (bytes)
    uint8_t keyed             # opener has the server's subkey (VMess: the response header checked)
    uint8_t seal_nonce[12]    # little-endian counters, one step per AEAD operation (VMess: count + IV bytes 2..11)
    uint8_t open_nonce[12]
    uint8_t master[32]
    # VMess only (see "VMess bodies" in relay_c's docstring)
    uint8_t vmess
    uint8_t tag               # bytes of a chunk's tag: 16, or 0 for security none
    uint8_t check             # the response header's first byte must echo it
    uint8_t got_any           # a byte of the response arrived (EOF before it: the server never answered)
    uint8_t ended             # the response's empty chunk arrived: nothing may follow
    int32_t hlen              # the response header's sealed length once its length field is open (-1: not yet)
    uint16_t seal_count       # chunk counts, the first two nonce bytes
    uint16_t open_count
    uint32_t seal_mask_pos
    uint32_t open_mask_pos
    uint64_t seal_mask[25]    # SHAKE128 sponges over the request and response body IVs (option M)
    uint64_t open_mask[25]
    uint8_t hdr_len_key[16]   # AES-128-GCM key and nonce of the response header's length field
    uint8_t hdr_len_nonce[12]
    uint8_t hdr_key[16]       # ... and of the response header itself
    uint8_t hdr_nonce[12]


# The state of one TLS flow (a ``TlsFraming``: Trojan or VLESS over TLS). The ``SSL*`` and its
# memory BIOs belong to the framing's Python SSLObject, which the engine keeps alive (its
# ``_framings``) until the flow's END is delivered; the worker alone drives them from the
# command on. The record itself is built by the asyncio thread and freed when the flow ends.
cdef struct TlsState:
    SSL* ssl
    BIO* rbio                 # the SSLObject's incoming MemoryBIO: upstream wire bytes go in here
    BIO* wbio                 # its outgoing MemoryBIO: records for the upstream come out here
    uint32_t err              # the OpenSSL error code of a failed read (TLS_ERR_UNKNOWN without one)
    uint16_t skip             # VLESS: addons bytes of the response header still to skip
    uint8_t version           # VLESS: the byte the response must start with
    uint8_t stage             # VLESS header: 0 version next, 1 addons length next, 2 addons, 3 done (Trojan: 3)
    uint8_t got_any           # a plaintext byte arrived (EOF before one: the inner protocol's refusal)
    uint8_t bad_version       # VLESS: the byte that came instead of the version
    uint8_t has_bad_version
    uint8_t closed            # the server's close_notify arrived
    uint8_t keep_bufs         # SSL_MODE_RELEASE_BUFFERS is off while a direction moves bulk (see _tls_buffers)
    Aead* inner               # VMess inside the records (its chunks both ways), or NULL
    uint32_t raw_len          # hs_connect with inner: bytes of the head written as they are (VMess's header)
    # hs_connect: the worker drives the handshake itself (see "TLS handshakes" in relay_c)
    uint8_t handshaking       # the handshake is the worker's to finish
    uint8_t hs_started        # SSL_do_handshake has run
    uint8_t facts             # once finished: TLS_RESUMED | TLS_13 (EV_OPEN's b)
    char* hs_out              # handshake bytes the upstream has not taken yet (a short send)
    uint32_t hs_out_len
    uint32_t hs_out_off
    # WebSocket inside the records (see "WebSocket inside TLS" in relay_c)
    uint8_t ws                # client bytes go out as masked binary frames; the server's are unframed
    uint8_t ws_hlen           # bytes of the server's current frame header in ws_hdr
    uint8_t ws_hneed          # bytes that header needs (2, then with its extended length)
    uint8_t ws_op             # the current frame's opcode, once its header is complete
    uint8_t ws_in_payload     # the header is complete: ws_left payload bytes to go
    uint8_t ws_ctl_len        # a control frame's payload so far (a ping's, echoed in the pong)
    uint8_t ws_error          # why a server frame was refused (WS_ERR_*, 0: none)
    uint8_t ws_ping_due       # a ping came in this batch of plaintext: the last one gets the pong
    uint8_t ws_ping_len
    uint8_t ws_hdr[10]
    uint8_t ws_ctl[125]       # WS_MAX_CONTROL bytes (relay_c; a pxd array takes a literal)
    uint8_t ws_ping[125]      # the last ping's payload, echoed in the pong (WS_MAX_CONTROL bytes)
    uint64_t ws_left


# A listening socket the worker accepts on (listener mode). Allocated by the
# asyncio thread, registered by a LISTEN command, freed only by _release.
cdef struct Lst:
    uint64_t id           # listener id (key of Engine._lsts)
    int fd                # the engine's own dup of the listening socket, -1 once closed
    uint64_t accepted     # connections accepted so far (atomic: read by the asyncio thread)
    double paused_until   # out of epoll until then after EMFILE & co (0: accepting)


# One accepted client in its SOCKS5 handshake. The worker owns it from accept
# until it emits REQUEST (then the asyncio thread holds it until its command
# gives it back) or HANDOVER (then the asyncio thread takes the fd and frees it).
cdef struct Hs:
    int fd
    int err               # errno of the read that made the worker hand over (0 if none)
    uint64_t lid
    uint8_t state         # HS_GREETING, HS_REQUEST, HS_WAITING, HS_DEAD
    uint8_t answered      # bytes of our replies already sent to the client
    uint8_t peer_len
    uint16_t len          # bytes read into buf
    uint16_t req_off      # the request starts here in buf
    uint16_t req_end      # and ends here; buf[req_end:len] is early payload
    double deadline       # CLOCK_MONOTONIC: hand the client over to Python after this
    Hs* prev              # the worker's handshake list, oldest first
    Hs* next
    char peer[28]         # the client's sockaddr_in / sockaddr_in6
    char buf[HS_BUF]


cdef struct Flow:
    uint64_t id           # written by the worker at ADD; CANCEL must match it
    int fd[2]             # [0] client, [1] upstream
    Dir d[2]              # [0] up: client -> upstream, [1] down: upstream -> client
    uint64_t bytes_up     # bytes read from the client (atomic store/load)
    uint64_t bytes_down   # bytes read from the upstream (atomic store/load)
    uint64_t rep_up       # last reported totals
    uint64_t rep_down
    double next_report    # CLOCK_MONOTONIC seconds before which no BYTES event goes out
    uint8_t readable[2]   # edge-triggered readiness we have not yet consumed, per fd
    uint8_t writable[2]
    uint8_t rdhup[2]      # FIN, HUP or an error announced on the fd: read on to EOF, a short read proves nothing
    uint8_t first_down    # FIRST_BYTE already reported
    uint8_t ended
    uint8_t queued        # on the worker's "again" list (budget ran out)
    uint8_t dirty         # on the worker's "report later" list
    uint8_t half_pending  # the first EOF forwarded (side + 1), told with the next report; 0: none
    uint8_t connecting    # listener mode: the upstream connect is in progress, no reply sent yet
    uint8_t fail_code     # listener mode: the SOCKS5 reply a cancel during the connect sends
    uint8_t owned         # both fds are the worker's alone (listener mode): close() drops their epoll entries
    Aead* aead            # Shadowsocks framing (both directions copy through it), or NULL for plain bytes
    TlsState* tls         # TLS framing (both directions copy through SSL_write/SSL_read), or NULL
    Flow* prev            # the worker's list of live flows
    Flow* next


cdef struct Cmd:
    int kind              # CMD_ADD, CMD_CANCEL, CMD_SHUTDOWN
    Flow* flow
    uint64_t id
    int fd[2]
    char* preamble        # malloc'd, handed to the worker (may be NULL)
    size_t preamble_len
    uint8_t client_eof
    uint8_t copy
    Aead* aead            # ADD/RELAY: the flow's framing (handed to the worker), or NULL
    TlsState* tls         # ADD/RELAY: the flow's TLS framing (handed to the worker), or NULL
    # listener mode
    Hs* hs                # CONNECT/RELAY/REJECT: the handshake the command answers
    Lst* lst              # LISTEN/UNLISTEN
    int mark              # CONNECT: SO_MARK for the upstream socket, -1 for none
    uint8_t code          # REJECT/CANCEL: the SOCKS5 reply code; UNLISTEN: 1 = drop its handshakes
    uint8_t addr_len      # CONNECT: bytes of addr used
    char addr[28]         # CONNECT: the upstream sockaddr_in / sockaddr_in6
    char* head            # CONNECT: bytes for the upstream before any other, as they are (a framed
    size_t head_len       #   protocol's request header, already sealed); malloc'd, handed over


cdef struct Event:
    uint64_t id
    int32_t kind
    int32_t pad
    int64_t a
    int64_t b
    double t              # CLOCK_MONOTONIC seconds (same clock as time.monotonic())


cdef struct Vec:          # a growable array of fixed-size records
    char* data
    size_t n
    size_t cap
    size_t size


cdef class Engine:
    # shared with the worker (behind lock)
    cdef pthread_mutex_t lock
    cdef Vec cmds
    cdef Vec events
    # asyncio-thread side
    cdef Vec spare
    cdef Flow** blocks
    cdef uint32_t* free_slots
    cdef size_t n_free
    cdef size_t cap_free
    cdef uint32_t n_slots
    cdef uint64_t generation
    cdef dict _listeners
    cdef dict _lsts           # listener id -> (listener object, Lst address)
    cdef dict _held           # REQUEST tokens (Hs addresses) the asyncio side holds
    cdef dict _framings       # flow id -> TlsFraming: its SSLObject lives until the flow's END is delivered
    cdef set _handshakes      # flow ids of hs_connect TLS flows: their handshake is reported at END
    cdef uint64_t next_lid
    cdef object _loop
    cdef object _thread
    cdef object __weakref__
    # worker side
    cdef int epfd
    cdef int wake_fd          # commands -> worker
    cdef int event_fd         # events -> asyncio
    cdef int pool[64]         # reusable empty pipe pairs (read, write, read, write, ...)
    cdef char scratch[16384]  # THROUGH_CHUNK: a direction's small reads pass through here on their way to dst
    cdef char* fin            # framed reads: CHUNK_WIRE bytes for a kept partial chunk, then FRAMED_READ (worker, lazy)
    cdef char* fout           # framed output: sealed chunks or opened plaintext on their way to dst (worker, lazy)
    cdef uint64_t n_auth      # framed flows ended by an upstream tag that did not verify (atomic)
    cdef uint64_t n_proto     # framed flows ended by broken upstream framing (atomic)
    cdef uint64_t n_wakeups   # event deliveries to the loop's thread (loop's thread only)
    cdef uint64_t n_at_once   # upstream connects finished inside connect() (worker writes, atomic)
    cdef int n_pool
    cdef int pipe_size        # bytes a bulk direction's pipe grows to (<= 0: never grows)
    cdef int n_big            # grown pipes alive (at most MAX_BIG_PIPES)
    cdef Flow* live
    cdef Vec wcmds
    cdef Vec again
    cdef Vec dirty
    cdef Vec local_events
    cdef char events_urgent   # local_events hold an event the loop's thread must see now (see _publish)
    cdef double events_since  # when local_events stopped being empty (CLOCK_MONOTONIC s; < 0: empty)
    cdef Hs* hs_head          # handshakes the worker is reading, oldest first
    cdef Hs* hs_tail
    cdef Vec hs_dead          # Hs freed at the end of the turn (events of this turn may name them)
    cdef Vec lst_all          # every Lst ever created (asyncio side; freed by _release)
    cdef Lst* lst_ptrs[64]    # listeners the worker registered (worker side)
    cdef int lst_n
    cdef char mark_denied     # SO_MARK answered EPERM once: stop asking
    cdef char running
    cdef char stopping
    cdef char draining        # the loop's thread is delivering and looks at ``events`` again (under ``lock``)
    cdef char _closed
    cdef char lock_ready
    cdef readonly str implementation

    cdef Flow* _slot(self, uint32_t slot)
    cdef void _free_slot(self, uint32_t slot)
    cdef void _worker(self) noexcept nogil
    cdef void _take_commands(self, double now) noexcept nogil
    cdef void _add(self, Cmd* c, double now) noexcept nogil
    cdef object _push(self, Cmd* c)
    cdef Hs* _take_token(self, token) except NULL
    cdef object _start_flow(self, Cmd* c, token, listener)
    cdef object _deliver(self)
    cdef void _drained(self) noexcept
    cdef uint32_t _new_slot(self) except? 0xFFFFFFFF
    cdef int _pump(self, Flow* f, int di, double now) noexcept nogil
    cdef int _pass_through(self, Flow* f, int di, size_t n, double now) noexcept nogil
    cdef int _send_rest(self, Flow* f, int di, const char* data, size_t n, double now) noexcept nogil
    cdef int _owe(self, Flow* f, int di, const char* data, size_t n, double now) noexcept nogil
    cdef int _append(self, Flow* f, Dir* d, const char* data, size_t n, double now) noexcept nogil
    cdef void _took(self, Flow* f, int di, uint64_t* counter, size_t n, double now) noexcept nogil
    cdef void _service(self, Flow* f, double now) noexcept nogil
    cdef void _end(self, Flow* f, int cause, int side_errno, double now) noexcept nogil
    cdef void _emit(self, Flow* f, int kind, int64_t a, int64_t b, double now) noexcept nogil
    cdef void _report(self, Flow* f, double now) noexcept nogil
    cdef void _report_later(self, Flow* f) noexcept nogil
    cdef void _half_closed(self, Flow* f, int di, double now) noexcept nogil
    cdef void _publish(self, double now) noexcept nogil
    cdef int _take_pipe(self, Dir* d) noexcept nogil
    cdef void _drop_pipe(self, Dir* d) noexcept nogil
