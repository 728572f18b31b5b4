"""The twin of the verified-chain cache (:mod:`honk._fast.tlsverify_c`): Python's ``ssl`` has
no hook into certificate verification, so this twin remembers nothing and every handshake
verifies its chain in full, as OpenSSL does by default. Same API and argument checks."""

import ssl


def _check(context: object) -> None:
    if not isinstance(context, ssl.SSLContext):
        raise TypeError(f"not an ssl.SSLContext: {type(context).__name__}")


def install(context: ssl.SSLContext, ttl: float) -> bool:
    """Would remember ``context``'s verified chains for ``ttl`` seconds; False: this twin cannot."""
    _check(context)
    if ttl <= 0:
        raise ValueError("ttl must be positive")
    return False


def stats(context: ssl.SSLContext) -> tuple[int, int]:
    """``(hits, misses)``: always ``(0, 0)`` here (nothing is remembered or counted)."""
    _check(context)
    return 0, 0


def _skew(seconds: float) -> None:
    """Tests only: the compiled cache's clocks move; this twin has none."""


def prefer_builtin_keys() -> bool:
    """Would decode EC keys with OpenSSL's built-in method (see :mod:`honk._fast.tlsverify_c`);
    False: Python's ``ssl`` cannot register one, so keys stay with the providers."""
    return False


def _builtin_key(der: bytes) -> bool:
    """Tests and the kernel benchmark only: whether the DER certificate's key decodes as a
    built-in key; never here."""
    if not isinstance(der, (bytes, bytearray, memoryview)):
        raise TypeError(f"not bytes: {type(der).__name__}")
    return False
