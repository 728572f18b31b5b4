"""Every framing a dial hands a relay keeps the one relay contract (honk.proto.framing.Framing):
its kind is one the engines know, its two directions are a Sealer and an Opener, and each
engine FRAMING_* verdict becomes one of the codec's own typed errors."""

from __future__ import annotations

import ssl

import pytest
from helpers.vmess_rig import vmess_client

from honk._fast import relay
from honk.core.errors import HonkError
from honk.proto.framing import FRAMING_KINDS, Framing, Opener, Sealer
from honk.proto.shadowsocks import ShadowsocksFraming
from honk.proto.tls_framing import TlsFraming
from honk.proto.trojan import TrojanStreamWatch
from honk.proto.vless import VlessResponseDecoder
from honk.proto.vmess import VmessFraming

VERDICTS = (relay.FRAMING_AUTH, relay.FRAMING_PROTOCOL, relay.FRAMING_TRUNCATED, relay.FRAMING_SILENT)


def _tls(response) -> TlsFraming:
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    sslobj = context.wrap_bio(incoming, outgoing, server_hostname="node.example")
    return TlsFraming(sslobj, incoming, outgoing, response)


FRAMINGS = {
    "shadowsocks": lambda: ShadowsocksFraming("aes-128-gcm", bytes(16)),
    "vmess": lambda: VmessFraming(vmess_client("aes-128-gcm")),
    "trojan-tls": lambda: _tls(TrojanStreamWatch()),
    "vless-tls": lambda: _tls(VlessResponseDecoder()),
    "vmess-tls": lambda: _tls(VmessFraming(vmess_client("chacha20-poly1305"))),
}


@pytest.mark.parametrize("make", FRAMINGS.values(), ids=FRAMINGS.keys())
def test_each_framing_keeps_the_relay_contract(make):
    framing = make()
    assert isinstance(framing, Framing)
    assert framing.kind in FRAMING_KINDS
    assert isinstance(framing.encryptor, Sealer)
    assert isinstance(framing.decryptor, Opener)
    assert isinstance(framing.decryptor.pending, bool)
    if framing.kind != "tls":  # TLS seals its end only after the handshake
        assert isinstance(framing.end(), bytes)
    assert framing.errors and all(issubclass(e, HonkError) for e in framing.errors)


@pytest.mark.parametrize("make", FRAMINGS.values(), ids=FRAMINGS.keys())
@pytest.mark.parametrize("verdict", VERDICTS)
def test_every_engine_verdict_is_one_of_the_codecs_typed_errors(make, verdict):
    framing = make()
    error = framing.error_for(verdict)
    assert isinstance(error, framing.errors)


def test_a_half_read_chunk_is_pending():
    framing = ShadowsocksFraming("aes-128-gcm", bytes(16))
    assert framing.decryptor.feed(b"\x00" * 7) == b""  # part of the server's salt
    assert framing.decryptor.pending
