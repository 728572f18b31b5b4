"""How an upstream exchange fails: one error type with a short stable reason.

Its own module because both the exchange (``upstream.py``) and the encrypted
transports it drives (``encrypted.py``, ``quic.py``) raise it, and the service
reports the reason the same way whichever transport failed.
"""

from __future__ import annotations

from honk.core.errors import Blocked, DialError, DialTimeout, HonkError, NoRoute, NotSupported

__all__ = ["ExchangeFailed", "reason_of"]


class ExchangeFailed(HonkError):
    """An exchange ended without a usable reply; ``reason`` is a short stable slug."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f" ({detail})" if detail else ""))
        self.reason = reason


def reason_of(exc: BaseException) -> str:
    """The slug for a failure of the dial or socket under an exchange."""
    if isinstance(exc, ExchangeFailed):
        return exc.reason
    if isinstance(exc, Blocked):
        return "blocked"
    if isinstance(exc, NoRoute):
        return "no-route"
    if isinstance(exc, NotSupported):
        return "dial-unsupported"  # a leaf that cannot carry the transport (QUIC without UDP)
    if isinstance(exc, DialTimeout):
        return "dial-timeout"
    if isinstance(exc, DialError):
        reason = getattr(exc, "reason", None)  # TlsFailed: certificate-untrusted, certificate-name, ...
        return f"dial-{exc.phase}" + (f"-{reason}" if reason else "")
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, OSError):
        return "socket-error"
    return type(exc).__name__
