"""Selects the verified-chain cache for client TLS contexts; the rest of honk imports this.

``install(context, ttl)`` lets handshakes that present a chain already verified for the same
names skip ``X509_verify_cert`` (``tlsverify_c``, compiled); the twin (``tlsverify_py``)
remembers nothing and returns False. ``stats(context)`` gives ``(hits, misses)``.
``prefer_builtin_keys()`` has OpenSSL decode and use EC keys (a server certificate's among
them) with its built-in method, once per process; the twin cannot and returns False.
"""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.tlsverify_py import install, prefer_builtin_keys, stats
else:
    _impl, IMPLEMENTATION = load("tlsverify")
    install = _impl.install
    prefer_builtin_keys = _impl.prefer_builtin_keys
    stats = _impl.stats

__all__ = ["IMPLEMENTATION", "install", "prefer_builtin_keys", "stats"]
