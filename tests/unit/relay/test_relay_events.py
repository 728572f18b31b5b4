"""The relay engine's END event is unpacked in one place (honk.relay.events.decode_end) and
turned into a flow's typed error in one place (honk.relay.native.end_error)."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import relay
from honk.core.errors import ClientGone, FlowClosed, RelayError, UpstreamFailed
from honk.proto.shadowsocks import ShadowsocksAuthError, ShadowsocksFraming, ShadowsocksProtocolError
from honk.relay.events import EndCause, RelayEnd, Side, decode_end
from honk.relay.native import end_error


@given(
    side=st.sampled_from([relay.SIDE_CLIENT, relay.SIDE_UPSTREAM, relay.SIDE_LOCAL]),
    err=st.integers(0, 0xFFFF),
)
def test_an_error_end_unpacks_its_side_and_errno(side, err):
    end = decode_end(relay.END_ERROR, side << 16 | err)
    assert end == RelayEnd(EndCause.ERROR, Side(side), err)


@pytest.mark.parametrize(
    ("cause", "expected"), [(relay.END_CLEAN, EndCause.CLEAN), (relay.END_CANCELLED, EndCause.CANCELLED)]
)
def test_clean_and_cancelled_ends_carry_no_side(cause, expected):
    end = decode_end(cause, 0)
    assert (end.cause, end.side, end.errno) == (expected, None, 0)


def test_each_end_becomes_the_error_of_its_side():
    framing = ShadowsocksFraming("aes-128-gcm", bytes(16))
    up = relay.SIDE_UPSTREAM << 16
    assert end_error(decode_end(relay.END_CLEAN, 0), framing) is None
    assert isinstance(end_error(decode_end(relay.END_CANCELLED, 0), framing), FlowClosed)
    assert isinstance(end_error(decode_end(relay.END_ERROR, errno.ECONNRESET), None), ClientGone)
    assert isinstance(end_error(decode_end(relay.END_ERROR, up | errno.ECONNRESET), framing), UpstreamFailed)
    local = end_error(decode_end(relay.END_ERROR, relay.SIDE_LOCAL << 16 | errno.ENOMEM), None)
    assert type(local) is RelayError


def test_a_framing_verdict_is_the_codecs_error_only_on_the_upstream_side_of_a_framed_flow():
    framing = ShadowsocksFraming("aes-128-gcm", bytes(16))
    up = relay.SIDE_UPSTREAM << 16
    assert decode_end(relay.END_ERROR, up | relay.FRAMING_AUTH).framing_verdict
    assert isinstance(
        end_error(decode_end(relay.END_ERROR, up | relay.FRAMING_AUTH), framing), ShadowsocksAuthError
    )
    assert isinstance(
        end_error(decode_end(relay.END_ERROR, up | relay.FRAMING_TRUNCATED), framing),
        ShadowsocksProtocolError,
    )
    # the same errno from the client's socket, or on a plain flow, is a socket error
    assert not decode_end(relay.END_ERROR, relay.FRAMING_AUTH).framing_verdict
    assert isinstance(end_error(decode_end(relay.END_ERROR, up | relay.FRAMING_AUTH), None), UpstreamFailed)
