# cython: language_level=3
"""The compiled SOCKS5 fast-path handshake (``socks5hs.h``, the C the relay engine's worker
runs), callable from Python with the API of its twin :mod:`honk._fast.socks5hs_py`."""

from libc.stdint cimport uint8_t

from honk._fast.socks5hs_h cimport (
    HONK_HS_MORE, HONK_HS_HANDOVER, HONK_HS_HOST_MAX, HONK_HS_REPLY_MAX, honk_errno_reply,
    honk_reply_code, honk_hs_greeting, honk_hs_request, honk_hs_target, honk_build_reply,
)

MORE = HONK_HS_MORE
HANDOVER = HONK_HS_HANDOVER


def errno_reply(int err):
    return honk_errno_reply(err)


def reply_code(int err):
    return honk_reply_code(err)


def greeting(const uint8_t[:] data):
    if data.shape[0] == 0:
        return HONK_HS_HANDOVER
    return honk_hs_greeting(&data[0], data.shape[0])


def request(const uint8_t[:] data, Py_ssize_t off):
    if off < 0 or off > data.shape[0]:
        raise ValueError("off: outside the data")
    if data.shape[0] == 0:
        return HONK_HS_MORE
    return honk_hs_request(&data[0], data.shape[0], off)


def target(const uint8_t[:] data, Py_ssize_t off):
    cdef char host[HONK_HS_HOST_MAX]
    cdef int port
    if off < 0 or request(data, off) <= 0:
        raise ValueError("target: not a request the fast path accepts")
    port = honk_hs_target(&data[0], off, host)
    return (<bytes>host).decode("ascii"), port


def build_reply(int code, int fd=-1):
    cdef char out[HONK_HS_REPLY_MAX]
    cdef int n = honk_build_reply(out, code, fd)
    return out[:n]
