"""Inbound sessions by tag, the principals users authenticate as, and their revocation.

A *session* is one accepted client connection: it belongs to the inbound TAG it
was accepted under, not to the listener (RL-43), so stopping a listener or
swapping its handler never ends one. The reconciler ends sessions in two ways
only: :meth:`SessionRegistry.close_tag` for tags that leave the configuration,
and :meth:`SessionRegistry.revoke` for sessions bound to a revoked principal.

A *principal* is the identity object a user of one inbound tag authenticates
as (RL-54). :func:`admit` keeps the same object while the user stays admitted
with the same credential, so "the sessions of this user as admitted then" is an
identity test, and a user of the same name on another inbound is untouched.

One registry per daemon; everything runs on the event loop's thread, so each
method is atomic with respect to the others (the "registry lock" of RL-56/58).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from honk.config.policies import CLOSE_AFTER_KIND, CLOSE_KIND, KEEP_KIND, ClosePolicy
from honk.config.spec import InboundUser
from honk.core.clock import Clock, TimerHandle
from honk.core.errors import FlowClosed, HonkError
from honk.core.logs import kv

__all__ = [
    "USER_REMOVED_TEXT",
    "Principal",
    "Session",
    "SessionRegistry",
    "admit",
    "authenticate",
]

log = logging.getLogger("honk.inbound")

# RL-57: the refusal (and its log line) when a session's first flow presents a revoked principal.
USER_REMOVED_TEXT = "the user was removed before the session opened a flow"
# What a revoked session's flows end with (close, or close_after once the grace has passed).
_REVOKED_TEXT = "the user was removed"


@dataclass(eq=False, slots=True)
class Principal:
    """One user as admitted by one inbound tag; compared by identity only."""

    inbound: str
    username: str
    credential: str = field(repr=False)
    revoked: bool = False


def admit(
    running: Mapping[str, Principal] | None, tag: str, users: Iterable[InboundUser]
) -> tuple[dict[str, Principal], list[Principal]]:
    """The admissions of ``users`` on inbound ``tag``, and the running principals to revoke.

    ``running`` is the tag's current table (username → principal), or ``None``. A user
    still listed with the credential it was admitted with keeps the same principal
    object; a removed user, or one whose credential changed, has its principal in the
    revoked list (a changed one gets a new principal). Principals of another tag are
    never reused: a renamed inbound starts afresh, its old tag's sessions end by
    :meth:`SessionRegistry.close_tag`. Pure: nothing is marked revoked here.
    """
    running = running or {}
    admissions: dict[str, Principal] = {}
    for user in users:
        if user.username in admissions:
            continue  # the first entry of a name wins, as authentication would find it
        old = running.get(user.username)
        if (
            old is not None
            and not old.revoked
            and old.inbound == tag
            and hmac.compare_digest(old.credential.encode(), user.password.encode())
        ):
            admissions[user.username] = old
        else:
            admissions[user.username] = Principal(tag, user.username, user.password)
    kept = {id(p) for p in admissions.values()}
    revoked = [p for p in running.values() if id(p) not in kept and p.inbound == tag]
    return admissions, revoked


def authenticate(admissions: Mapping[str, Principal], username: str, password: str) -> Principal | None:
    """The principal these credentials authenticate as, or ``None``.

    Every entry is compared in constant time, so timing reveals neither names nor passwords.
    """
    found: Principal | None = None
    name = username.encode()
    secret = password.encode()
    for principal in admissions.values():
        name_ok = hmac.compare_digest(principal.username.encode(), name)
        pass_ok = hmac.compare_digest(principal.credential.encode(), secret)
        if name_ok and pass_ok:
            found = principal
    return found


class Listener(Protocol):
    """What the registry asks of a listener (a :class:`~honk.inbound.mixed.MixedInbound`)."""

    name: str  # the tag its current handler serves

    @property
    def stopped(self) -> bool:
        """Whether it has stopped accepting."""

    @property
    def retired(self) -> bool:
        """Stopped, with nothing left that only it can end: the registry forgets it."""

    def sweep_tag(self, tag: str | None, error: HonkError, *, stopped_and_swept: bool) -> int:
        """End the connections of ``tag`` (``None``: of every tag) it serves without a
        registered session (the SOCKS5 fast path's); ``stopped_and_swept``: also drop the
        ones it has accepted but not yet reported."""


class _Tracker(Protocol):
    def close_session(self, session: object, reason: HonkError | str | None = None) -> int: ...


def _as_error(reason: HonkError | str | None) -> HonkError:
    if isinstance(reason, HonkError):
        return reason
    return FlowClosed(reason or "closed by request")


class Session:
    """One accepted client connection of an inbound tag.

    ``principal`` is ``None`` until (unless) the client authenticates. The owner sets
    ``task`` and ``conn`` (something with ``fail(error)``) and calls :meth:`finish` when
    the connection has ended.
    """

    __slots__ = (
        "tag",
        "principal",
        "opened",
        "task",
        "conn",
        "error",
        "_registry",
        "_tracker",
        "_timer",
        "_finished",
    )

    def __init__(self, registry: SessionRegistry, tag: str, tracker: _Tracker) -> None:
        self.tag = tag
        self.principal: Principal | None = None
        # its first flow went through: from then on it is bound to its principal, and a
        # removal policy applies to it (before, the first flow is refused instead; RL-57)
        self.opened = False
        self.task: asyncio.Task[Any] | None = None
        self.conn: Any = None
        self.error: HonkError | None = None  # why it was ended from outside, once it was
        self._registry = registry
        self._tracker = tracker
        self._timer: TimerHandle | None = None
        self._finished = False

    def __repr__(self) -> str:
        user = self.principal.username if self.principal is not None else "-"
        return f"<Session tag={self.tag} user={user}>"

    @property
    def ended(self) -> bool:
        """Asked to end from outside (close_tag, revoke, close_all) or finished."""
        return self.error is not None or self._finished

    def bind(self, principal: Principal | None) -> None:
        """The client authenticated as ``principal``: a revocation of it now reaches this session."""
        self.principal = principal

    def end(self, reason: HonkError | str | None = None) -> bool:
        """End the session now: its flows (the tracker's ``close_session``), its client
        connection, and its task unless closing its flows ends it. False if it had ended."""
        if self.ended:
            return False
        error = _as_error(reason)
        self.error = error
        self._cancel_timer()
        closed = self._tracker.close_session(self, error)
        if self.conn is not None:
            self.conn.fail(error)
        task = self.task
        if closed == 0 and task is not None and not task.done():
            # still in its handshake or dialling: no flow to close, so stop the task itself
            task.cancel()
        return True

    def end_after(self, clock: Clock, grace: float, reason: HonkError | str | None = None) -> None:
        """End the session once ``grace`` seconds of ``clock`` have passed (unless it ends first)."""
        if self.ended or self._timer is not None:
            return
        self._timer = clock.call_later(grace, lambda: self._grace_over(reason))
        self._registry._timed.add(self)

    def _grace_over(self, reason: HonkError | str | None) -> None:
        self._timer = None
        self._registry._timed.discard(self)
        self.end(reason)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._registry._timed.discard(self)

    def finish(self) -> None:
        """The connection has ended: forget the session and its pending timer."""
        if self._finished:
            return
        self._finished = True
        self._cancel_timer()
        self._registry._discard(self)


class SessionRegistry:
    """Every live session of every inbound, by tag (one per daemon)."""

    def __init__(self) -> None:
        self._by_tag: dict[str, set[Session]] = {}
        self._listeners: set[Listener] = set()
        # stopped listeners whose tag close_tag ended (weak: a retired listener is forgotten)
        self._swept: weakref.WeakSet[Listener] = weakref.WeakSet()
        self._timed: set[Session] = set()  # sessions with a close_after timer pending
        self._closed = False

    def __len__(self) -> int:
        return sum(len(sessions) for sessions in self._by_tag.values())

    def sessions(self, tag: str | None = None) -> list[Session]:
        """The live sessions (of ``tag``), for introspection and tests."""
        if tag is not None:
            return list(self._by_tag.get(tag, ()))
        return [s for sessions in self._by_tag.values() for s in sessions]

    @property
    def pending_timers(self) -> int:
        """close_after timers armed and not yet fired or cancelled."""
        return len(self._timed)

    # -- listeners ------------------------------------------------------------------

    def attach(self, listener: Listener) -> None:
        """A listener bound sockets: close_tag may need it to sweep what it serves."""
        self._listeners.difference_update([known for known in self._listeners if known.retired])
        self._listeners.add(listener)

    def detach(self, listener: Listener) -> None:
        """The listener has closed: nothing of it is left to sweep."""
        self._listeners.discard(listener)

    # -- opening --------------------------------------------------------------------

    def open(
        self, listener: Listener, tag: str, tracker: _Tracker, *, accepted_earlier: bool = False
    ) -> Session | None:
        """Register the session of a connection ``listener`` accepted for ``tag``; ``None``
        when it must not open (RL-58): the registry is closed, the listener has stopped
        (a connection accepted as it stopped), or, for a connection the listener had
        accepted before it stopped (``accepted_earlier``: the fast path's handovers), the
        tag was closed since."""
        if self._closed or listener in self._swept:
            return None
        if listener.stopped and not accepted_earlier:
            return None
        session = Session(self, tag, tracker)
        self._by_tag.setdefault(tag, set()).add(session)
        return session

    def _discard(self, session: Session) -> None:
        sessions = self._by_tag.get(session.tag)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self._by_tag[session.tag]

    # -- closing --------------------------------------------------------------------

    def close_tag(self, tag: str, reason: HonkError | str | None = None) -> int:
        """End every session of ``tag`` on any listener, live or stopped, handshaking or
        relaying; returns how many were ended. A stopped listener now serving ``tag``
        opens no session afterwards (RL-58)."""
        error = _as_error(reason if reason is not None else f"inbound {tag} was removed")
        ended = sum(1 for session in list(self._by_tag.get(tag, ())) if session.end(error))
        for listener in list(self._listeners):
            swept = listener.stopped and listener.name == tag
            if swept:
                self._swept.add(listener)
            ended += listener.sweep_tag(tag, error, stopped_and_swept=swept)
            if listener.retired:
                self._listeners.discard(listener)
        return ended

    def close_all(self, reason: HonkError | str | None = None) -> int:
        """End every session of every tag; returns how many were ended."""
        error = _as_error(reason if reason is not None else "closed by request")
        ended = sum(1 for session in self.sessions() if session.end(error))
        for listener in list(self._listeners):
            ended += listener.sweep_tag(None, error, stopped_and_swept=listener.stopped)
        return ended

    def revoke(self, principals: Iterable[Principal], policy: ClosePolicy, clock: Clock) -> int:
        """Revoke ``principals`` (RL-56) and apply ``policy`` to the sessions bound to exactly
        those objects: ``keep`` leaves them, ``close`` ends them now, ``close_after`` ends
        them once ``policy.grace`` seconds of ``clock`` have passed (a timer the session's
        own end, or :meth:`aclose`, cancels). Only a principal's first revocation acts.
        Returns how many sessions the policy ended or scheduled."""
        acted = 0
        for principal in principals:
            if principal.revoked:
                continue
            principal.revoked = True
            bound = [
                s for s in self._by_tag.get(principal.inbound, ()) if s.principal is principal and s.opened
            ]
            if not bound or policy.kind == KEEP_KIND:
                continue
            error = FlowClosed(_REVOKED_TEXT)
            for session in bound:
                if policy.kind == CLOSE_KIND or self._closed:
                    acted += session.end(error)
                elif policy.kind == CLOSE_AFTER_KIND:
                    session.end_after(clock, policy.grace, error)
                    acted += 1
            log.debug(
                "user revoked %s",
                kv(
                    inbound=principal.inbound,
                    user=principal.username,
                    policy=str(policy),
                    sessions=len(bound),
                ),
            )
        return acted

    async def aclose(self, reason: HonkError | str | None = None) -> int:
        """Shutdown (RL-70): cancel every pending grace timer, refuse new sessions and end
        every live one; returns how many were ended. Never waits for a grace."""
        self._closed = True
        for session in list(self._timed):
            session._cancel_timer()
        return self.close_all(reason if reason is not None else "honk is shutting down")
