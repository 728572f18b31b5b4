"""Selects the relay engine implementation; the rest of honk imports this.

``Engine`` is ``relay_c.Engine`` (compiled: a worker thread splicing natively)
when built, else ``relay_py.Engine`` (the twin on the loop's readers/writers).
``HONK_NO_EXTENSIONS=1`` forces the twin. Both share the constants of
:mod:`honk._fast.relay_py`. ``tls_supported()`` says whether the engine can relay a
``TlsFraming`` (Trojan or VLESS over TLS) itself.
"""

from typing import TYPE_CHECKING

from honk._fast import load
from honk._fast.relay_py import (
    END_CANCELLED,
    END_CLEAN,
    END_ERROR,
    EV_BYTES,
    EV_END,
    EV_FIRST_BYTE,
    EV_HALF_CLOSE,
    EV_OPEN,
    FRAMING_AUTH,
    FRAMING_PROTOCOL,
    FRAMING_SILENT,
    FRAMING_TRUNCATED,
    SIDE_CLIENT,
    SIDE_LOCAL,
    SIDE_UPSTREAM,
    TLS_13,
    TLS_RESUMED,
    EngineClosed,
    RelayListener,
)

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.relay_py import Engine, tls_supported
else:
    _impl, IMPLEMENTATION = load("relay")
    Engine = _impl.Engine
    # whether the engine can carry a TlsFraming (the compiled one checks this Python's SSLObjects once)
    tls_supported = _impl.tls_supported

__all__ = [
    "Engine",
    "EngineClosed",
    "IMPLEMENTATION",
    "RelayListener",
    "EV_OPEN",
    "EV_FIRST_BYTE",
    "EV_BYTES",
    "EV_HALF_CLOSE",
    "EV_END",
    "END_CLEAN",
    "END_ERROR",
    "END_CANCELLED",
    "SIDE_CLIENT",
    "SIDE_UPSTREAM",
    "SIDE_LOCAL",
    "FRAMING_AUTH",
    "FRAMING_PROTOCOL",
    "FRAMING_SILENT",
    "FRAMING_TRUNCATED",
    "TLS_RESUMED",
    "TLS_13",
    "tls_supported",
]
