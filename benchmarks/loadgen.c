/*
 * loadgen: the native load tool of honk's relay benchmarks (benchmarks/relay.py).
 *
 * One process holds both ends of the measurement: an origin server thread
 * listening on 127.0.0.1:ORIGIN_PORT and the client, which reaches the origin
 * either directly (the `direct` subject), through a plain TCP forwarder
 * (--target HOST:PORT) or through a SOCKS5 proxy (--target HOST:PORT --socks;
 * no-auth CONNECT to 127.0.0.1:ORIGIN_PORT by IPv4 address). In rate mode it
 * can also be a Trojan client itself (--target SERVER:PORT --trojan PASSWORD
 * --tls-ca FILE [--sni NAME]): TLS on OpenSSL with the certificate verified,
 * the Trojan request for 127.0.0.1:ORIGIN_PORT, no proxy in between: the
 * fastest a client on this machine's OpenSSL can make Trojan connections (the
 * floor the TLS rows are read against). It then also prints client_cpu_ms,
 * its client threads' CPU per connection.
 *
 * The first byte a client sends selects what the origin does with the stream:
 *   'U'  discard everything (bulk up; the origin counts what arrives)
 *   'D'  send zeros until the peer goes away (bulk down)
 *   'E'  echo everything (latency ping-pong)
 *   'R'  read 100 bytes, echo them, close (connection rate)
 *   none: the connection stays idle (idle RSS).
 *
 * Modes (each prints one line of key=value pairs on stdout):
 *   bulk     --streams N --dir up|down --warmup S --duration S
 *   rate     --concurrency N --warmup S --duration S
 *   latency  --count N --size BYTES
 *   idle     --count N   (prints "ready ...", waits for a line or EOF on stdin)
 *   first    one new connection: its time from connect() to the first echoed byte
 *
 * Throughput is counted at the receiving end over the window after the
 * warm-up: the origin's byte counter for up, the client's for down.
 * Everything is bounded: alarm() ends a run that overstays, and the process
 * dies with its parent (PR_SET_PDEATHSIG).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (256 * 1024)
#define ECHO_BYTES 100
#define MAX_THREADS 16
#define MAX_EVENTS 256
#define BURST 16 /* reads or writes per readiness event before going back to epoll (fairness, prompt stop) */

static char g_chunk[CHUNK];

/* shared counters */
static atomic_ullong g_up_bytes;    /* bytes the origin received on 'U' streams */
static atomic_ullong g_down_bytes;  /* bytes the client received on 'D' streams */
static atomic_ullong g_done;        /* completed rate cycles */
static atomic_ullong g_errors;      /* failed rate cycles */
static atomic_ullong g_accepted;    /* connections the origin accepted */
static atomic_int g_stop;

/* options */
static const char *o_mode;
static int o_origin_port;
static struct sockaddr_in o_target;  /* where the client connects */
static int o_socks;
static int o_streams = 1, o_concurrency = 16, o_count = 20000, o_size = 1, o_threads = 1;
static int o_down;
static double o_warmup = 0.5, o_duration = 3.0;
static int o_origin_fd;
static const char *o_trojan;           /* --trojan PASSWORD: speak Trojan over TLS to the target */
static const char *o_tls_ca;           /* --tls-ca FILE: the CA the Trojan server's certificate is verified with */
static const char *o_sni = "localhost";
static SSL_CTX *g_tls;
static atomic_ullong g_client_cpu_ns;  /* rate workers' thread CPU, summed when they end */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_self(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static void die(const char *what) {
    fprintf(stderr, "loadgen: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void set_nonblock(int fd) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void abort_close(int fd) {
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

/* ------------------------------------------------------------------ origin */

enum { O_NEW, O_SINK, O_SOURCE, O_ECHO, O_REQ };

struct oconn {
    unsigned char mode;
    unsigned char got;          /* O_REQ: bytes of the request read so far */
    unsigned short plen;        /* pending echo bytes */
    char pbuf[ECHO_BYTES + 64];
};

static struct oconn *g_oconns;
static int g_max_fd;

static void origin_close(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    g_oconns[fd].mode = O_NEW;
    close(fd);
}

static void origin_want(int ep, int fd, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

/* Echo what is in pbuf; returns -1 when the connection is gone. */
static int origin_flush(int ep, int fd, struct oconn *c) {
    while (c->plen) {
        ssize_t n = send(fd, c->pbuf, c->plen, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN) {
                origin_want(ep, fd, EPOLLOUT);
                return 0;
            }
            return -1;
        }
        memmove(c->pbuf, c->pbuf + n, c->plen - n);
        c->plen -= n;
    }
    origin_want(ep, fd, EPOLLIN);
    return 0;
}

static void origin_readable(int ep, int fd) {
    struct oconn *c = &g_oconns[fd];
    static char buf[CHUNK];
    for (int burst = 0; burst < BURST; burst++) {
        size_t room = CHUNK;
        if (c->mode == O_ECHO) room = sizeof c->pbuf - c->plen;
        if (c->mode == O_REQ) room = 1 + ECHO_BYTES - c->got;
        if (c->mode == O_NEW) room = 1 + ECHO_BYTES;
        if (room == 0) return; /* echo peer is ahead of us: wait for EPOLLOUT */
        ssize_t n = recv(fd, buf, room, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            origin_close(ep, fd);
            return;
        }
        if (n < 0) return;
        char *p = buf;
        if (c->mode == O_NEW) {
            switch (*p) {
            case 'U': c->mode = O_SINK; break;
            case 'D': c->mode = O_SOURCE; origin_want(ep, fd, EPOLLOUT); return;
            case 'E': c->mode = O_ECHO; break;
            case 'R': c->mode = O_REQ; c->got = 1; break;
            default: origin_close(ep, fd); return;
            }
            p++;
            n--;
        }
        switch (c->mode) {
        case O_SINK:
            atomic_fetch_add_explicit(&g_up_bytes, (unsigned long long)n, memory_order_relaxed);
            break;
        case O_ECHO:
            memcpy(c->pbuf + c->plen, p, n);
            c->plen += n;
            if (origin_flush(ep, fd, c) < 0) { origin_close(ep, fd); return; }
            break;
        case O_REQ:
            memcpy(c->pbuf + c->got - 1, p, n);
            c->got += n;
            if (c->got == 1 + ECHO_BYTES) {
                send(fd, c->pbuf, ECHO_BYTES, MSG_NOSIGNAL); /* fits a fresh socket's buffer */
                origin_close(ep, fd);
                return;
            }
            break;
        }
    }
}

static void origin_writable(int ep, int fd) {
    struct oconn *c = &g_oconns[fd];
    if (c->mode == O_ECHO) {
        if (origin_flush(ep, fd, c) < 0) origin_close(ep, fd);
        return;
    }
    if (c->mode != O_SOURCE) return;
    for (int burst = 0; burst < BURST; burst++) {
        ssize_t n = send(fd, g_chunk, CHUNK, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN) origin_close(ep, fd);
            return;
        }
    }
}

static void *origin_main(void *arg) {
    (void)arg;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = o_origin_fd}, evs[MAX_EVENTS];
    epoll_ctl(ep, EPOLL_CTL_ADD, o_origin_fd, &ev);
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, 100);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == o_origin_fd) {
                int cfd;
                while ((cfd = accept4(o_origin_fd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (cfd >= g_max_fd) { close(cfd); continue; }
                    set_nodelay(cfd);
                    memset(&g_oconns[cfd], 0, sizeof g_oconns[cfd]);
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &cev);
                    atomic_fetch_add(&g_accepted, 1);
                }
                continue;
            }
            if (evs[i].events & EPOLLIN) origin_readable(ep, fd);
            else if (evs[i].events & EPOLLOUT) origin_writable(ep, fd);
            else origin_close(ep, fd); /* EPOLLERR/EPOLLHUP alone */
        }
    }
    return NULL;
}

static void origin_start(void) {
    o_origin_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(o_origin_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(o_origin_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(o_origin_fd, (struct sockaddr *)&a, sizeof a) < 0) die("bind origin");
    if (listen(o_origin_fd, 4096) < 0) die("listen origin");
    socklen_t len = sizeof a;
    getsockname(o_origin_fd, (struct sockaddr *)&a, &len);
    o_origin_port = ntohs(a.sin_port);
    if (!o_target.sin_family) { /* direct: the client goes straight to the origin */
        o_target = a;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, origin_main, NULL)) die("origin thread");
    pthread_detach(t);
}

/* ------------------------------------------------------------------ client helpers */

static const unsigned char SOCKS_GREETING[3] = {5, 1, 0};

static void socks_request(unsigned char req[10]) {
    req[0] = 5; req[1] = 1; req[2] = 0; req[3] = 1;
    uint32_t ip = htonl(INADDR_LOOPBACK);
    uint16_t port = htons(o_origin_port);
    memcpy(req + 4, &ip, 4);
    memcpy(req + 8, &port, 2);
}

/* Length of a complete SOCKS5 reply given its first bytes, 0 if not yet known, -1 if bad. */
static int socks_reply_len(const unsigned char *b, int have) {
    if (have < 5) return 0;
    if (b[0] != 5 || b[1] != 0) return -1;
    switch (b[3]) {
    case 1: return 10;
    case 4: return 22;
    case 3: return 7 + b[4];
    default: return -1;
    }
}

static int recv_exact(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n <= 0) return -1;
        got += n;
    }
    return 0;
}

/* Blocking connect (+ SOCKS5 CONNECT when asked), then the mode byte if any. -1 on failure. */
static int open_stream(char mode_byte) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    set_nodelay(fd);
    if (connect(fd, (struct sockaddr *)&o_target, sizeof o_target) < 0) goto fail;
    if (o_socks) {
        unsigned char req[10], rep[32];
        if (send(fd, SOCKS_GREETING, 3, MSG_NOSIGNAL) != 3) goto fail;
        if (recv_exact(fd, rep, 2) < 0 || rep[0] != 5 || rep[1] != 0) goto fail;
        socks_request(req);
        if (send(fd, req, 10, MSG_NOSIGNAL) != 10) goto fail;
        if (recv_exact(fd, rep, 5) < 0) goto fail;
        int len = socks_reply_len(rep, 5);
        if (len < 0 || recv_exact(fd, rep + 5, len - 5) < 0) goto fail;
    }
    if (mode_byte && send(fd, &mode_byte, 1, MSG_NOSIGNAL) != 1) goto fail;
    return fd;
fail:
    close(fd);
    return -1;
}

struct window {
    double t0, t1, cpu0, cpu1;
    unsigned long long a0, a1, b0, b1;
};

/* Sleep through the warm-up, snapshot, sleep through the window, snapshot, stop the workers. */
static void measure(struct window *w, atomic_ullong *a, atomic_ullong *b) {
    double start = now();
    while (now() < start + o_warmup) usleep(1000);
    w->t0 = now(); w->cpu0 = cpu_self();
    w->a0 = atomic_load(a); w->b0 = b ? atomic_load(b) : 0;
    while (now() < w->t0 + o_duration) usleep(1000);
    w->t1 = now(); w->cpu1 = cpu_self();
    w->a1 = atomic_load(a); w->b1 = b ? atomic_load(b) : 0;
    atomic_store(&g_stop, 1);
}

/* ------------------------------------------------------------------ bulk */

struct bulk_arg { int first, count; int *fds; };

static void *bulk_worker(void *p) {
    struct bulk_arg *a = p;
    static __thread char rbuf[CHUNK];
    int ep = epoll_create1(0);
    for (int i = a->first; i < a->first + a->count; i++) {
        set_nonblock(a->fds[i]);
        struct epoll_event ev = {.events = o_down ? EPOLLIN : EPOLLOUT, .data.fd = a->fds[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, a->fds[i], &ev);
    }
    struct epoll_event evs[MAX_EVENTS];
    int live = a->count;
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed) && live > 0) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, 20);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            for (int burst = 0; burst < BURST; burst++) {
                ssize_t r = o_down ? recv(fd, rbuf, CHUNK, 0) : send(fd, g_chunk, CHUNK, MSG_NOSIGNAL);
                if (r > 0) {
                    if (o_down) atomic_fetch_add_explicit(&g_down_bytes, (unsigned long long)r, memory_order_relaxed);
                    continue;
                }
                if (r < 0 && errno == EAGAIN) break;
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); /* stream broke: the run reports it */
                live--;
                atomic_fetch_add(&g_errors, 1);
                break;
            }
        }
    }
    close(ep);
    return NULL;
}

static int run_bulk(void) {
    int *fds = calloc(o_streams, sizeof *fds);
    for (int i = 0; i < o_streams; i++) {
        fds[i] = open_stream(o_down ? 'D' : 'U');
        if (fds[i] < 0) {
            printf("mode=bulk error=open_stream_%d\n", i);
            return 1;
        }
    }
    int threads = o_threads > o_streams ? o_streams : o_threads;
    pthread_t t[MAX_THREADS];
    struct bulk_arg args[MAX_THREADS];
    for (int i = 0, first = 0; i < threads; i++) {
        args[i].count = o_streams / threads + (i < o_streams % threads);
        args[i].first = first;
        args[i].fds = fds;
        first += args[i].count;
        pthread_create(&t[i], NULL, bulk_worker, &args[i]);
    }
    struct window w;
    measure(&w, o_down ? &g_down_bytes : &g_up_bytes, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < o_streams; i++) abort_close(fds[i]);
    double secs = w.t1 - w.t0;
    unsigned long long bytes = w.a1 - w.a0;
    /* everything that crossed the subject during the run, warm-up included: for CPU per byte */
    unsigned long long total = atomic_load(o_down ? &g_down_bytes : &g_up_bytes);
    printf("mode=bulk dir=%s streams=%d threads=%d bytes=%llu seconds=%.4f mbps=%.1f total_bytes=%llu "
           "errors=%llu loadgen_cpu=%.3f\n",
           o_down ? "down" : "up", o_streams, threads, bytes, secs, bytes / secs / 1e6, total,
           (unsigned long long)atomic_load(&g_errors), w.cpu1 - w.cpu0);
    return 0;
}

/* ------------------------------------------------------------------ rate */

enum { S_CONNECT, S_GREET, S_REPLY, S_ECHO, S_TLS, S_TLS_ECHO };

struct slot {
    int fd, state, have;
    SSL *ssl;  /* --trojan only */
    double deadline;
    unsigned char buf[ECHO_BYTES + 64];
};

static char g_req[1 + ECHO_BYTES];
static unsigned char g_trojan_req[56 + 2 + 8 + 2 + sizeof g_req]; /* hex SHA224, CRLF, CONNECT IPv4, CRLF, payload */

static void slot_close(int ep, struct slot *s, int ok) {
    epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
    if (s->ssl) {
        SSL_free(s->ssl);
        s->ssl = NULL;
    }
    close(s->fd);
    s->fd = -1;
    atomic_fetch_add_explicit(ok ? &g_done : &g_errors, 1, memory_order_relaxed);
}

static void slot_open(int ep, struct slot *s) {
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (s->fd < 0) { atomic_fetch_add(&g_errors, 1); return; }
    set_nodelay(s->fd);
    s->state = S_CONNECT;
    s->have = 0;
    s->deadline = now() + 5.0;
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = s};
    int r = connect(s->fd, (struct sockaddr *)&o_target, sizeof o_target);
    if (r < 0 && errno != EINPROGRESS) {
        close(s->fd);
        s->fd = -1;
        atomic_fetch_add(&g_errors, 1);
        return;
    }
    epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev);
}

/* Send a small message that fits a fresh socket's buffer, then wait for the answer. */
static int slot_send(int ep, struct slot *s, const void *msg, size_t len, int next) {
    if (send(s->fd, msg, len, MSG_NOSIGNAL) != (ssize_t)len) return -1;
    s->state = next;
    s->have = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
    epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
    return 0;
}

/* Wait for what OpenSSL asked for after a call that returned r; -1 when it failed for good. */
static int tls_wait(int ep, struct slot *s, int r) {
    int e = SSL_get_error(s->ssl, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        ERR_clear_error();
        return -1;
    }
    struct epoll_event ev = {.events = e == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT, .data.ptr = s};
    epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
    return 0;
}

/* --trojan: drive the handshake, then send the request with its payload and read the echo over TLS. */
static int trojan_event(int ep, struct slot *s) {
    if (s->state == S_TLS) {
        int r = SSL_connect(s->ssl);
        if (r != 1) return tls_wait(ep, s, r) < 0 ? -1 : 0;
        /* the request fits one record and a fresh socket's buffer: written whole or failed */
        if (SSL_write(s->ssl, g_trojan_req, sizeof g_trojan_req) != (int)sizeof g_trojan_req) return -1;
        s->state = S_TLS_ECHO;
        s->have = 0;
    }
    for (;;) {
        int r = SSL_read(s->ssl, s->buf + s->have, sizeof s->buf - s->have);
        if (r <= 0) return tls_wait(ep, s, r) < 0 ? -1 : 0;
        s->have += r;
        if (s->have >= ECHO_BYTES)
            return s->have == ECHO_BYTES && memcmp(s->buf, g_req + 1, ECHO_BYTES) == 0 ? 1 : -1;
    }
}

/* Advance one slot on an event; returns 1 when its cycle ended (ok or not). */
static int slot_event(int ep, struct slot *s, uint32_t events) {
    if (s->state == S_TLS || s->state == S_TLS_ECHO) {
        int r = trojan_event(ep, s);
        if (r == 0) return 0;
        slot_close(ep, s, r > 0);
        return 1;
    }
    if (s->state == S_CONNECT) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || (events & (EPOLLERR | EPOLLHUP))) goto fail;
        if (g_tls) {
            s->ssl = SSL_new(g_tls);
            if (!s->ssl || !SSL_set_fd(s->ssl, s->fd) || !SSL_set_tlsext_host_name(s->ssl, o_sni) ||
                !SSL_set1_host(s->ssl, o_sni))
                goto fail;
            s->state = S_TLS;
            return slot_event(ep, s, 0);
        }
        if (o_socks) {
            if (slot_send(ep, s, SOCKS_GREETING, 3, S_GREET) < 0) goto fail;
        } else if (slot_send(ep, s, g_req, sizeof g_req, S_ECHO) < 0) {
            goto fail;
        }
        return 0;
    }
    ssize_t n = recv(s->fd, s->buf + s->have, sizeof s->buf - s->have, 0);
    if (n < 0 && errno == EAGAIN) return 0;
    if (n <= 0) goto fail;
    s->have += n;
    switch (s->state) {
    case S_GREET: {
        if (s->have < 2) return 0;
        if (s->have > 2 || s->buf[0] != 5 || s->buf[1] != 0) goto fail;
        unsigned char req[10];
        socks_request(req);
        if (slot_send(ep, s, req, 10, S_REPLY) < 0) goto fail;
        return 0;
    }
    case S_REPLY: {
        int want = socks_reply_len(s->buf, s->have);
        if (want < 0) goto fail;
        if (want == 0 || s->have < want) return 0;
        if (s->have > want) goto fail;
        if (slot_send(ep, s, g_req, sizeof g_req, S_ECHO) < 0) goto fail;
        return 0;
    }
    case S_ECHO:
        if (s->have < ECHO_BYTES) return 0;
        slot_close(ep, s, s->have == ECHO_BYTES && memcmp(s->buf, g_req + 1, ECHO_BYTES) == 0);
        return 1;
    }
fail:
    slot_close(ep, s, 0);
    return 1;
}

struct rate_arg { int count; };

static void *rate_worker(void *p) {
    struct rate_arg *a = p;
    int ep = epoll_create1(0);
    struct slot *slots = calloc(a->count, sizeof *slots);
    for (int i = 0; i < a->count; i++) slot_open(ep, &slots[i]);
    struct epoll_event evs[MAX_EVENTS];
    double next_sweep = now() + 0.1;
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, 20);
        for (int i = 0; i < n; i++) {
            struct slot *s = evs[i].data.ptr;
            if (slot_event(ep, s, evs[i].events)) slot_open(ep, s);
        }
        double t = now();
        if (t >= next_sweep) { /* time out stuck cycles; retry slots whose socket() failed */
            next_sweep = t + 0.1;
            for (int i = 0; i < a->count; i++) {
                if (slots[i].fd >= 0 && t > slots[i].deadline) slot_close(ep, &slots[i], 0);
                if (slots[i].fd < 0) slot_open(ep, &slots[i]);
            }
        }
    }
    for (int i = 0; i < a->count; i++) {
        if (slots[i].ssl) SSL_free(slots[i].ssl);
        if (slots[i].fd >= 0) abort_close(slots[i].fd);
    }
    close(ep);
    free(slots);
    struct timespec cpu;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    atomic_fetch_add(&g_client_cpu_ns, (unsigned long long)cpu.tv_sec * 1000000000ull + cpu.tv_nsec);
    return NULL;
}

/* The TLS context and the Trojan request of --trojan (exits on a setup error). */
static void trojan_setup(void) {
    g_tls = SSL_CTX_new(TLS_client_method());
    if (!g_tls || !o_tls_ca || SSL_CTX_load_verify_locations(g_tls, o_tls_ca, NULL) != 1) {
        fprintf(stderr, "loadgen: --trojan needs --tls-ca with a readable CA file\n");
        exit(2);
    }
    SSL_CTX_set_verify(g_tls, SSL_VERIFY_PEER, NULL);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    EVP_Digest(o_trojan, strlen(o_trojan), digest, &dlen, EVP_sha224(), NULL);
    unsigned char *p = g_trojan_req;
    for (unsigned int i = 0; i < dlen; i++) p += sprintf((char *)p, "%02x", digest[i]);
    *p++ = '\r'; *p++ = '\n';
    unsigned char socks[10];
    socks_request(socks);  /* CMD CONNECT, ATYP IPv4, 127.0.0.1, the origin port: Trojan's request */
    memcpy(p, socks + 1, 1); memcpy(p + 1, socks + 3, 7); p += 8;
    *p++ = '\r'; *p++ = '\n';
    memcpy(p, g_req, sizeof g_req);
}

static int run_rate(void) {
    g_req[0] = 'R';
    for (int i = 0; i < ECHO_BYTES; i++) g_req[1 + i] = (char)('a' + i % 26);
    if (o_trojan) trojan_setup();
    int threads = o_threads > o_concurrency ? o_concurrency : o_threads;
    pthread_t t[MAX_THREADS];
    struct rate_arg args[MAX_THREADS];
    for (int i = 0; i < threads; i++) {
        args[i].count = o_concurrency / threads + (i < o_concurrency % threads);
        pthread_create(&t[i], NULL, rate_worker, &args[i]);
    }
    struct window w;
    measure(&w, &g_done, &g_errors);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    double secs = w.t1 - w.t0;
    char client[64] = "";
    unsigned long long cycles = atomic_load(&g_done) + atomic_load(&g_errors);
    if (o_trojan && cycles)  /* whole run, warm-up included, as the other subjects' CPU per connection */
        snprintf(client, sizeof client, " client_cpu_ms=%.4f", atomic_load(&g_client_cpu_ns) / 1e6 / cycles);
    printf("mode=rate concurrency=%d threads=%d conns=%llu seconds=%.4f cps=%.1f errors=%llu "
           "loadgen_cpu=%.3f%s\n",
           o_concurrency, threads, w.a1 - w.a0, secs, (w.a1 - w.a0) / secs, w.b1 - w.b0, w.cpu1 - w.cpu0, client);
    return 0;
}

/* ------------------------------------------------------------------ latency */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array: the smallest value with at least p of the data at or below it. */
static double percentile(const double *sorted, int n, double p) {
    int rank = (int)(p * n + 0.999999);
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return sorted[rank - 1];
}

static int run_latency(void) {
    int fd = open_stream('E');
    if (fd < 0) {
        printf("mode=latency error=open_stream\n");
        return 1;
    }
    char out[4096], in[4096];
    if (o_size < 1 || o_size > (int)sizeof out) o_size = 1;
    memset(out, 'p', o_size);
    int warm = o_count / 20 + 1;
    double *rtt = calloc(o_count, sizeof *rtt);
    for (int i = 0; i < warm + o_count; i++) {
        double t0 = now();
        if (send(fd, out, o_size, MSG_NOSIGNAL) != o_size || recv_exact(fd, in, o_size) < 0) {
            printf("mode=latency error=round_trip_%d\n", i);
            return 1;
        }
        if (i >= warm) rtt[i - warm] = (now() - t0) * 1e6;
    }
    abort_close(fd);
    double sum = 0;
    for (int i = 0; i < o_count; i++) sum += rtt[i];
    qsort(rtt, o_count, sizeof *rtt, cmp_double);
    printf("mode=latency size=%d count=%d p50_us=%.2f p99_us=%.2f p999_us=%.2f min_us=%.2f mean_us=%.2f\n",
           o_size, o_count, percentile(rtt, o_count, 0.50), percentile(rtt, o_count, 0.99),
           percentile(rtt, o_count, 0.999), rtt[0], sum / o_count);
    return 0;
}

/* ------------------------------------------------------------------ first */

/* A new connection's time to its first response byte: connect, the SOCKS5 exchange when
 * asked, the echo mode byte and one payload byte out, one byte back. */
static int run_first(void) {
    double t0 = now();
    int fd = open_stream('E');
    if (fd < 0) {
        printf("mode=first error=open_stream\n");
        return 1;
    }
    char byte = 'p', in;
    if (send(fd, &byte, 1, MSG_NOSIGNAL) != 1 || recv_exact(fd, &in, 1) < 0) {
        printf("mode=first error=round_trip\n");
        return 1;
    }
    double us = (now() - t0) * 1e6;
    abort_close(fd);
    printf("mode=first first_byte_us=%.2f\n", us);
    return 0;
}

/* ------------------------------------------------------------------ idle */

static int run_idle(void) {
    int *fds = calloc(o_count, sizeof *fds);
    for (int i = 0; i < o_count; i++) {
        fds[i] = open_stream(0);
        if (fds[i] < 0) {
            printf("mode=idle error=open_stream_%d\n", i);
            return 1;
        }
    }
    /* "completed" means the subject has reached the origin for every connection */
    double deadline = now() + 10.0;
    while ((int)atomic_load(&g_accepted) < o_count && now() < deadline) usleep(1000);
    printf("ready mode=idle count=%d origin_accepted=%llu\n", o_count, (unsigned long long)atomic_load(&g_accepted));
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) { /* EOF is as good as a line */ }
    for (int i = 0; i < o_count; i++) abort_close(fds[i]);
    printf("mode=idle closed=%d\n", o_count);
    return 0;
}

/* ------------------------------------------------------------------ main */

static void usage(void) {
    fprintf(stderr,
            "usage: loadgen bulk|rate|latency|idle|first [--origin-port P] [--target HOST:PORT [--socks]]\n"
            "       [--streams N] [--dir up|down] [--concurrency N] [--count N] [--size B]\n"
            "       [--warmup S] [--duration S] [--threads N]\n"
            "       rate --target SERVER:PORT --trojan PASSWORD --tls-ca FILE [--sni NAME]\n");
    exit(2);
}

static void parse_target(const char *s) {
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || colon - s >= (int)sizeof host) usage();
    memcpy(host, s, colon - s);
    host[colon - s] = 0;
    o_target.sin_family = AF_INET;
    o_target.sin_port = htons(atoi(colon + 1));
    if (inet_pton(AF_INET, host, &o_target.sin_addr) != 1) usage();
    if ((ntohl(o_target.sin_addr.s_addr) >> 24) != 127) {
        fprintf(stderr, "loadgen: only 127.0.0.0/8 targets\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"origin-port", 1, 0, 'o'}, {"target", 1, 0, 'T'}, {"socks", 0, 0, 'S'},
        {"streams", 1, 0, 'n'},     {"dir", 1, 0, 'd'},    {"concurrency", 1, 0, 'c'},
        {"count", 1, 0, 'N'},       {"size", 1, 0, 'z'},   {"warmup", 1, 0, 'w'},
        {"duration", 1, 0, 't'},    {"threads", 1, 0, 'j'}, {"trojan", 1, 0, 'P'},
        {"tls-ca", 1, 0, 'C'},      {"sni", 1, 0, 'H'},    {0, 0, 0, 0}};
    if (argc < 2) usage();
    o_mode = argv[1];
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'o': o_origin_port = atoi(optarg); break;
        case 'T': parse_target(optarg); break;
        case 'S': o_socks = 1; break;
        case 'n': o_streams = atoi(optarg); break;
        case 'd': o_down = strcmp(optarg, "down") == 0; break;
        case 'c': o_concurrency = atoi(optarg); break;
        case 'N': o_count = atoi(optarg); break;
        case 'z': o_size = atoi(optarg); break;
        case 'w': o_warmup = atof(optarg); break;
        case 't': o_duration = atof(optarg); break;
        case 'j': o_threads = atoi(optarg); break;
        case 'P': o_trojan = optarg; break;
        case 'C': o_tls_ca = optarg; break;
        case 'H': o_sni = optarg; break;
        default: usage();
        }
    }
    if (o_streams < 1 || o_concurrency < 1 || o_count < 1 || o_threads < 1 || o_threads > MAX_THREADS) usage();
    if (o_trojan && (strcmp(o_mode, "rate") || o_socks || !o_target.sin_port)) usage();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    alarm((unsigned)(o_warmup + o_duration) + 60); /* nothing outlives its run */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    g_max_fd = (int)(rl.rlim_cur > 1 << 20 ? 1 << 20 : rl.rlim_cur);
    g_oconns = calloc(g_max_fd, sizeof *g_oconns);
    memset(g_chunk, 0, sizeof g_chunk);

    origin_start();
    int rc;
    if (!strcmp(o_mode, "bulk")) rc = run_bulk();
    else if (!strcmp(o_mode, "rate")) rc = run_rate();
    else if (!strcmp(o_mode, "latency")) rc = run_latency();
    else if (!strcmp(o_mode, "idle")) rc = run_idle();
    else if (!strcmp(o_mode, "first")) rc = run_first();
    else usage();
    fflush(stdout);
    _exit(rc); /* the origin thread never returns */
}
