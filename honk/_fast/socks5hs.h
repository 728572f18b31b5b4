/* The SOCKS5 server side of the relay engine's fast path (RFC 1928): accepting a client,
   judging its handshake, building replies; and honk's one errno -> reply table.

   Pure functions over the bytes a client sent and the error a connect failed with: the
   engine's worker (relay_c.pyx) does the I/O and asks these what the bytes mean;
   socks5hs_c.pyx exposes the same functions to Python, and socks5hs_py.py is their
   pure-Python twin (the twin engine's, and the reference the tests compare against).

   Only the common case is served here: a complete greeting offering "no authentication",
   then a complete CONNECT to an IPv4, IPv6 or printable-ASCII domain target. Everything
   else is HONK_HS_HANDOVER: Python's codec (honk/proto/socks5.py) reads the same bytes
   again and answers them, so refusals come from one place. */
#ifndef HONK_SOCKS5HS_H
#define HONK_SOCKS5HS_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#define HONK_HS_MORE 0      /* nothing after the greeting yet: read on */
#define HONK_HS_HANDOVER (-1) /* not the common case: Python serves the client */
#define HONK_HS_HOST_MAX 256  /* a target's text: a 255-byte domain or an IPv6 literal, NUL */
#define HONK_HS_REPLY_MAX 22  /* a reply with an IPv6 bound address */

/* Accept one client of a fast-path listener: non-blocking, close-on-exec; its address into
   peer (28 bytes: a sockaddr_in6 at most), its length into *peer_len. The fd, or -1 (errno). */
static inline int honk_hs_accept(int lfd, char *peer, uint8_t *peer_len) {
    socklen_t len = 28;
    int fd = accept4(lfd, (struct sockaddr *)peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    *peer_len = (uint8_t)(len > 28 ? 28 : len);
    return fd;
}

/* The SOCKS5 reply code for a connect that failed with err; 0 when the table has no entry
   (a caller then decides: the engine says 0x01, honk.proto.socks5 also looks at the phase). */
static inline int honk_errno_reply(int err) {
    switch (err) {
    case ECONNREFUSED: return 5;                 /* connection refused */
    case ENETUNREACH: case ENETDOWN: return 3;   /* network unreachable */
    case EHOSTUNREACH: case EHOSTDOWN: return 4; /* host unreachable */
    case ETIMEDOUT: return 6;                    /* TTL expired: the dial timed out */
    default: return 0;
    }
}

static inline int honk_reply_code(int err) {
    int code = honk_errno_reply(err);
    return code ? code : 1; /* general failure */
}

/* b[0..n) from the first byte the client sent: the offset of its request (2 + NMETHODS)
   when it is one complete greeting offering "no authentication", else HONK_HS_HANDOVER. */
static inline int honk_hs_greeting(const uint8_t *b, size_t n) {
    size_t k;
    if (n < 2 || b[0] != 5 || n < (size_t)2 + b[1]) return HONK_HS_HANDOVER;
    for (k = 0; k < b[1]; k++)
        if (b[2 + k] == 0) return 2 + b[1];
    return HONK_HS_HANDOVER;
}

/* The request at b[off..n): its end (later bytes are the client's early payload) when it is
   one complete CONNECT the fast path serves, HONK_HS_MORE when nothing follows the greeting
   yet, else HONK_HS_HANDOVER (a request split over reads is handed over too). */
static inline int honk_hs_request(const uint8_t *b, size_t n, size_t off) {
    size_t end, k, alen;
    if (n == off) return HONK_HS_MORE;
    if (n < off + 5 || b[off] != 5 || b[off + 1] != 1 || b[off + 2] != 0) return HONK_HS_HANDOVER;
    switch (b[off + 3]) {
    case 1: end = off + 4 + 4 + 2; break;
    case 4: end = off + 4 + 16 + 2; break;
    case 3:
        alen = b[off + 4];
        end = off + 5 + alen + 2;
        if (alen == 0 || n < end) return HONK_HS_HANDOVER;
        for (k = 0; k < alen; k++) /* Python's codec says bad-domain for the others */
            if (b[off + 5 + k] <= 0x20 || b[off + 5 + k] >= 0x7F) return HONK_HS_HANDOVER;
        break;
    default: return HONK_HS_HANDOVER;
    }
    return n < end ? HONK_HS_HANDOVER : (int)end;
}

/* The target of a request honk_hs_request accepted: its text into host (HONK_HS_HOST_MAX
   bytes), its port returned. */
static inline int honk_hs_target(const uint8_t *b, size_t off, char *host) {
    size_t alen;
    if (b[off + 3] == 1) {
        inet_ntop(AF_INET, b + off + 4, host, HONK_HS_HOST_MAX);
        return (b[off + 8] << 8) | b[off + 9];
    }
    if (b[off + 3] == 4) {
        inet_ntop(AF_INET6, b + off + 4, host, HONK_HS_HOST_MAX);
        return (b[off + 20] << 8) | b[off + 21];
    }
    alen = b[off + 4];
    memcpy(host, b + off + 5, alen);
    host[alen] = 0;
    return (b[off + 5 + alen] << 8) | b[off + 6 + alen];
}

/* A reply into out (HONK_HS_REPLY_MAX bytes); returns its length. BND is fd's local address
   when fd >= 0 and getsockname works, else 0.0.0.0:0 (what honk's failures carry). */
static inline int honk_build_reply(char *out, int code, int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
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

#endif
