"""Which TLS session a dial offers: the per-server bookkeeping of the resuming client context.

Handshakes themselves are in tests/integration/test_tls_client.py (haproxy as the
server); here the connections are stand-ins that count how often their session is
taken, because taking one copies it (certificate and all) and is the cost kept in check.
"""

from __future__ import annotations

import pytest

from honk.outbound import tls

SERVER = (("127.0.0.1", 443), "example.com")
OTHER = (("127.0.0.1", 8443), "example.com")


class Ticket:
    def __init__(self, has_ticket: bool = True) -> None:
        self.has_ticket = has_ticket


class Handshake:
    """An SSLObject after its handshake, as far as the context looks at one."""

    def __init__(
        self, ticket: Ticket | None = None, *, reused: bool = False, version: str = "TLSv1.3"
    ) -> None:
        self.ticket, self.session_reused, self._version, self.taken = ticket, reused, version, 0

    def version(self) -> str:
        return self._version

    @property
    def session(self) -> Ticket | None:
        self.taken += 1
        return self.ticket


@pytest.fixture
def context() -> tls._ResumingContext:
    return tls._new_context(None)


def test_a_first_dial_offers_nothing(context) -> None:
    assert context.offer(SERVER, 0.0) is None


def test_the_ticket_of_a_full_handshake_is_offered_to_the_next_dial(context) -> None:
    ticket = Ticket()
    context.learn(SERVER, Handshake(ticket), 0.0)
    assert context.offer(SERVER, 1.0) is ticket
    assert context.offer(OTHER, 1.0) is None  # another server address: nothing to offer


def test_an_accepted_session_is_offered_again_without_taking_another(context) -> None:
    ticket = Ticket()
    context.learn(SERVER, Handshake(ticket), 0.0)
    context.offer(SERVER, 1.0)
    resumed = Handshake(Ticket(), reused=True)
    context.learn(SERVER, resumed, 1.0)
    assert context.offer(SERVER, 2.0) is ticket
    assert resumed.taken == 0


def test_a_refused_session_is_dropped_for_the_next_full_handshakes_ticket(context) -> None:
    context.learn(SERVER, Handshake(Ticket()), 0.0)
    context.offer(SERVER, 1.0)
    newer = Ticket()
    context.learn(SERVER, Handshake(newer, reused=False), 1.0)  # the server did not take the offer
    assert context.offer(SERVER, 2.0) is newer


def test_a_server_that_sent_no_ticket_is_not_looked_at_again_before_the_retry(context) -> None:
    first = Handshake(Ticket(has_ticket=False))
    context.learn(SERVER, first, 0.0)
    assert context.offer(SERVER, 0.5) is None
    later = [Handshake(Ticket()) for _ in range(3)]
    for handshake in later:
        context.learn(SERVER, handshake, 1.0)
        assert context.offer(SERVER, 1.0) is None
    assert first.taken == 1 and all(h.taken == 0 for h in later)
    retried = Handshake(Ticket())
    context.learn(SERVER, retried, 0.5 + tls.HARVEST_RETRY)
    assert context.offer(SERVER, 0.5 + tls.HARVEST_RETRY) is retried.ticket


def test_each_full_handshake_has_its_session_taken_at_most_once(context) -> None:
    handshake = Handshake(Ticket(has_ticket=False))
    context.learn(SERVER, handshake, 0.0)
    for _ in range(5):
        context.offer(SERVER, 0.0)
    assert handshake.taken == 1


def test_tls12_handshakes_are_never_resumed_from(context) -> None:
    """Resuming TLS 1.2 reuses the old master secret: no forward secrecy for that connection."""
    context.learn(SERVER, Handshake(Ticket(), version="TLSv1.2"), 0.0)
    assert context.offer(SERVER, 1.0) is None


def test_the_servers_remembered_are_bounded_oldest_first(context) -> None:
    servers = [(("127.0.0.1", 1000 + i), "example.com") for i in range(tls.RESUMED_SERVERS + 1)]
    for key in servers:
        context.learn(key, Handshake(Ticket()), 0.0)
    assert context.offer(servers[0], 1.0) is None
    assert context.offer(servers[-1], 1.0) is not None
    assert len(context._sessions) == tls.RESUMED_SERVERS
