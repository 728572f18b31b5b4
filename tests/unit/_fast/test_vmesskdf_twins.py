"""VMess AEAD's key derivation (honk._fast.vmesskdf): the compiled kernel and its twin give
the bytes of a third implementation built from the standard library's ``hmac`` (each salt's
HMAC using the previous HMAC as its hash function, as v2ray's kdf.go nests them), for keys
and salts of every length around SHA-256's 64-byte block, deep paths and bytes-like input."""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS, vmesskdf

IMPLS = [pytest.param("py", id="py")]
if not NO_EXTENSIONS:  # the twin run has no compiled module to compare
    IMPLS.append(pytest.param("c", id="c", marks=pytest.mark.compiled))


@pytest.fixture(params=IMPLS)
def kdf(request):
    return importlib.import_module(f"honk._fast.vmesskdf_{request.param}").kdf


def stdlib_kdf(key: bytes, *path: bytes) -> bytes:
    make = hashlib.sha256
    for salt in (b"VMess AEAD KDF", *path):
        make = functools.partial(lambda salt, parent, data=b"": hmac.new(salt, data, parent), salt, make)
    return make(key).digest()


def test_the_root_key_is_v2rays():
    assert vmesskdf.KDF_ROOT == b"VMess AEAD KDF"


def test_a_request_headers_key_matches_the_stdlib_chain(kdf):
    key, aid, nonce = bytes(range(16)), bytes(range(16, 32)), bytes(range(8))
    for salt in (
        b"VMess Header AEAD Key_Length",
        b"VMess Header AEAD Nonce_Length",
        b"VMess Header AEAD Key",
        b"VMess Header AEAD Nonce",
    ):
        assert kdf(key, salt, aid, nonce) == stdlib_kdf(key, salt, aid, nonce)


@pytest.mark.parametrize("length", [0, 1, 63, 64, 65, 191, 192, 193, 400])
def test_keys_and_salts_around_the_block_and_the_stack_buffer(kdf, length):
    # 64: a salt longer is hashed first; 192 = 256 - 64: a longer message leaves the stack buffer
    blob = bytes((i * 7 + length) & 0xFF for i in range(length))
    assert kdf(blob) == stdlib_kdf(blob)
    assert kdf(blob, blob) == stdlib_kdf(blob, blob)
    assert kdf(b"k", b"salt", blob, b"n") == stdlib_kdf(b"k", b"salt", blob, b"n")


def test_a_path_deeper_than_the_compiled_layers_take_gives_the_same_bytes(kdf):
    path = tuple(bytes([i]) * (i + 1) for i in range(10))  # the compiled layers take 8
    assert kdf(b"key", *path) == stdlib_kdf(b"key", *path)


def test_bytes_like_input_is_read_as_its_bytes(kdf):
    assert kdf(bytearray(b"key"), memoryview(b"salt"), bytearray(b"aid")) == stdlib_kdf(
        b"key", b"salt", b"aid"
    )
    with pytest.raises(TypeError):
        kdf("not bytes", b"salt")


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300), st.lists(st.binary(max_size=150), max_size=4))
def test_both_implementations_match_the_stdlib_chain(key, path):
    want = stdlib_kdf(key, *path)
    for impl in IMPLS:
        module = importlib.import_module(f"honk._fast.vmesskdf_{impl.values[0]}")
        assert module.kdf(key, *path) == want
