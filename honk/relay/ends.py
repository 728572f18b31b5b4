"""How a relay's end is typed: which side failed, and with which errno.

One table for every engine (copy, native compiled, native twin), after the
rule that a failure on the client's connection is not the upstream's fault:

* an error on the client's socket whose errno says the client went away
  (reset, abort, broken pipe, not connected, timed out, host/network
  unreachable or down) is :class:`ClientGone`;
* any error on the upstream's socket is :class:`UpstreamFailed`;
* anything else -- an unexpected errno on the client's socket, or a local
  failure such as no pipe or no memory -- is a plain :class:`RelayError`.

The original errno stays on the error object as ``errno`` (``None`` when the
connection was closed without an OS error).
"""

from __future__ import annotations

import errno as _errno
import os

from honk.core.errors import ClientGone, RelayError, UpstreamFailed

__all__ = ["CLIENT_GONE_ERRNOS", "client_error", "local_error", "upstream_error"]

CLIENT_GONE_ERRNOS = frozenset(
    getattr(_errno, name)
    for name in (
        "ECONNRESET",
        "ECONNABORTED",
        "EPIPE",
        "ENOTCONN",
        "ESHUTDOWN",
        "ETIMEDOUT",
        "EHOSTUNREACH",
        "ENETUNREACH",
        "ENETDOWN",
        "EHOSTDOWN",
        "ENETRESET",
    )
    if hasattr(_errno, name)
)


def _describe(err: int | None) -> str:
    if err is None:
        return "closed"
    return f"{_errno.errorcode.get(err, err)} ({os.strerror(err)})"


def client_error(err: int | None, detail: str = "") -> RelayError | ClientGone:
    """The end for an error on the client's connection."""
    text = f"client connection lost: {_describe(err)}" + (f"; {detail}" if detail else "")
    exc: RelayError | ClientGone
    if err is None or err in CLIENT_GONE_ERRNOS:
        exc = ClientGone(text)
    else:
        exc = RelayError(f"local failure on the client connection: {_describe(err)}")
    exc.errno = err  # type: ignore[attr-defined]
    return exc


def upstream_error(err: int | None, detail: str = "") -> UpstreamFailed:
    """The end for an error on the upstream's connection."""
    exc = UpstreamFailed(f"upstream connection lost: {_describe(err)}" + (f"; {detail}" if detail else ""))
    exc.errno = err  # type: ignore[attr-defined]
    return exc


def local_error(err: int | None, detail: str = "") -> RelayError:
    """The end for a failure of the relay itself (no pipe, no memory)."""
    exc = RelayError(f"relay failed: {_describe(err)}" + (f"; {detail}" if detail else ""))
    exc.errno = err  # type: ignore[attr-defined]
    return exc
