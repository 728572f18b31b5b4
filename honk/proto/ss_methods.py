"""The Shadowsocks AEAD method table (SIP004), as plain data.

Config parsing and subscription import check cipher names against it without
importing the codec, which pulls in ``cryptography`` (several MB a daemon
with no Shadowsocks node should not pay).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CIPHERS", "LENGTH_SIZE", "MAX_PAYLOAD", "SUBKEY_INFO", "Cipher"]

MAX_PAYLOAD = 0x3FFF  # SIP004: the two high bits of a chunk's length are reserved (must be zero)
LENGTH_SIZE = 2  # SIP004: the chunk length field is a 2-byte big-endian integer
SUBKEY_INFO = b"ss-subkey"  # SIP004: the HKDF info string


@dataclass(frozen=True, slots=True)
class Cipher:
    """One AEAD method: sizes in bytes, from the SIP004 method table."""

    name: str
    key_size: int
    salt_size: int
    nonce_size: int
    tag_size: int


CIPHERS: dict[str, Cipher] = {
    "aes-128-gcm": Cipher("aes-128-gcm", 16, 16, 12, 16),
    "aes-256-gcm": Cipher("aes-256-gcm", 32, 32, 12, 16),
    "chacha20-ietf-poly1305": Cipher("chacha20-ietf-poly1305", 32, 32, 12, 16),
}
