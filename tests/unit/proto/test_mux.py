"""Mux.Cool frames and the client session table: exact bytes, splits, typed errors, episodes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.core.errors import CapacityRefused, HonkError, UpstreamFailed
from honk.core.net import Address, Network
from honk.proto.mux import (
    DEFAULT_CONCURRENCY,
    MAX_METADATA,
    MUX_COOL_TARGET,
    MuxClientSessions,
    MuxDecoder,
    MuxEventKind,
    MuxFrame,
    MuxProtocolError,
    MuxSessionReset,
    SessionState,
    SessionStatus,
    encode_frame,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WEB = Address("example.com", 80)
DNS = Address("8.8.8.8", 53)


# --- exact bytes ---------------------------------------------------------------------


def test_new_tcp_frame_with_data_matches_the_spec_layout() -> None:
    frame = MuxFrame(1, SessionStatus.NEW, b"GET", network=Network.TCP, target=WEB)
    expected = (
        b"\x00\x14"  # metadata length 20
        + b"\x00\x01\x01\x01"  # session 1, New, option data
        + b"\x01"  # network TCP
        + b"\x00\x50\x02\x0bexample.com"  # port 80, domain
        + b"\x00\x03GET"
    )
    assert encode_frame(frame) == expected


def test_new_udp_frame_to_ipv6_without_data() -> None:
    frame = MuxFrame(0x0102, SessionStatus.NEW, network=Network.UDP, target=Address("::1", 53))
    assert encode_frame(frame) == b"\x00\x18\x01\x02\x01\x00\x02\x00\x35\x03" + bytes(15) + b"\x01"


def test_keep_end_and_keep_alive_frames_carry_only_the_four_byte_head() -> None:
    assert encode_frame(MuxFrame(7, SessionStatus.KEEP, b"xy")) == b"\x00\x04\x00\x07\x02\x01\x00\x02xy"
    assert encode_frame(MuxFrame(7, SessionStatus.END)) == b"\x00\x04\x00\x07\x03\x00"
    assert encode_frame(MuxFrame(7, SessionStatus.END, error=True)) == b"\x00\x04\x00\x07\x03\x02"
    assert encode_frame(MuxFrame(0, SessionStatus.KEEP_ALIVE)) == b"\x00\x04\x00\x00\x04\x00"


def test_udp_keep_frame_names_the_peer_with_ipv4_type_1() -> None:
    frame = MuxFrame(3, SessionStatus.KEEP, b"q", network=Network.UDP, target=DNS)
    assert encode_frame(frame) == b"\x00\x0c\x00\x03\x02\x01\x02\x00\x35\x01\x08\x08\x08\x08\x00\x01q"


def test_empty_data_part_differs_from_no_data_part() -> None:
    assert encode_frame(MuxFrame(2, SessionStatus.KEEP, b"")) == b"\x00\x04\x00\x02\x02\x01\x00\x00"
    assert MuxDecoder().feed(b"\x00\x04\x00\x02\x02\x01\x00\x00") == [MuxFrame(2, SessionStatus.KEEP, b"")]


def test_a_new_frame_without_a_target_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        encode_frame(MuxFrame(1, SessionStatus.NEW, network=Network.TCP))


def test_mux_cool_target_is_v2rays_pseudo_destination() -> None:
    assert MUX_COOL_TARGET == Address("v1.mux.cool", 9527)


# --- decoding ----------------------------------------------------------------------

FRAMES = [
    MuxFrame(1, SessionStatus.NEW, b"hello", network=Network.TCP, target=WEB),
    MuxFrame(2, SessionStatus.NEW, network=Network.UDP, target=DNS),
    MuxFrame(1, SessionStatus.KEEP, b"x" * 700),
    MuxFrame(2, SessionStatus.KEEP, b"answer", network=Network.UDP, target=Address("1.1.1.1", 53)),
    MuxFrame(0, SessionStatus.KEEP_ALIVE),
    MuxFrame(1, SessionStatus.END),
    MuxFrame(2, SessionStatus.END, error=True),
]


def test_frames_split_at_every_byte_decode_to_the_same_frames() -> None:
    wire = b"".join(encode_frame(f) for f in FRAMES)
    for cut in range(len(wire) + 1):
        dec = MuxDecoder()
        got = dec.feed(wire[:cut]) + dec.feed(wire[cut:]) if 0 < cut < len(wire) else dec.feed(wire)
        assert got == FRAMES, cut
        assert not dec.pending
    dec = MuxDecoder()
    assert [f for i in range(len(wire)) for f in dec.feed(wire[i : i + 1])] == FRAMES


def test_extra_metadata_on_end_frames_is_ignored_as_v2ray_does() -> None:
    assert MuxDecoder().feed(b"\x00\x06\x00\x09\x03\x00\xaa\xbb") == [MuxFrame(9, SessionStatus.END)]


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"\x00\x04\x00\x01\x07\x00", "bad-status"),
        (b"\x00\x04\x00\x01\x00\x00", "bad-status"),
        (b"\x00\x0c\x00\x01\x01\x00\x03\x00\x35\x01\x08\x08\x08\x08", "bad-network"),
        (b"\x00\x0c\x00\x01\x01\x00\x01\x00\x35\x04\x08\x08\x08\x08", "bad-address-type"),
        (b"\x00\x08\x00\x01\x01\x00\x01\x00\x35\x02", "truncated-address"),
        (b"\x00\x04\x00\x01\x01\x00", "truncated-address"),  # a New frame with no network byte (fuzz-found)
        (b"\x00\x09\x00\x01\x01\x00\x01\x00\x35\x02\x00", "empty-domain"),
        (b"\x00\x03\x00\x01\x02", "metadata-too-short"),
        ((MAX_METADATA + 1).to_bytes(2, "big"), "metadata-too-long"),
    ],
)
def test_malformed_frames_are_typed_protocol_errors_that_stick(wire: bytes, reason: str) -> None:
    dec = MuxDecoder()
    with pytest.raises(MuxProtocolError) as info:
        dec.feed(wire)
    assert info.value.reason == reason
    assert isinstance(info.value, HonkError)
    with pytest.raises(MuxProtocolError):
        dec.feed(encode_frame(MuxFrame(0, SessionStatus.KEEP_ALIVE)))


def test_oversized_metadata_is_refused_before_its_bytes_arrive() -> None:
    with pytest.raises(MuxProtocolError) as info:
        MuxDecoder().feed(b"\xff\xff")
    assert info.value.reason == "metadata-too-long"


def test_eof_inside_a_frame_is_truncated_frame_and_between_frames_is_clean() -> None:
    wire = encode_frame(FRAMES[0])
    dec = MuxDecoder()
    assert dec.feed(wire[:-1]) == []
    with pytest.raises(MuxProtocolError) as info:
        dec.feed(b"")
    assert info.value.reason == "truncated-frame"
    clean = MuxDecoder()
    clean.feed(wire)
    assert clean.feed(b"") == []


_targets = st.one_of(
    st.ip_addresses().map(str),
    st.from_regex(r"[a-z0-9]{1,30}(\.[a-z]{2,6})?", fullmatch=True),
)
_frames = st.one_of(
    st.builds(
        lambda sid, net, host, port, data: MuxFrame(
            sid, SessionStatus.NEW, data, network=net, target=Address(host, port)
        ),
        st.integers(0, 0xFFFF),
        st.sampled_from([Network.TCP, Network.UDP]),
        _targets,
        st.integers(0, 0xFFFF),
        st.none() | st.binary(max_size=64),
    ),
    st.builds(
        lambda sid, status, data, error: MuxFrame(sid, status, data, error),
        st.integers(0, 0xFFFF),
        st.sampled_from([SessionStatus.KEEP, SessionStatus.END, SessionStatus.KEEP_ALIVE]),
        st.none() | st.binary(max_size=64),
        st.booleans(),
    ),
    st.builds(
        lambda sid, host, data: MuxFrame(
            sid, SessionStatus.KEEP, data, network=Network.UDP, target=Address(host, 53)
        ),
        st.integers(0, 0xFFFF),
        _targets,
        st.binary(max_size=64),
    ),
)


@FUZZ
@given(st.lists(_frames, max_size=8), st.integers(1, 13))
def test_frames_round_trip_in_any_split(frames: list[MuxFrame], step: int) -> None:
    wire = b"".join(encode_frame(f) for f in frames)
    dec = MuxDecoder()
    got: list[MuxFrame] = []
    for i in range(0, len(wire), step):
        got += dec.feed(wire[i : i + step])
    assert got == frames


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_random_bytes_into_the_decoder_raise_only_typed_errors(chunks: list[bytes]) -> None:
    dec = MuxDecoder()
    try:
        for chunk in [*chunks, b""]:
            dec.feed(chunk)
    except MuxProtocolError:
        assert dec.failed


@FUZZ
@given(st.lists(_frames, min_size=1, max_size=4), st.data())
def test_a_mutated_carrier_yields_frames_or_a_typed_error(
    frames: list[MuxFrame], data: st.DataObject
) -> None:
    wire = bytearray(b"".join(encode_frame(f) for f in frames))
    i = data.draw(st.integers(0, len(wire) - 1))
    wire[i] ^= data.draw(st.integers(1, 255))
    try:
        MuxDecoder().feed(bytes(wire))
    except MuxProtocolError:
        pass


# --- the session table ---------------------------------------------------------------


def test_sessions_get_ids_from_one_and_a_new_frame_each() -> None:
    table = MuxClientSessions()
    first, frame = table.open(Network.TCP, WEB, b"GET /")
    second, _ = table.open(Network.UDP, DNS)
    assert (first.id, second.id) == (1, 2)
    assert frame == MuxFrame(1, SessionStatus.NEW, b"GET /", network=Network.TCP, target=WEB)
    assert len(table) == 2 and first.state is SessionState.OPEN


def test_table_refuses_sessions_beyond_its_bound() -> None:
    table = MuxClientSessions()
    for _ in range(DEFAULT_CONCURRENCY):
        table.open(Network.TCP, WEB)
    assert table.full
    with pytest.raises(CapacityRefused):
        table.open(Network.TCP, WEB)


def test_ids_wrap_and_skip_ids_still_in_use() -> None:
    table = MuxClientSessions(max_sessions=2)
    keeper, _ = table.open(Network.TCP, WEB)  # id 1 stays open throughout
    for _ in range(0xFFFF + 3):
        session, _ = table.open(Network.TCP, WEB)
        assert session.id not in (0, keeper.id)
        table.abort(session.id)
    assert table.get(keeper.id) is keeper


def test_keep_frames_for_udp_name_the_peer_and_tcp_ones_do_not() -> None:
    table = MuxClientSessions()
    tcp, _ = table.open(Network.TCP, WEB)
    udp, _ = table.open(Network.UDP, DNS)
    assert table.send(tcp.id, b"a") == MuxFrame(tcp.id, SessionStatus.KEEP, b"a")
    other = Address("9.9.9.9", 53)
    assert table.send(udp.id, b"q", other) == MuxFrame(
        udp.id, SessionStatus.KEEP, b"q", network=Network.UDP, target=other
    )


def test_received_data_maps_to_its_session_with_the_udp_source() -> None:
    table = MuxClientSessions()
    tcp, _ = table.open(Network.TCP, WEB)
    udp, _ = table.open(Network.UDP, DNS)
    event = table.receive(MuxFrame(tcp.id, SessionStatus.KEEP, b"body"))
    assert (event.kind, event.session, event.data, event.source) == (MuxEventKind.DATA, tcp, b"body", None)
    event = table.receive(MuxFrame(udp.id, SessionStatus.KEEP, b"ans", network=Network.UDP, target=DNS))
    assert (event.session, event.source) == (udp, DNS)


def test_close_half_closes_until_the_servers_end() -> None:
    table = MuxClientSessions()
    session, _ = table.open(Network.TCP, WEB)
    assert table.close(session.id) == MuxFrame(session.id, SessionStatus.END)
    assert session.state is SessionState.HALF_CLOSED
    with pytest.raises(ValueError):
        table.send(session.id, b"late")
    assert table.receive(MuxFrame(session.id, SessionStatus.KEEP, b"tail")).data == b"tail"
    event = table.receive(MuxFrame(session.id, SessionStatus.END))
    assert event.kind is MuxEventKind.END and session.state is SessionState.ENDED
    assert session.error is None and table.idle


def test_abort_sends_end_with_the_error_option() -> None:
    table = MuxClientSessions()
    session, _ = table.open(Network.TCP, WEB)
    assert table.abort(session.id) == MuxFrame(session.id, SessionStatus.END, error=True)
    assert session.state is SessionState.ENDED and len(table) == 0


def test_data_for_an_unknown_session_is_answered_with_an_end() -> None:
    event = MuxClientSessions().receive(MuxFrame(42, SessionStatus.KEEP, b"stray"))
    assert event.kind is MuxEventKind.IGNORED
    assert event.reply == MuxFrame(42, SessionStatus.END)


def test_keep_alive_and_server_new_frames_are_ignored() -> None:
    table = MuxClientSessions()
    table.open(Network.TCP, WEB)
    assert table.receive(MuxFrame(0, SessionStatus.KEEP_ALIVE)).kind is MuxEventKind.IGNORED
    new = MuxFrame(1, SessionStatus.NEW, network=Network.TCP, target=WEB)
    assert table.receive(new).kind is MuxEventKind.IGNORED
    assert len(table) == 1


def test_carrier_failure_ends_all_50_sessions_with_the_same_error_object() -> None:
    table = MuxClientSessions(max_sessions=64)
    sessions = [table.open(Network.TCP, WEB)[0] for _ in range(50)]
    table.close(sessions[0].id)  # half-closed sessions end with the carrier too
    error = UpstreamFailed("carrier reset")
    ended = table.fail(error)
    assert len(ended) == 50 and set(map(id, ended)) == set(map(id, sessions))
    assert all(s.state is SessionState.ENDED and s.error is error for s in sessions)
    assert table.idle
    with pytest.raises(UpstreamFailed) as info:
        table.open(Network.TCP, WEB)
    assert info.value is error


def test_a_second_failure_keeps_the_first_episode() -> None:
    table = MuxClientSessions()
    first = UpstreamFailed("reset")
    table.fail(first)
    session_error = UpstreamFailed("later")
    table.fail(session_error)
    assert table.failure is first


def test_server_end_for_one_session_leaves_the_other_49() -> None:
    table = MuxClientSessions(max_sessions=64)
    sessions = [table.open(Network.TCP, WEB)[0] for _ in range(50)]
    victim = sessions[17]
    event = table.receive(MuxFrame(victim.id, SessionStatus.END, error=True))
    assert event.kind is MuxEventKind.END and event.session is victim
    assert isinstance(victim.error, MuxSessionReset) and victim.error.session_id == victim.id
    assert len(table) == 49
    assert all(s.state is SessionState.OPEN for s in sessions if s is not victim)
    # a later data frame for the ended session does not revive it
    assert table.receive(MuxFrame(victim.id, SessionStatus.KEEP, b"x")).kind is MuxEventKind.IGNORED
    assert len(table) == 49


def test_max_sessions_outside_v2rays_range_is_refused() -> None:
    with pytest.raises(ValueError):
        MuxClientSessions(max_sessions=0)
    with pytest.raises(ValueError):
        MuxClientSessions(max_sessions=1025)
