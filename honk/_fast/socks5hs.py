"""Selects the SOCKS5 fast-path handshake kernel; the rest of honk imports this.

The functions the relay engine's worker runs on a client's first bytes (``greeting``,
``request``, ``target``), the replies it sends (``build_reply``), and honk's one errno →
reply table (``errno_reply``, ``reply_code``), which :mod:`honk.proto.socks5` reads too.
``socks5hs_c`` is the C of ``socks5hs.h`` (what the compiled engine includes);
``socks5hs_py`` its pure-Python twin (what the twin engine calls).
"""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.socks5hs_py import (
        HANDOVER,
        MORE,
        build_reply,
        errno_reply,
        greeting,
        reply_code,
        request,
        target,
    )
else:
    _impl, IMPLEMENTATION = load("socks5hs")
    MORE = _impl.MORE
    HANDOVER = _impl.HANDOVER
    build_reply = _impl.build_reply
    errno_reply = _impl.errno_reply
    greeting = _impl.greeting
    reply_code = _impl.reply_code
    request = _impl.request
    target = _impl.target

__all__ = [
    "HANDOVER",
    "IMPLEMENTATION",
    "MORE",
    "build_reply",
    "errno_reply",
    "greeting",
    "reply_code",
    "request",
    "target",
]
