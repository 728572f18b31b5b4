"""The native API's objects, built from a real plane and health state without sockets."""

from __future__ import annotations

import json

import pytest

from honk.alive.outcome import Domain, Family
from honk.api import native_views as views
from honk.config.diagnostics import Diagnostic, Severity, SourceLoc
from honk.config.load import load_text
from honk.connection.plane import Plane, build_plane
from honk.connection.tracker import ConnectionInfo
from honk.control.health import HealthService
from honk.core.clock import FakeClock
from honk.core.net import Address, Network
from honk.group.filter import node_id_of

TCP, UDP = Network.TCP, Network.UDP

CONFIG = """node {
    a: 'socks5://alice:hunter2pw@127.0.0.1:1080'
    b: 'socks5://[::1]:1081'
    c: 'http://127.0.0.1:3128'
}
group {
    pick {
        filter: name(a, b)
        default: b
    }
    auto {
        filter: name(a, c)
        policy: min_moving_avg
        check_url: 'http://example.com/gen'
        interrupt_connections: true
    }
    spread {
        filter: name(a, b)
        policy: round_robin
    }
    scored {
        filter: name(a)
        policy: score
    }
    outer {
        filter: group(pick)
    }
}
routing {
    fallback: pick
}
"""


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.health = HealthService(self.clock, watch_network=False)
        self.alive = self.health.alive
        self.plane: Plane = build_plane(load_text(CONFIG, "dae"), self.clock, 1, health=self.health.filter)
        for name in ("a", "b", "c"):
            self.alive.register_node(self.id(name), name)

    def id(self, name: str):  # noqa: ANN201
        return node_id_of(self.plane.outbounds[name])


@pytest.fixture
def world() -> World:
    return World()


# --- units -------------------------------------------------------------------------------------


def test_times_are_rfc3339_utc_with_milliseconds():
    assert views.rfc3339(1_700_000_000.1239) == "2023-11-14T22:13:20.123Z"
    assert views.rfc3339(0.0) == "1970-01-01T00:00:00.000Z"


def test_delays_are_milliseconds_with_three_decimals():
    assert views.millis(0.0123456) == 12.346
    assert views.millis(None) is None


# --- groups ------------------------------------------------------------------------------------


def test_a_selector_shows_its_effective_choice_per_network_and_no_pins(world):
    world.plane.groups.select("pick", "a", UDP)
    group = views.group_view(world.plane, "pick")
    assert group["policy"] == "selector"
    assert group["members"] == ["a", "b"]
    assert group["choice"] == {"tcp": "b", "udp": "a"}  # TCP falls back to the default
    assert group["selection"] == {"tcp": "b", "udp": "a"}
    assert group["chain"] == {"tcp": ["pick", "b"], "udp": ["pick", "a"]}
    assert group["pinned"] is None
    assert group["id"] == str(world.plane.groups.identity_of("pick").uid)


def test_an_automatic_group_shows_its_pins_and_no_choice(world):
    group = views.group_view(world.plane, "auto")
    assert group["pinned"] == {"tcp": None, "udp": None}
    assert group["choice"] is None
    assert group["check_url"] == "http://example.com/gen" and group["interrupt_connections"] is True
    world.plane.groups.pin("auto", "c", TCP)
    group = views.group_view(world.plane, "auto")
    assert group["pinned"] == {"tcp": "c", "udp": None}
    assert group["selection"]["tcp"] == "c"


def test_loadbalance_has_neither_choice_nor_pins_and_score_keeps_its_policy_name(world):
    spread = views.group_view(world.plane, "spread")
    assert spread["policy"] == "loadbalance" and spread["choice"] is None and spread["pinned"] is None
    scored = views.group_view(world.plane, "scored")
    assert scored["policy"] == "score" and scored["pinned"] is None and scored["choice"] is None


def test_reading_a_loadbalance_group_does_not_move_its_cursor(world):
    first = views.group_view(world.plane, "spread")["selection"]
    assert [views.group_view(world.plane, "spread")["selection"] for _ in range(3)] == [first] * 3


def test_a_nested_group_chain_runs_from_the_group_to_the_leaf(world):
    group = views.group_view(world.plane, "outer")
    assert group["chain"]["tcp"] == ["outer", "pick", "b"]
    assert group["selection"]["tcp"] == "pick"
    assert group["leaves"] == ["a", "b"]


def test_groups_are_listed_in_configuration_order(world):
    assert [g["name"] for g in views.groups_view(world.plane)] == [
        "pick",
        "auto",
        "spread",
        "scored",
        "outer",
    ]


# --- nodes -------------------------------------------------------------------------------------


def test_builtins_have_no_id_server_or_health(world):
    direct = views.node_view(world.plane, world.alive, "direct")
    assert direct["id"] is None and direct["server"] is None and direct["health"] == {}
    assert direct["protocol"] == "direct" and direct["latency"] == {"last_ms": None, "history": []}


def test_a_node_shows_its_server_and_never_its_credentials(world):
    node = views.node_view(world.plane, world.alive, "a")
    assert node["server"] == "127.0.0.1:1080" and node["protocol"] == "socks5"
    assert node["id"] == str(world.id("a"))
    text = json.dumps([views.node_view(world.plane, world.alive, name) for name in world.plane.outbounds])
    assert "alice" not in text and "hunter2pw" not in text
    assert views.node_view(world.plane, world.alive, "b")["server"] == "[::1]:1081"


def test_health_shows_only_the_states_that_exist_with_the_last_ten_history_entries(world):
    node_id = world.id("a")
    for i in range(12):
        world.clock.advance(1.0)
        world.alive.notify_check_success(node_id, Domain.TCP, Family.V4, 0.010 + i / 1000)
    world.alive.notify_check_failure(node_id, Domain.DNS_UDP, Family.V6)
    health = views.node_view(world.plane, world.alive, "a")["health"]
    assert set(health) == {"tcp", "dns_udp"}
    assert set(health["tcp"]) == {"v4"} and set(health["dns_udp"]) == {"v6"}
    link = health["tcp"]["v4"]
    assert link["status"] == "alive" and link["average_ms"] is not None
    assert len(link["history"]) == views.HISTORY_ENTRIES
    assert link["history"][-1] == {
        "time": views.rfc3339(world.clock.wall()),
        "delay_ms": 21.0,
        "failed": False,
    }
    assert health["dns_udp"]["v6"]["history"][-1]["failed"] is True


def test_latency_history_leaves_out_the_synthetic_placeholders(world):
    node_id = world.id("c")
    world.alive.notify_check_success(node_id, Domain.TCP, Family.V4, 0.05)
    world.alive.record_dial_failure(node_id, Family.V4)
    world.alive.record_dial_failure(node_id, Family.V4)  # two in a row: a 10 s placeholder and a strike
    node = views.node_view(world.plane, world.alive, "c")
    assert node["latency"]["last_ms"] == 50.0
    assert [e["delay_ms"] for e in node["latency"]["history"]] == [50.0]
    assert node["demoted"] is True


def test_a_node_whose_every_tcp_state_is_dead_is_not_counted_alive(world):
    assert views.node_counts(world.plane, world.alive) == {"total": 3, "alive": 3}
    node_id = world.id("b")
    for _ in range(3):
        world.alive.notify_check_failure(node_id, Domain.TCP, Family.V6, force=True)
    assert views.node_counts(world.plane, world.alive) == {"total": 3, "alive": 2}


# --- connections, diagnostics, status ----------------------------------------------------------


def info(chain: tuple[str, ...], network: Network = TCP, flow_id: str = "f1") -> ConnectionInfo:
    return ConnectionInfo(
        id=flow_id,
        network=network,
        inbound="lan",
        source=Address("127.0.0.1", 50000),
        target=Address("::1", 443),
        rule="fallback",
        chain=chain,
        upload=10,
        download=20,
        start=1_700_000_000.5,
        plane_generation=1,
        engine="native",
    )


def test_a_connection_has_text_addresses_and_an_rfc3339_start():
    assert views.conn_view(info(("outer", "pick", "a"))) == {
        "id": "f1",
        "network": "tcp",
        "inbound": "lan",
        "source": "127.0.0.1:50000",
        "target": "[::1]:443",
        "rule": "fallback",
        "chain": ["outer", "pick", "a"],
        "upload": 10,
        "download": 20,
        "start": "2023-11-14T22:13:20.500Z",
        "engine": "native",
        "outbound_version": "",
        "user": "",
    }


def test_flows_by_group_match_any_group_on_the_chain_and_flows_by_node_only_the_leaf():
    flows = [
        info(("outer", "pick", "a"), flow_id="1"),
        info(("pick", "b"), flow_id="2"),
        info(("a",), flow_id="3"),
        info(("auto", "a"), flow_id="4"),
    ]
    assert [f.id for f in views.flows_through_group(flows, "pick")] == ["1", "2"]
    assert [f.id for f in views.flows_through_group(flows, "a")] == []  # a leaf is not a group hop
    assert [f.id for f in views.flows_on_node(flows, "a")] == ["1", "3", "4"]


def test_a_diagnostic_without_a_line_has_null_line_and_column():
    d = Diagnostic(Severity.ERROR, "unknown-key", "global.bogus", "unknown key", SourceLoc("<posted>", 0))
    assert views.diag_view(d) == {
        "severity": "error",
        "code": "unknown-key",
        "key_path": "global.bogus",
        "line": None,
        "column": None,
        "message": "unknown key",
    }
    located = Diagnostic(Severity.WARNING, "w", "k", "m", SourceLoc("<posted>", 7))
    assert views.diag_view(located)["line"] == 7


def test_status_counts_connections_by_network_and_reports_the_traffic_totals(world):
    flows = [info(("pick", "a")), info(("pick", "a"), UDP), info(("pick", "b"))]
    status = views.status_view(
        version="0.1.0",
        uptime=12.3456,
        generation=4,
        mode="rule",
        plane=world.plane,
        alive=world.alive,
        flows=flows,
        totals=(100, 200),
        address="127.0.0.1:9090",
    )
    assert status["connections"] == {"tcp": 2, "udp": 1}
    assert status["traffic"] == {"up": 100, "down": 200}
    assert status["groups"] == 5 and status["generation"] == 4 and status["uptime_s"] == 12.346
    assert status["api"] == {"address": "127.0.0.1:9090"}


def test_version_reports_the_api_version_and_start_time():
    v = views.version_view("0.1.0", 42, 1_700_000_000.0, 5.0)
    assert v == {
        "version": "0.1.0",
        "api": 1,
        "pid": 42,
        "started_at": "2023-11-14T22:13:20.000Z",
        "uptime_s": 5.0,
    }
