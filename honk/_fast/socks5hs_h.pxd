# The C of the SOCKS5 fast path (socks5hs.h), declared once for every module that calls it:
# the relay engine's worker (relay_c.pyx) and its Python wrapper (socks5hs_c.pyx).
from libc.stdint cimport uint8_t

cdef extern from "socks5hs.h" nogil:
    enum:
        HONK_HS_MORE
        HONK_HS_HANDOVER
        HONK_HS_HOST_MAX
        HONK_HS_REPLY_MAX
    int honk_hs_accept(int lfd, char* peer, uint8_t* peer_len)
    int honk_hs_greeting(const uint8_t* b, size_t n)
    int honk_hs_request(const uint8_t* b, size_t n, size_t off)
    int honk_hs_target(const uint8_t* b, size_t off, char* host)
    int honk_errno_reply(int err)
    int honk_reply_code(int err)
    int honk_build_reply(char* out, int code, int fd)
