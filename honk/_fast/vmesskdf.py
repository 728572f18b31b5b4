"""Selects VMess AEAD's key derivation; the rest of honk imports this.

``kdf(key, *path)`` is v2ray's nested-HMAC KDF (see ``vmesskdf_py``): compiled over OpenSSL's
SHA-256 in ``vmesskdf_c``, the pure-Python twin otherwise, the same 32 bytes either way.
"""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.vmesskdf_py import KDF_ROOT, kdf
else:
    _impl, IMPLEMENTATION = load("vmesskdf")
    KDF_ROOT = _impl.KDF_ROOT
    kdf = _impl.kdf

__all__ = ["IMPLEMENTATION", "KDF_ROOT", "kdf"]
