"""Node runtimes: keyed by NodeId, carried across rebuilds, closed when their node goes."""

from __future__ import annotations

from honk.config.links import parse_node_link
from honk.config.spec import Spec
from honk.connection.plane import build_plane
from honk.core.clock import FakeClock
from honk.outbound.registry import build_outbounds
from honk.outbound.runtime import NodeRuntime, WarmOwner


def _spec(*links: tuple[str, str]) -> Spec:
    return Spec(nodes=tuple(parse_node_link(link, tag) for tag, link in links))


class _Resource:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_every_proxy_leaf_gets_a_runtime_of_its_node_id() -> None:
    spec = _spec(("a", "socks5://127.0.0.1:1080"), ("b", "http://127.0.0.1:3128"))
    outbounds, runtimes = build_outbounds(spec, FakeClock())
    assert set(runtimes) == {node.id for node in spec.nodes}
    for node in spec.nodes:
        assert outbounds[node.name].runtime is runtimes[node.id]
        assert runtimes[node.id].node_id == node.id
    assert outbounds["direct"].runtime is None and outbounds["block"].runtime is None


def test_unchanged_node_keeps_its_runtime_across_a_rebuild() -> None:
    clock = FakeClock()
    first = build_plane(_spec(("a", "socks5://127.0.0.1:1080"), ("b", "socks5://127.0.0.1:1081")), clock, 1)
    kept = first.outbounds["a"].runtime
    second = build_plane(
        _spec(("a", "socks5://127.0.0.1:1080"), ("b", "socks5://127.0.0.1:1082")), clock, 2, previous=first
    )
    assert second.outbounds["a"].runtime is kept
    assert second.outbounds["b"].runtime is not first.outbounds["b"].runtime  # a changed node is a new node


def test_a_renamed_node_keeps_its_identity_and_runtime() -> None:
    clock = FakeClock()
    first = build_plane(_spec(("old-name", "socks5://u:p@127.0.0.1:1080")), clock, 1)
    second = build_plane(_spec(("new-name", "socks5://u:p@127.0.0.1:1080")), clock, 2, previous=first)
    runtime = second.outbounds["new-name"].runtime
    assert runtime is first.outbounds["old-name"].runtime
    assert runtime.name == "new-name"


def test_retire_closes_only_the_runtimes_the_new_plane_dropped() -> None:
    clock = FakeClock()
    first = build_plane(
        _spec(
            ("a", "socks5://127.0.0.1:1080"), ("b", "socks5://127.0.0.1:1081"), ("c", "http://127.0.0.1:3128")
        ),
        clock,
        1,
    )
    resources = {name: _Resource() for name in ("a", "b", "c")}
    for name, resource in resources.items():
        first.outbounds[name].runtime.own(resource)
    second = build_plane(
        _spec(("a", "socks5://127.0.0.1:1080"), ("c", "http://127.0.0.1:3129")), clock, 2, previous=first
    )
    assert second.retire(first) == 2  # b removed, c changed
    assert [resources[n].closed for n in ("a", "b", "c")] == [0, 1, 1]
    assert not second.outbounds["a"].runtime.closed


def test_closing_a_runtime_closes_its_resources_once_and_refuses_new_ones() -> None:
    runtime = NodeRuntime(parse_node_link("socks5://127.0.0.1:1080").id, "a")
    resource, released = _Resource(), _Resource()
    runtime.own(resource)
    runtime.own(released)
    runtime.release(released)
    assert runtime.open_resources == 1
    runtime.warm |= WarmOwner.SELECTOR_PIN
    runtime.close()
    runtime.close()
    assert resource.closed == 1 and released.closed == 0
    late = _Resource()
    runtime.own(late)  # a closed runtime refuses new resources by closing them
    assert late.closed == 1


def test_a_closed_runtime_is_not_reused() -> None:
    clock = FakeClock()
    first = build_plane(_spec(("a", "socks5://127.0.0.1:1080")), clock, 1)
    first.outbounds["a"].runtime.close()
    second = build_plane(_spec(("a", "socks5://127.0.0.1:1080")), clock, 2, previous=first)
    assert not second.outbounds["a"].runtime.closed


class _Carrier(_Resource):
    """A pooled resource that may be carrying flows, and can be retired."""

    def __init__(self, idle: bool) -> None:
        super().__init__()
        self.idle = idle
        self.retired = False

    def retire(self) -> None:
        self.retired = True


def _runtime() -> NodeRuntime:
    import uuid

    return NodeRuntime(uuid.uuid4(), "n")


def test_a_probe_through_a_cold_runtime_closes_what_it_opened() -> None:
    runtime = _runtime()
    opened = _Resource()
    with runtime.cold_guard():
        runtime.own(opened)
    assert opened.closed == 1 and runtime.open_resources == 0


def test_a_probe_through_a_warm_runtime_leaves_its_resources() -> None:
    runtime = _runtime()
    runtime.warm |= WarmOwner.SELECTOR_PIN
    opened = _Resource()
    with runtime.cold_guard():
        runtime.own(opened)
    assert opened.closed == 0 and runtime.open_resources == 1


def test_a_carrier_a_flow_adopted_during_the_probe_survives_the_guard() -> None:
    runtime = _runtime()
    busy = _Carrier(idle=False)
    with runtime.cold_guard():
        runtime.own(busy)
    assert busy.closed == 0 and runtime.open_resources == 1


def test_a_runtime_already_serving_flows_counts_as_warm() -> None:
    runtime = _runtime()
    runtime.own(_Carrier(idle=False))
    probe_carrier = _Resource()
    with runtime.cold_guard():
        runtime.own(probe_carrier)
    assert probe_carrier.closed == 0


def test_purge_closes_idle_carriers_and_retires_busy_ones() -> None:
    runtime = _runtime()
    idle, busy = _Carrier(idle=True), _Carrier(idle=False)
    runtime.own(idle)
    runtime.own(busy)
    assert runtime.purge() == 2
    assert idle.closed == 1 and not idle.retired
    assert busy.closed == 0 and busy.retired
    assert runtime.open_resources == 1  # the busy one closes itself when its flows end
