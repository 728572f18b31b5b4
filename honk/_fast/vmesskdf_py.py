"""VMess AEAD's key derivation, pure Python: the twin of ``vmesskdf_c`` and its reference.

v2ray's KDF (proxy/vmess/aead/kdf.go) nests HMACs: the innermost layer is HMAC-SHA256 keyed by
:data:`KDF_ROOT`, and each salt of the path wraps the layer below as an HMAC *whose hash function
is that layer* (block size 64 throughout). A path of n salts calls the root 2**n times: a request
header derives four keys over three salts each, 32 root HMACs per connection, which is why the
compiled twin exists.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

__all__ = ["KDF_ROOT", "kdf"]

KDF_ROOT = b"VMess AEAD KDF"  # the innermost HMAC's key (proxy/vmess/aead/consts.go)
HMAC_BLOCK = 64  # SHA-256's block size, inherited by every layer
SALT_LAYERS = 32  # first-salt layers kept built: the protocol has nine constant salts

_Hash = Callable[[bytes], bytes]

_PAD_INNER = bytes(b ^ 0x36 for b in range(256))  # HMAC's ipad and opad, as translate() tables
_PAD_OUTER = bytes(b ^ 0x5C for b in range(256))


def _hmac_over(inner: _Hash, key: bytes) -> _Hash:
    """HMAC with ``inner`` as its hash function; every layer keeps SHA-256's block size."""
    if len(key) > HMAC_BLOCK:
        key = inner(key)
    key = key.ljust(HMAC_BLOCK, b"\x00")
    ipad = key.translate(_PAD_INNER)
    opad = key.translate(_PAD_OUTER)
    return lambda msg: inner(opad + inner(ipad + msg))


# The innermost layer's two hash states with its padded key already absorbed: copying a state
# is cheaper than keying an HMAC afresh, and this layer runs eight times per derived key.
_ROOT_KEY = KDF_ROOT.ljust(HMAC_BLOCK, b"\x00")  # shorter than a block: padded, not hashed
_ROOT_INNER = hashlib.sha256(_ROOT_KEY.translate(_PAD_INNER))
_ROOT_OUTER = hashlib.sha256(_ROOT_KEY.translate(_PAD_OUTER))


def _root_hmac(msg: bytes) -> bytes:
    """The innermost layer: HMAC-SHA256 keyed by ``KDF_ROOT``."""
    inner = _ROOT_INNER.copy()
    inner.update(msg)
    outer = _ROOT_OUTER.copy()
    outer.update(inner.digest())
    return outer.digest()


@functools.lru_cache(maxsize=SALT_LAYERS)
def _salted(salt: bytes) -> _Hash:
    """The layer over the root for one of the protocol's constant salts, built once."""
    return _hmac_over(_root_hmac, salt)


def kdf(key: bytes, *path: bytes) -> bytes:
    """v2ray's VMess KDF: HMAC layers keyed by ``KDF_ROOT`` then each salt of ``path``, over
    ``key``; 32 bytes. A layer calls the one below it twice, so a three-salt path costs eight
    HMAC-SHA256 calls; the first salt is always one of the protocol's constants, so its layer
    is cached."""
    if not path:
        return _root_hmac(bytes(key))
    fn = _salted(bytes(path[0]))
    for salt in path[1:]:
        fn = _hmac_over(fn, bytes(salt))
    return fn(bytes(key))
