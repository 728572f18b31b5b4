"""A node's ready pool of bare server connections (honk.outbound.ready), with real socket pairs
standing for a connection and its server end; times are arguments."""

from __future__ import annotations

import socket
import uuid

import pytest

from honk.outbound.ready import POOL_DISABLE_ENV, READY_MAX_IDLE, READY_POOL_MAX, ReadyPool, bypassed
from honk.outbound.runtime import NodeRuntime, WarmOwner

T0 = 1000.0


@pytest.fixture
def pairs():
    """Connected pairs ``(client, server)``; every socket closed at the end."""
    made: list[socket.socket] = []

    def make() -> tuple[socket.socket, socket.socket]:
        a, b = socket.socketpair()
        made.extend((a, b))
        return a, b

    yield make
    for sock in made:
        sock.close()


def test_a_deposited_connection_serves_the_next_take_as_a_hit(pairs):
    pool = ReadyPool()
    client, _server = pairs()
    assert pool.deposit(client, T0)
    assert pool.entries == 1 and pool.has_ready(T0 + 1)
    assert pool.take(T0 + 1) is client
    assert (pool.hits, pool.misses, pool.entries) == (1, 0, 0)
    assert pool.take(T0 + 2) is None and pool.misses == 1


def test_a_connection_older_than_the_idle_limit_is_closed_not_served(pairs):
    pool = ReadyPool()
    client, _server = pairs()
    pool.deposit(client, T0)
    assert not pool.has_ready(T0 + READY_MAX_IDLE)
    assert pool.take(T0 + READY_MAX_IDLE) is None
    assert client.fileno() == -1 and pool.misses == 1


@pytest.mark.parametrize("server_did", ["close", "send"])
def test_a_connection_the_server_closed_or_spoke_on_is_spent(pairs, server_did):
    pool = ReadyPool()
    stale, server = pairs()
    fresh, _other = pairs()
    pool.deposit(fresh, T0)
    pool.deposit(stale, T0 + 1)  # newest: tried first
    if server_did == "close":
        server.close()
    else:
        server.sendall(b"unsolicited")
    assert pool.take(T0 + 2) is fresh  # the spent one closed, the next served
    assert stale.fileno() == -1 and pool.hits == 1


def test_a_full_pool_closes_what_it_cannot_keep(pairs):
    pool = ReadyPool()
    kept = [pairs()[0] for _ in range(READY_POOL_MAX)]
    extra, _server = pairs()
    assert all(pool.deposit(sock, T0) for sock in kept)
    assert not pool.deposit(extra, T0)
    assert extra.fileno() == -1 and pool.entries == READY_POOL_MAX


def test_honk_pool_disable_bypasses_the_pool(pairs, monkeypatch):
    monkeypatch.setenv(POOL_DISABLE_ENV, "1")
    pool = ReadyPool()
    client, _server = pairs()
    assert not pool.deposit(client, T0) and client.fileno() == -1
    assert not pool.has_ready(T0) and pool.take(T0) is None
    assert (pool.hits, pool.misses) == (0, 0)  # a bypassed pool counts nothing


def test_reap_closes_expired_and_dead_connections_only(pairs):
    pool = ReadyPool()
    old, _s1 = pairs()
    dead, s2 = pairs()
    pool.deposit(old, T0)
    pool.deposit(dead, T0 + READY_MAX_IDLE - 1)
    s2.close()
    assert pool.reap(T0 + READY_MAX_IDLE) == 2 and pool.entries == 0
    live, _s3 = pairs()
    pool.deposit(live, T0)
    assert pool.reap(T0 + 1) == 0 and pool.entries == 1


def test_the_last_warm_owner_letting_go_drains_the_ready_pool_and_another_keeps_it(pairs):
    runtime = NodeRuntime(uuid.uuid4(), "n")
    runtime.hold(WarmOwner.SELECTOR_PIN)
    runtime.hold(WarmOwner.UDP_WARM)
    client, _server = pairs()
    runtime.ready.deposit(client, T0)
    assert not runtime.let_go(WarmOwner.SELECTOR_PIN)  # the UDP owner still holds it
    assert runtime.ready.entries == 1
    assert runtime.let_go(WarmOwner.UDP_WARM)
    assert runtime.ready.entries == 0 and client.fileno() == -1
    assert not runtime.let_go(WarmOwner.UDP_WARM)  # letting go twice changes nothing


def test_a_closed_runtime_closes_its_ready_connections(pairs):
    runtime = NodeRuntime(uuid.uuid4(), "n")
    client, _server = pairs()
    runtime.ready.deposit(client, T0)
    runtime.close()
    assert client.fileno() == -1


@pytest.mark.parametrize("warm", [False, True])
def test_a_probe_through_the_node_takes_no_ready_connection(pairs, warm):
    runtime = NodeRuntime(uuid.uuid4(), "n")
    if warm:
        runtime.hold(WarmOwner.SELECTOR_PIN)
    client, _server = pairs()
    runtime.ready.deposit(client, T0)
    with runtime.cold_guard():  # what the prober wraps a probe in
        assert runtime.ready.take(T0 + 1) is None
    with bypassed():
        assert runtime.ready.take(T0 + 1) is None
    assert (runtime.ready.hits, runtime.ready.misses, runtime.ready.entries) == (0, 0, 1)  # kept for a flow
    assert runtime.ready.take(T0 + 1) is client
