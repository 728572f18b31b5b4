"""Principals, admission and the session registry (honk/inbound/sessions.py), without sockets.

The registry is driven with stand-ins: a listener that only says whether it stopped, a
tracker that records ``close_session`` calls, a connection that records ``fail``. The
inbound end to end is in tests/integration/test_inbound_listener.py.
"""

from __future__ import annotations

import asyncio

from honk.config.policies import CLOSE, KEEP, close_after
from honk.config.spec import InboundUser
from honk.core.clock import FakeClock
from honk.core.errors import FlowClosed, HonkError
from honk.inbound.sessions import Principal, SessionRegistry, admit, authenticate

GRACE = 5.0  # seconds: the close_after grace of these tests
JUST_BEFORE = 4.9  # seconds: inside the grace


class FakeListener:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stopped = False
        self.swept: list[tuple[str | None, bool]] = []

    @property
    def retired(self) -> bool:
        return self.stopped

    def sweep_tag(self, tag: str | None, error: HonkError, *, stopped_and_swept: bool) -> int:
        self.swept.append((tag, stopped_and_swept))
        return 0


class FakeTracker:
    def __init__(self, flows_per_session: int = 1) -> None:
        self.closed: list[tuple[object, HonkError]] = []
        self.flows_per_session = flows_per_session

    def close_session(self, session: object, reason: HonkError | str | None = None) -> int:
        assert isinstance(reason, HonkError)
        self.closed.append((session, reason))
        return self.flows_per_session


class FakeConn:
    def __init__(self) -> None:
        self.failed: HonkError | None = None

    def fail(self, error: HonkError) -> None:
        self.failed = error


def _users(*pairs: tuple[str, str]) -> tuple[InboundUser, ...]:
    return tuple(InboundUser(name, password) for name, password in pairs)


def _open(
    registry: SessionRegistry,
    listener: FakeListener,
    tracker: FakeTracker,
    tag: str,
    principal: Principal | None = None,
    *,
    opened: bool = True,
):
    """A session authenticated as ``principal``; ``opened``: its first flow went through."""
    session = registry.open(listener, tag, tracker)
    assert session is not None
    session.conn = FakeConn()
    session.bind(principal)
    session.opened = opened
    return session


# --- admit -------------------------------------------------------------------------------


def test_admit_keeps_the_same_principal_for_a_user_with_the_same_password() -> None:
    first, revoked0 = admit(None, "lan", _users(("alice", "pw"), ("bob", "pw2")))
    second, revoked = admit(first, "lan", _users(("bob", "pw2"), ("alice", "pw"), ("carol", "pw3")))

    assert revoked0 == []
    assert second["alice"] is first["alice"]
    assert second["bob"] is first["bob"]
    assert second["carol"].inbound == "lan" and second["carol"].username == "carol"
    assert revoked == []


def test_admit_revokes_a_removed_user_and_a_user_whose_password_changed() -> None:
    first, _ = admit(None, "lan", _users(("alice", "pw"), ("bob", "pw2"), ("carol", "pw3")))
    second, revoked = admit(first, "lan", _users(("alice", "new"), ("carol", "pw3")))

    assert set(map(id, revoked)) == {id(first["alice"]), id(first["bob"])}
    assert second["alice"] is not first["alice"]
    assert second["alice"].credential == "new"
    assert second["carol"] is first["carol"]
    assert not any(p.revoked for p in revoked)  # admit is pure: revoke() marks them


def test_admit_gives_a_revoked_principal_a_new_one_even_with_the_same_password() -> None:
    first, _ = admit(None, "lan", _users(("alice", "pw")))
    first["alice"].revoked = True
    second, _ = admit(first, "lan", _users(("alice", "pw")))

    assert second["alice"] is not first["alice"]


def test_admit_never_reuses_or_revokes_principals_of_another_tag() -> None:
    other, _ = admit(None, "old-name", _users(("alice", "pw")))
    renamed, revoked = admit(other, "new-name", _users(("alice", "pw")))

    assert renamed["alice"] is not other["alice"]
    assert renamed["alice"].inbound == "new-name"
    assert revoked == []


def test_principal_compares_by_identity_and_hides_its_credential() -> None:
    a = Principal("lan", "alice", "secret")
    b = Principal("lan", "alice", "secret")

    assert a != b
    assert "secret" not in repr(a)


def test_authenticate_finds_the_principal_for_matching_credentials_only() -> None:
    table, _ = admit(None, "lan", _users(("alice", "pw"), ("bob", "pw2")))

    assert authenticate(table, "bob", "pw2") is table["bob"]
    assert authenticate(table, "bob", "pw") is None
    assert authenticate(table, "mallory", "pw2") is None
    assert authenticate({}, "alice", "pw") is None


# --- opening and closing by tag ----------------------------------------------------------------


def test_close_tag_ends_only_the_sessions_of_that_tag() -> None:
    registry, tracker = SessionRegistry(), FakeTracker()
    lan, wan = FakeListener("lan"), FakeListener("wan")
    registry.attach(lan)
    registry.attach(wan)
    mine = [_open(registry, lan, tracker, "lan") for _ in range(2)]
    other = _open(registry, wan, tracker, "wan")

    ended = registry.close_tag("lan", "inbound lan was removed")

    assert ended == 2
    assert {id(s) for s, _ in tracker.closed} == set(map(id, mine))
    assert all(isinstance(s.conn.failed, FlowClosed) for s in mine)
    assert other.conn.failed is None and not other.ended
    assert ("lan", False) in lan.swept  # the fast path's clients of the tag are asked too


def test_close_tag_reaches_sessions_of_a_stopped_listener() -> None:
    registry, tracker = SessionRegistry(), FakeTracker()
    lan = FakeListener("lan")
    registry.attach(lan)
    session = _open(registry, lan, tracker, "lan")
    lan.stopped = True

    assert registry.close_tag("lan") == 1
    assert session.ended


def test_a_listener_that_stopped_opens_no_session_for_a_connection_accepted_as_it_stopped() -> None:
    registry, tracker = SessionRegistry(), FakeTracker()
    lan = FakeListener("lan")
    registry.attach(lan)
    lan.stopped = True

    assert registry.open(lan, "lan", tracker) is None
    assert len(registry) == 0


def test_a_stopped_listener_whose_tag_was_closed_opens_no_session_even_for_earlier_accepts() -> None:
    registry, tracker = SessionRegistry(), FakeTracker()
    lan = FakeListener("lan")
    registry.attach(lan)
    lan.stopped = True
    assert registry.open(lan, "lan", tracker, accepted_earlier=True) is not None  # a handover: served

    registry.close_tag("lan")

    assert registry.open(lan, "lan", tracker, accepted_earlier=True) is None
    assert ("lan", True) in lan.swept  # and the listener drops what it has not reported yet


def test_ending_a_session_without_flows_cancels_its_task() -> None:
    async def main() -> None:
        registry, tracker = SessionRegistry(), FakeTracker(flows_per_session=0)
        lan = FakeListener("lan")
        session = _open(registry, lan, tracker, "lan")
        session.task = asyncio.get_running_loop().create_future()  # a handshake that waits

        assert session.end("gone")
        assert not session.end("again")  # idempotent
        assert session.task.cancelled()

    asyncio.run(main())


def test_ending_a_session_with_flows_lets_the_flows_end_it() -> None:
    async def main() -> None:
        registry, tracker = SessionRegistry(), FakeTracker(flows_per_session=1)
        session = _open(registry, FakeListener("lan"), tracker, "lan")
        session.task = asyncio.get_running_loop().create_future()

        session.end("gone")

        assert not session.task.cancelled()
        session.task.cancel()

    asyncio.run(main())


def test_a_finished_session_leaves_the_registry() -> None:
    registry, tracker = SessionRegistry(), FakeTracker()
    session = _open(registry, FakeListener("lan"), tracker, "lan")

    session.finish()

    assert len(registry) == 0
    assert registry.close_tag("lan") == 0


# --- revoke ---------------------------------------------------------------------------------------


def _revocation_rig():
    registry, tracker, clock = SessionRegistry(), FakeTracker(), FakeClock()
    lan, wan = FakeListener("lan"), FakeListener("wan")
    lan_table, _ = admit(None, "lan", _users(("alice", "pw"), ("bob", "pw")))
    wan_table, _ = admit(None, "wan", _users(("alice", "pw")))
    alice = _open(registry, lan, tracker, "lan", lan_table["alice"])
    bob = _open(registry, lan, tracker, "lan", lan_table["bob"])
    alice_on_wan = _open(registry, wan, tracker, "wan", wan_table["alice"])
    anonymous = _open(registry, lan, tracker, "lan")
    return registry, clock, lan_table["alice"], (alice, bob, alice_on_wan, anonymous)


def test_revoke_with_keep_marks_the_principal_and_ends_nothing() -> None:
    registry, clock, principal, sessions = _revocation_rig()

    assert registry.revoke([principal], KEEP, clock) == 0

    assert principal.revoked
    assert not any(s.ended for s in sessions)


def test_revoke_with_close_ends_only_sessions_bound_to_that_principal() -> None:
    registry, clock, principal, (alice, bob, alice_on_wan, anonymous) = _revocation_rig()

    assert registry.revoke([principal], CLOSE, clock) == 1

    assert alice.ended and isinstance(alice.conn.failed, FlowClosed)
    assert not bob.ended and not alice_on_wan.ended and not anonymous.ended


def test_revoke_with_close_after_ends_the_session_when_the_grace_has_passed() -> None:
    registry, clock, principal, (alice, bob, alice_on_wan, _) = _revocation_rig()

    assert registry.revoke([principal], close_after(GRACE), clock) == 1
    clock.advance(JUST_BEFORE)
    assert not alice.ended
    clock.advance(GRACE - JUST_BEFORE)

    assert alice.ended
    assert not bob.ended and not alice_on_wan.ended
    assert registry.pending_timers == 0


def test_a_session_that_ends_first_cancels_its_grace_timer() -> None:
    registry, clock, principal, (alice, *_) = _revocation_rig()
    registry.revoke([principal], close_after(GRACE), clock)

    alice.finish()

    assert registry.pending_timers == 0
    assert clock.sleepers == 0


def test_only_the_first_revocation_of_a_principal_acts() -> None:
    registry, clock, principal, (alice, *_) = _revocation_rig()
    registry.revoke([principal], KEEP, clock)

    assert registry.revoke([principal], CLOSE, clock) == 0
    assert not alice.ended


def test_aclose_cancels_pending_grace_timers_and_ends_every_session() -> None:
    async def main() -> None:
        registry, clock, principal, sessions = _revocation_rig()
        registry.revoke([principal], close_after(3600.0), clock)
        assert registry.pending_timers == 1

        ended = await registry.aclose()

        assert registry.pending_timers == 0 and clock.sleepers == 0
        assert ended == len(sessions)
        assert all(s.ended for s in sessions)
        assert registry.open(FakeListener("lan"), "lan", FakeTracker()) is None

    asyncio.run(main())


def test_revoke_spares_a_session_that_has_not_opened_a_flow_yet() -> None:
    """RL-57: such a session is not bound yet; its first flow is refused instead, under every policy."""
    registry, listener, tracker = SessionRegistry(), FakeListener("lan"), FakeTracker()
    alice = admit(None, "lan", _users(("alice", "pa")))[0]["alice"]
    waiting = _open(registry, listener, tracker, "lan", alice, opened=False)
    assert registry.revoke([alice], CLOSE, FakeClock()) == 0
    assert not waiting.ended and alice.revoked
