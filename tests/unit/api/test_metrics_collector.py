"""The /metrics collector: text formatting (a stand-in control, formatting only) and what it reads
from a real daemon (its own API app with only the metrics routes, a real aiohttp client)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiohttp import test_utils
from helpers.apidaemon import LAN_INBOUND, bearer, metric_samples, quiet_global, running_daemon
from helpers.servers import free_port
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from honk import __version__
from honk.alive.outcome import Domain, Family
from honk.api import metrics
from honk.api.webapp import build_app
from honk.core.clock import FakeClock
from honk.core.errors import DialError
from honk.core.net import Address, FlowMeta, Network
from honk.core.stats import DIAL_ERROR_KINDS, PROBE_BUCKETS, RuntimeStats

SECRET = "metrics-secret"
NODE_PASSWORD = "hunter2-node-pw"  # must never reach the exposition

# no API block: the tests serve the metrics routes from an app of their own
ROUTED = """node {{
    a: 'socks5://honk:{password}@127.0.0.1:{closed}'
    b: 'socks5://127.0.0.1:{closed}'
}}
group {{
    proxy {{
        filter: name(a, b)
    }}
}}
routing {{
    fallback: proxy
}}
"""


def config_text(password: str) -> str:
    return quiet_global() + LAN_INBOUND + ROUTED.format(password=password, closed=free_port())


def value(parsed: dict, name: str, **labels: str) -> float | None:
    return parsed.get((name, frozenset(labels.items())))


def named(parsed: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in parsed.items() if n == name}


# --- formatting (a stand-in control: only what the collector reads) ------------------------------


def stand_in(stats: RuntimeStats) -> SimpleNamespace:
    clock = FakeClock()
    return SimpleNamespace(
        clock=clock,
        started_at=clock.now() - 12.5,
        started_wall=clock.wall() - 12.5,
        plane=None,
        stats=stats,
        tracker=SimpleNamespace(snapshot=list, totals=lambda: (1000, 250000)),
        health=SimpleNamespace(alive=SimpleNamespace(nodes=lambda: iter(()))),
    )


def exposition(control: SimpleNamespace) -> str:
    return generate_latest(metrics.HonkCollector(control)).decode()


def test_awkward_group_names_are_escaped_and_parse_back_intact():
    stats = RuntimeStats()
    odd = 'Ünïcode "quoted" back\\slash\nnewline and space'
    stats.selection_changed(odd, "tcp")
    stats.selection_changed(odd, "tcp")
    parsed = metric_samples(exposition(stand_in(stats)))
    assert value(parsed, "honk_group_selection_changes_total", group=odd, network="tcp") == 2


def test_probe_histograms_render_cumulative_buckets_sum_and_count_for_every_kind_and_result():
    stats = RuntimeStats()
    stats.probe("tcp", False, 0.3)
    stats.probe("tcp", False, 30.0)
    parsed = metric_samples(exposition(stand_in(stats)))
    buckets = {
        dict(k)["le"]: v
        for k, v in named(parsed, "honk_probe_duration_seconds_bucket").items()
        if dict(k)["kind"] == "tcp" and dict(k)["result"] == "error"
    }
    assert len(buckets) == len(PROBE_BUCKETS) + 1
    assert buckets["0.25"] == 0 and buckets["0.5"] == 1 and buckets["10.0"] == 1 and buckets["+Inf"] == 2
    assert value(parsed, "honk_probe_duration_seconds_count", kind="tcp", result="error") == 2
    assert value(parsed, "honk_probe_duration_seconds_sum", kind="tcp", result="error") == pytest.approx(30.3)
    for kind in ("tcp", "udp", "url"):  # present before their first probe
        assert value(parsed, "honk_probe_duration_seconds_count", kind=kind, result="ok") is not None


def test_counters_exist_at_zero_for_every_fixed_label_before_any_event():
    parsed = metric_samples(exposition(stand_in(RuntimeStats())))
    for network in ("tcp", "udp"):
        assert value(parsed, "honk_dials_total", network=network, result="ok", kind="") == 0
        for kind in DIAL_ERROR_KINDS:
            assert value(parsed, "honk_dials_total", network=network, result="error", kind=kind) == 0
    reloads = named(parsed, "honk_reloads_total")
    assert reloads[frozenset({("result", "applied"), ("error", "")})] == 0
    for variant in ("invalid", "disruptive", "build", "bind", "stopped"):
        assert reloads[frozenset({("result", "refused"), ("error", variant)})] == 0
    assert set(reloads.values()) == {0}
    assert set(named(parsed, "honk_subscription_refreshes_total")) == {
        frozenset({("result", r)}) for r in ("accepted", "unchanged", "failed")
    }
    assert value(parsed, "honk_relayed_bytes_total", direction="down") == 250000
    assert value(parsed, "honk_uptime_seconds") == 12.5
    assert value(parsed, "honk_info", version=__version__) == 1


# --- a real daemon --------------------------------------------------------------------------------


@pytest.fixture
async def daemon(tmp_path):
    async with running_daemon(tmp_path, config_text(NODE_PASSWORD)) as running:
        yield running


@pytest.fixture
async def client(daemon):
    app = build_app(daemon, SECRET, [metrics.routes])
    async with test_utils.TestClient(test_utils.TestServer(app)) as http:
        yield http


async def scrape(client) -> str:
    response = await client.get("/metrics", headers=bearer(SECRET))
    assert response.status == 200
    return await response.text()


async def test_metrics_answer_only_with_the_api_secret_in_the_text_format(client):
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/metrics", headers={"Authorization": "Bearer wrong"})).status == 401
    response = await client.get("/metrics", headers=bearer(SECRET))
    assert response.status == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    metric_samples(await response.text())


async def test_configured_inbounds_and_groups_show_at_zero_with_process_and_admission_gauges(client, daemon):
    parsed = metric_samples(await scrape(client))
    assert named(parsed, "honk_connections") == {
        frozenset({("inbound", "lan"), ("network", "tcp")}): 0,
        frozenset({("inbound", "lan"), ("network", "udp")}): 0,
    }
    assert value(parsed, "honk_group_selection_changes_total", group="proxy", network="tcp") == 0
    assert value(parsed, "honk_group_selection_changes_total", group="proxy", network="udp") == 0
    assert value(parsed, "honk_process_resident_memory_bytes") > 1_000_000
    assert value(parsed, "honk_process_open_fds") > 3
    budget = daemon.plane.admission
    assert value(parsed, "honk_dial_admission_limit", scope="plane") == budget.effective_limit
    assert value(parsed, "honk_dial_admission_limit", scope="process") == budget.gates.dial_size


async def test_admission_gauges_count_a_held_permit_in_the_plane_and_the_process(client, daemon):
    budget = daemon.plane.admission
    before = metric_samples(await scrape(client))
    permit = await budget.acquire(daemon.clock.now() + 5.0)
    try:
        during = metric_samples(await scrape(client))
    finally:
        permit.release()
    assert value(during, "honk_dial_admission_in_use", scope="plane") == 1
    assert (
        value(during, "honk_dial_admission_in_use", scope="process")
        == value(before, "honk_dial_admission_in_use", scope="process") + 1
    )
    assert value(during, "honk_dial_admission_waiting", scope="plane") == 0


async def test_node_alive_exports_known_states_only_one_alive_zero_dead(client, daemon):
    alive = daemon.health.alive
    node_a = next(n.node_id for n in alive.nodes() if n.name == "a")
    assert named(metric_samples(await scrape(client)), "honk_node_alive") == {}  # every state still unknown
    alive.notify_check_success(node_a, Domain.TCP, Family.V4, 0.05)
    parsed = metric_samples(await scrape(client))
    assert named(parsed, "honk_node_alive") == {
        frozenset({("node", "a"), ("domain", "tcp"), ("family", "ipv4")}): 1
    }
    for _ in range(3):  # PROBE_DEATH_THRESHOLD[TCP]; forced past the registration grace
        alive.notify_check_failure(node_a, Domain.TCP, Family.V4, force=True)
    alive.notify_check_success(node_a, Domain.DNS_UDP, Family.V6, 0.05)
    parsed = metric_samples(await scrape(client))
    assert named(parsed, "honk_node_alive") == {
        frozenset({("node", "a"), ("domain", "tcp"), ("family", "ipv4")}): 0,
        frozenset({("node", "a"), ("domain", "dns_udp"), ("family", "ipv6")}): 1,
    }


async def test_a_failed_dial_counts_by_kind_and_no_credential_or_target_reaches_the_text(client, daemon):
    meta = FlowMeta(Network.TCP, Address("127.0.0.1", 40000), Address("private-target.example", 8443), "lan")
    with pytest.raises(DialError):
        await daemon.dispatcher.connect(meta)
    text = await scrape(client)
    parsed = metric_samples(text)
    assert value(parsed, "honk_dials_total", network="tcp", result="error", kind="dial") == 1
    assert value(parsed, "honk_dials_total", network="tcp", result="ok", kind="") == 0
    for secret in (NODE_PASSWORD, "private-target", SECRET):
        assert secret not in text


async def test_each_server_has_its_own_registry(daemon, tmp_path):
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    async with running_daemon(other_dir, config_text("x").replace("proxy", "other")) as other:
        apps = [build_app(d, SECRET, [metrics.routes]) for d in (daemon, other)]
        groups = []
        for app in apps:
            async with test_utils.TestClient(test_utils.TestServer(app)) as http:
                parsed = metric_samples(await scrape(http))
                groups.append({dict(k)["group"] for k in named(parsed, "honk_group_selection_changes_total")})
        assert groups == [{"proxy"}, {"other"}]
