"""The Shadowsocks AEAD codec: keys, TCP chunks, UDP packets, addresses, typed failures."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from honk.core.errors import HonkError
from honk.core.net import Address
from honk.proto.shadowsocks import (
    CIPHERS,
    MAX_PAYLOAD,
    Cipher,
    ShadowsocksAuthError,
    ShadowsocksFraming,
    ShadowsocksProtocolError,
    StreamDecryptor,
    StreamEncryptor,
    decode_address,
    derive_subkey,
    encode_address,
    master_key,
    open_packet,
    seal_packet,
)

ALL_CIPHERS = sorted(CIPHERS)
TAG = 16
LENGTH_CHUNK = 2 + TAG  # a sealed length field


def _master(cipher: str, password: str = "correct horse") -> bytes:
    return master_key(password, CIPHERS[cipher].key_size)


def _aead(cipher: str, key: bytes):
    return ChaCha20Poly1305(key) if cipher.startswith("chacha") else AESGCM(key)


def _nonce(n: int) -> bytes:
    return n.to_bytes(12, "little")


def _hkdf_sha1(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 written out with hmac, independent of the codec's HKDF."""
    prk = hmac.new(salt, ikm, hashlib.sha1).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes((counter,)), hashlib.sha1).digest()
        out += block
        counter += 1
    return out[:length]


# --- keys ------------------------------------------------------------------------


def test_cipher_table_has_the_sip004_sizes():
    assert CIPHERS == {
        "aes-128-gcm": Cipher("aes-128-gcm", 16, 16, 12, 16),
        "aes-256-gcm": Cipher("aes-256-gcm", 32, 32, 12, 16),
        "chacha20-ietf-poly1305": Cipher("chacha20-ietf-poly1305", 32, 32, 12, 16),
    }
    assert MAX_PAYLOAD == 0x3FFF


@pytest.mark.parametrize(
    ("password", "size", "expected"),
    [
        # `openssl enc -aes-128-cbc -k PASSWORD -nosalt -md md5 -P` (EVP_BytesToKey, MD5, 1 round)
        ("barfoo!", 16, "B3ADC47839E047EB228870526DC8FC30"),
        ("barfoo!", 32, "B3ADC47839E047EB228870526DC8FC30B347287FFCA3045DCEA06B3FDF090ACB"),
        ("pässwörd", 16, "12841E4BA5E37D2FBFC78458C6714ADE"),
        ("pässwörd", 32, "12841E4BA5E37D2FBFC78458C6714ADE0201471E53886AE9C798833F136C9692"),
    ],
)
def test_master_key_matches_openssl_evp_bytes_to_key(password, size, expected):
    assert master_key(password, size) == bytes.fromhex(expected)


def test_independent_hkdf_reproduces_rfc_5869_sha1_case_4():
    prk_input = bytes.fromhex("0b0b0b0b0b0b0b0b0b0b0b")
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    expected = "085a01ea1b10f36933068b56efa5ad81a4f14b822f5b091568a9cdd4f155fda2c22e422478d305f3f896"
    assert _hkdf_sha1(prk_input, salt, info, 42) == bytes.fromhex(expected)


@pytest.mark.parametrize("cipher", ALL_CIPHERS)
def test_subkey_is_hkdf_sha1_of_the_master_key_with_ss_subkey_info(cipher):
    spec = CIPHERS[cipher]
    master = _master(cipher)
    salt = bytes(range(spec.salt_size))
    assert derive_subkey(cipher, master, salt) == _hkdf_sha1(master, salt, b"ss-subkey", spec.key_size)


def test_subkey_rejects_a_salt_or_master_of_the_wrong_size():
    with pytest.raises(ValueError):
        derive_subkey("aes-128-gcm", bytes(16), bytes(32))
    with pytest.raises(ValueError):
        derive_subkey("aes-256-gcm", bytes(16), bytes(32))


# --- TCP streams -----------------------------------------------------------------


@pytest.mark.parametrize("cipher", ALL_CIPHERS)
def test_stream_round_trips_for_each_cipher(cipher):
    master = _master(cipher)
    enc, dec = StreamEncryptor(cipher, master), StreamDecryptor(cipher, master)
    messages = [b"GET / HTTP/1.1\r\n\r\n", b"x" * 70_000, b"", b"\x00\xff" * 9]
    wire = b"".join(enc.encrypt(m) for m in messages)
    assert dec.feed(wire) == b"".join(messages)
    assert dec.nonce == enc.nonce
    assert (dec.salt, dec.subkey) == (enc.salt, enc.subkey)


def test_stream_wire_format_is_salt_then_sealed_length_then_sealed_payload():
    cipher = "aes-128-gcm"
    master = _master(cipher)
    salt = bytes(range(16))
    enc = StreamEncryptor(cipher, master, salt=salt)
    wire = enc.encrypt(b"hello")
    aead = _aead(cipher, derive_subkey(cipher, master, salt))
    assert wire[:16] == salt
    assert aead.decrypt(_nonce(0), wire[16 : 16 + LENGTH_CHUNK], None) == b"\x00\x05"
    assert aead.decrypt(_nonce(1), wire[16 + LENGTH_CHUNK :], None) == b"hello"
    assert enc.nonce == 2 and enc.salt_sent


def test_only_the_first_encrypt_carries_the_salt():
    enc = StreamEncryptor("aes-256-gcm", _master("aes-256-gcm"))
    assert not enc.salt_sent
    first, second = enc.encrypt(b"a"), enc.encrypt(b"a")
    assert first.startswith(enc.salt) and enc.salt_sent
    assert len(first) == 32 + LENGTH_CHUNK + 1 + TAG
    assert len(second) == LENGTH_CHUNK + 1 + TAG
    assert enc.encrypt(b"") == b""


def test_each_stream_gets_a_fresh_random_salt():
    master = _master("aes-256-gcm")
    salts = {StreamEncryptor("aes-256-gcm", master).salt for _ in range(8)}
    assert len(salts) == 8 and all(len(s) == 32 for s in salts)


@pytest.mark.parametrize(
    "size", [1, MAX_PAYLOAD - 1, MAX_PAYLOAD, MAX_PAYLOAD + 1, 2 * MAX_PAYLOAD, 2 * MAX_PAYLOAD + 1]
)
def test_payloads_are_cut_into_chunks_of_at_most_max_payload(size):
    cipher = "chacha20-ietf-poly1305"
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    plain = bytes(i % 251 for i in range(size))
    wire = enc.encrypt(plain)
    chunks = -(-size // MAX_PAYLOAD)
    assert len(wire) == 32 + chunks * (LENGTH_CHUNK + TAG) + size
    assert enc.nonce == 2 * chunks
    # every length field says MAX_PAYLOAD except possibly the last
    aead = _aead(cipher, enc.subkey)
    pos, lengths = 32, []
    for i in range(chunks):
        length = int.from_bytes(aead.decrypt(_nonce(2 * i), wire[pos : pos + LENGTH_CHUNK], None), "big")
        lengths.append(length)
        pos += LENGTH_CHUNK + length + TAG
    assert lengths[:-1] == [MAX_PAYLOAD] * (chunks - 1) and sum(lengths) == size
    assert StreamDecryptor(cipher, master).feed(wire) == plain


def test_feeding_byte_by_byte_equals_feeding_everything_at_once():
    cipher = "aes-128-gcm"
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    wire = enc.encrypt(b"first") + enc.encrypt(b"second chunk" * 3) + enc.encrypt(b"z")
    whole = StreamDecryptor(cipher, master)
    expected = whole.feed(wire)
    trickle = StreamDecryptor(cipher, master)
    pieces = [trickle.feed(wire[i : i + 1]) for i in range(len(wire))]
    assert b"".join(pieces) == expected == b"first" + b"second chunk" * 3 + b"z"
    assert trickle.nonce == whole.nonce == 6
    # output appears exactly when a payload's tag completes, never earlier
    assert [i for i, p in enumerate(pieces) if p] == [
        16 + LENGTH_CHUNK + 5 + TAG - 1,
        16 + 2 * (LENGTH_CHUNK + TAG) + 5 + 36 - 1,
        len(wire) - 1,
    ]


def test_decryptor_says_when_an_eof_would_cut_a_salt_or_chunk():
    cipher = "aes-128-gcm"
    master = _master(cipher)
    wire = StreamEncryptor(cipher, master).encrypt(b"abc")
    dec = StreamDecryptor(cipher, master)
    assert not dec.pending
    cut_points = {5: True, 16: False, 16 + LENGTH_CHUNK: True, len(wire) - 1: True}
    fed = 0
    for point, pending in sorted(cut_points.items()):
        dec.feed(wire[fed:point])
        fed = point
        assert dec.pending is pending, point
    assert dec.feed(wire[fed:]) == b"abc" and not dec.pending


def test_decryptor_knows_salt_and_subkey_only_once_the_salt_arrived():
    cipher = "aes-256-gcm"
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    wire = enc.encrypt(b"data")
    dec = StreamDecryptor(cipher, master)
    assert dec.feed(wire[:31]) == b""
    assert dec.salt is None and dec.subkey is None and dec.nonce == 0
    assert dec.feed(wire[31:33]) == b""
    assert dec.salt == enc.salt and dec.subkey == enc.subkey and dec.nonce == 0


@pytest.mark.parametrize("cipher", ALL_CIPHERS)
def test_a_flipped_byte_anywhere_is_an_authentication_error(cipher):
    master = _master(cipher)
    wire = StreamEncryptor(cipher, master).encrypt(b"payload!")
    for i in range(len(wire)):
        tampered = bytearray(wire)
        tampered[i] ^= 0x01
        with pytest.raises(ShadowsocksAuthError) as info:
            StreamDecryptor(cipher, master).feed(bytes(tampered))
        assert info.value.reason == "bad-tag"


def test_wrong_password_is_an_authentication_error():
    cipher = "aes-256-gcm"
    wire = StreamEncryptor(cipher, _master(cipher, "right")).encrypt(b"hello")
    with pytest.raises(ShadowsocksAuthError):
        StreamDecryptor(cipher, _master(cipher, "wrong")).feed(wire)


def _stream_with_length(cipher: str, master: bytes, length: int) -> bytes:
    salt = bytes(CIPHERS[cipher].salt_size)
    aead = _aead(cipher, derive_subkey(cipher, master, salt))
    return salt + aead.encrypt(_nonce(0), length.to_bytes(2, "big"), None)


@pytest.mark.parametrize("length", [MAX_PAYLOAD + 1, 0xFFFF])
def test_a_length_above_max_payload_is_a_protocol_error(length):
    cipher = "aes-128-gcm"
    master = _master(cipher)
    with pytest.raises(ShadowsocksProtocolError) as info:
        StreamDecryptor(cipher, master).feed(_stream_with_length(cipher, master, length))
    assert info.value.reason == "chunk-too-long"


def test_a_length_of_exactly_max_payload_waits_for_its_payload():
    cipher = "aes-128-gcm"
    master = _master(cipher)
    dec = StreamDecryptor(cipher, master)
    assert dec.feed(_stream_with_length(cipher, master, MAX_PAYLOAD)) == b""
    assert dec.nonce == 1


def test_a_failed_decryptor_refuses_all_further_input():
    cipher = "aes-128-gcm"
    master = _master(cipher)
    good = StreamEncryptor(cipher, master).encrypt(b"ok")
    dec = StreamDecryptor(cipher, master)
    with pytest.raises(ShadowsocksAuthError):
        dec.feed(b"\x00" * len(good))
    assert dec.failed
    for data in (b"", good):
        with pytest.raises(ShadowsocksAuthError):
            dec.feed(data)
    proto = StreamDecryptor(cipher, master)
    with pytest.raises(ShadowsocksProtocolError):
        proto.feed(_stream_with_length(cipher, master, 0xFFFF))
    with pytest.raises(ShadowsocksProtocolError):
        proto.feed(b"")


def test_a_relay_can_continue_the_stream_from_subkey_and_nonce():
    """The native relay takes over after the address header: it seals with
    ``encryptor.subkey`` from ``encryptor.nonce`` and opens the server's
    direction from the decryptor's salt on."""
    cipher = "chacha20-ietf-poly1305"
    master = _master(cipher)
    enc = StreamEncryptor(cipher, master)
    header = enc.encrypt(encode_address(Address("example.com", 443)))
    aead, n = _aead(cipher, enc.subkey), enc.nonce
    body = b"client hello"
    continued = aead.encrypt(_nonce(n), len(body).to_bytes(2, "big"), None) + aead.encrypt(
        _nonce(n + 1), body, None
    )
    server = StreamDecryptor(cipher, master)
    plain = server.feed(header + continued)
    address, end = decode_address(plain)
    assert (address, plain[end:]) == (Address("example.com", 443), body)


def test_errors_are_honk_errors_with_a_stable_reason():
    assert issubclass(ShadowsocksAuthError, HonkError) and issubclass(ShadowsocksProtocolError, HonkError)
    assert ShadowsocksAuthError("bad-tag").reason == "bad-tag"


def test_framing_repr_shows_no_key_material():
    cipher = "aes-256-gcm"
    master = _master(cipher)
    framing = ShadowsocksFraming(
        cipher, master, StreamEncryptor(cipher, master), StreamDecryptor(cipher, master)
    )
    text = repr(framing)
    assert "aes-256-gcm" in text and master.hex() not in text and repr(master) not in text


# --- UDP packets -----------------------------------------------------------------


@pytest.mark.parametrize("cipher", ALL_CIPHERS)
def test_packet_round_trips_for_each_cipher(cipher):
    master = _master(cipher)
    payload = encode_address(Address("10.1.2.3", 53)) + b"\x12\x34query"
    packet = seal_packet(cipher, master, payload)
    spec = CIPHERS[cipher]
    assert len(packet) == spec.salt_size + len(payload) + spec.tag_size
    assert open_packet(cipher, master, packet) == payload


def test_packet_is_salt_and_payload_sealed_under_nonce_zero():
    cipher = "aes-128-gcm"
    master = _master(cipher)
    salt = b"S" * 16
    packet = seal_packet(cipher, master, b"abc", salt=salt)
    assert packet[:16] == salt
    assert _aead(cipher, derive_subkey(cipher, master, salt)).decrypt(_nonce(0), packet[16:], None) == b"abc"


def test_every_packet_gets_its_own_salt():
    master = _master("aes-128-gcm")
    assert len({seal_packet("aes-128-gcm", master, b"x")[:16] for _ in range(8)}) == 8


def test_a_packet_shorter_than_salt_and_tag_is_a_protocol_error():
    master = _master("aes-256-gcm")
    with pytest.raises(ShadowsocksProtocolError) as info:
        open_packet("aes-256-gcm", master, bytes(32 + 15))
    assert info.value.reason == "packet-too-short"


def test_a_tampered_packet_or_wrong_password_is_an_authentication_error():
    cipher = "chacha20-ietf-poly1305"
    packet = seal_packet(cipher, _master(cipher), b"\x01\x7f\x00\x00\x01\x00\x35dns")
    for i in (0, 31, 32, len(packet) - 1):
        tampered = bytearray(packet)
        tampered[i] ^= 0x80
        with pytest.raises(ShadowsocksAuthError):
            open_packet(cipher, _master(cipher), bytes(tampered))
    with pytest.raises(ShadowsocksAuthError):
        open_packet(cipher, _master(cipher, "other"), packet)


# --- addresses -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "wire"),
    [
        (Address("192.0.2.7", 443), b"\x01\xc0\x00\x02\x07\x01\xbb"),
        (Address("2001:db8::1", 53), b"\x04" + bytes.fromhex("20010db8" + "0" * 22 + "01") + b"\x00\x35"),
        (Address("example.com", 80), b"\x03\x0bexample.com\x00\x50"),
    ],
)
def test_addresses_use_the_socks5_encoding(address, wire):
    assert encode_address(address) == wire
    assert decode_address(b"junk" + wire + b"rest", 4) == (address, 4 + len(wire))


@pytest.mark.parametrize("wire", [b"", b"\x01\x7f\x00", b"\x03\x05ab", b"\x04" + bytes(17)])
def test_a_truncated_address_is_a_protocol_error(wire):
    with pytest.raises(ShadowsocksProtocolError) as info:
        decode_address(wire)
    assert info.value.reason == "truncated-address"


@pytest.mark.parametrize(
    "wire", [b"\x02\x00\x00\x00\x00\x00\x00", b"\x03\x00\x00\x50", b"\x03\x02a\x00\x00\x50"]
)
def test_a_malformed_address_is_a_protocol_error(wire):
    with pytest.raises(ShadowsocksProtocolError) as info:
        decode_address(wire)
    assert info.value.reason == "bad-address"


def test_a_burst_of_streams_draws_salts_from_one_getrandom_call_and_never_repeats_one(monkeypatch) -> None:
    from honk.proto import shadowsocks

    calls: list[int] = []
    real = shadowsocks.os.urandom
    monkeypatch.setattr(shadowsocks.os, "urandom", lambda n: (calls.append(n), real(n))[1])
    source = shadowsocks._SaltSource()
    salts = [source.take(32) for _ in range(shadowsocks.SALT_POOL_BYTES // 32 * 3)]
    assert len(set(salts)) == len(salts) and all(len(s) == 32 for s in salts)
    assert calls == [shadowsocks.SALT_POOL_BYTES] * 3  # one call per 128 salts of 32 bytes
    assert len(source.take(shadowsocks.SALT_POOL_BYTES + 1)) == shadowsocks.SALT_POOL_BYTES + 1


def test_a_forked_child_does_not_repeat_its_parents_salts() -> None:
    import os

    from honk.proto import shadowsocks

    source = shadowsocks._SaltSource()
    source.take(16)  # the buffer is filled in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next salt, to the parent
        os.write(write, source.take(16))
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 16 and child != source.take(16)
