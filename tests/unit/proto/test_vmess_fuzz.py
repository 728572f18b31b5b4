"""Properties: arbitrary bytes into the VMess response decoder end in typed errors only."""

from __future__ import annotations

import hashlib
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.core.net import Address
from honk.proto.vmess import (
    COMMAND_TCP,
    SECURITIES,
    VmessAuthError,
    VmessClient,
    VmessProtocolError,
    kdf,
    open_aead_header,
)

USER = "b831381d-6324-4d53-ad4f-8cda48b30811"
TYPED = (VmessAuthError, VmessProtocolError)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_securities = st.sampled_from(sorted(SECURITIES))
_pieces = st.lists(st.binary(max_size=120), max_size=8)


def _client(security: str) -> VmessClient:
    return VmessClient(
        USER, security, COMMAND_TCP, Address("example.com", 80), now=0, random=lambda n: b"\x07" * n
    )


def _valid_response_header(client: VmessClient) -> bytes:
    """A genuine response header, so the fuzz also reaches the chunk parser."""
    key, iv = client.response_key, client.response_iv
    header = bytes((client.response_check, client.options, 0, 0))
    sealed_len = AESGCM(kdf(key, b"AEAD Resp Header Len Key")[:16]).encrypt(
        kdf(iv, b"AEAD Resp Header Len IV")[:12], struct.pack("!H", len(header)), None
    )
    return sealed_len + AESGCM(kdf(key, b"AEAD Resp Header Key")[:16]).encrypt(
        kdf(iv, b"AEAD Resp Header IV")[:12], header, None
    )


@FUZZ
@given(_securities, _pieces)
def test_random_bytes_into_the_response_decoder_raise_only_typed_errors(security, pieces):
    decoder = _client(security).response_decoder()
    try:
        for piece in pieces:
            decoder.feed(piece)
    except TYPED:
        assert decoder.failed
        return
    assert not decoder.header_received  # random bytes never pass the sealed header


@FUZZ
@given(_securities, _pieces)
def test_random_chunks_after_a_genuine_header_raise_only_typed_errors(security, pieces):
    client = _client(security)
    decoder = client.response_decoder()
    decoder.feed(_valid_response_header(client))
    try:
        for piece in pieces:
            decoder.feed_packets(piece)
    except TYPED:
        assert decoder.failed


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_into_open_aead_header_raise_only_typed_errors(data):
    key = hashlib.md5(b"fuzz").digest()
    try:
        open_aead_header(key, data)
    except TYPED:
        return
    raise AssertionError("random bytes opened as a VMess header")
