"""The pure planner (RL-10..RL-25): exact step lists on hand-built desired states.

Nothing here binds, dials or reads a clock: ``plan`` takes values and returns values,
so every rule of planning is pinned on small fixtures built with ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from honk.config.policies import CLOSE, KEEP, close_after
from honk.config.spec import GroupSpec, InboundUser, NodeSpec, Policy, RoutingSpec, RuleSpec
from honk.control.desired import (
    BindSpec,
    DesiredState,
    DnsDecl,
    GroupDecl,
    InboundDecl,
    OutboundDecl,
    Policies,
    RouteDecl,
    UserSetDecl,
)
from honk.control.errors import DuplicateTag, Invalid, UnknownReference
from honk.control.plan import (
    EMPTY,
    INTERCEPTION_CHANGED,
    TUN_DEVICE_CHANGED,
    TUN_SETTINGS_CHANGED,
    Bind,
    Build,
    CloseSessions,
    Disrupt,
    Drain,
    OutboundId,
    Plan,
    PublishPlane,
    Resource,
    Reuse,
    RunningState,
    StopAccepting,
    SwapHandler,
    plan,
)
from honk.control.report import ApplyReport

MIXED_PORT = 7890
OTHER_PORT = 7891
PROXY_HOST = "192.0.2.1"  # TEST-NET-1: never dialled, plans only
PROXY_PORT = 1080
OTHER_PROXY_PORT = 1081
DNS_TIMEOUT = 3.0  # seconds
OTHER_DNS_TIMEOUT = 5.0  # seconds
TPROXY_PORT = 7893
OTHER_TPROXY_PORT = 7894
GRACE = 5.0  # seconds


# --- fixtures ---------------------------------------------------------------------------------


def socks(tag: str, port: int = PROXY_PORT, host: str = PROXY_HOST) -> NodeSpec:
    return NodeSpec(name=tag, protocol="socks5", host=host, port=port)


DIRECT = OutboundDecl("direct", NodeSpec(name="direct", protocol="direct"))
HOLE = OutboundDecl("hole", NodeSpec(name="hole", protocol="block"))  # reject kind: never resolves
PROXY = OutboundDecl("proxy", socks("proxy"))
LB = GroupDecl("lb", GroupSpec("lb", policy=Policy.FALLBACK), ("proxy",))
PEOPLE = UserSetDecl("people", (InboundUser("alice", "alice-pw"), InboundUser("bob", "bob-pw")))
MIXED_BIND = BindSpec("tcp", "127.0.0.1", MIXED_PORT)
MIXED = InboundDecl("mixed", "mixed", MIXED_BIND, users="people")


def full_spec(**changes: object) -> DesiredState:
    """Section 1.6's fixture: mixed inbound admitting `people`, direct, a socks5 proxy, group lb."""
    base = DesiredState(
        dns=DnsDecl(DNS_TIMEOUT),
        outbounds=(DIRECT, PROXY),
        groups=(LB,),
        user_sets=(PEOPLE,),
        inbounds=(MIXED,),
    )
    return replace(base, **changes)


def dns_spec(**changes: object) -> DesiredState:
    """Section 1.6 #12: direct, a reject outbound, proxy; lb over proxy; selector sel over direct and hole."""
    base = DesiredState(
        dns=DnsDecl(DNS_TIMEOUT),
        outbounds=(DIRECT, HOLE, PROXY),
        groups=(
            LB,
            GroupDecl("sel", GroupSpec("sel", policy=Policy.SELECTOR, default="hole"), ("direct", "hole")),
        ),
    )
    return replace(base, **changes)


def applied(desired: DesiredState, running: RunningState = EMPTY) -> RunningState:
    """The running state after committing ``desired`` on top of ``running``."""
    return RunningState(desired, plan(running, desired).versions)


def history(*states: DesiredState) -> RunningState:
    running = EMPTY
    for desired in states:
        running = applied(desired, running)
    return running


def build(kind: str, tag: str = "", version: int = 0) -> Build:
    return Build(Resource(kind, tag, version))


def reuse(kind: str, tag: str = "", version: int = 0) -> Reuse:
    return Reuse(Resource(kind, tag, version))


def of_type(p: Plan, kind: type) -> list:
    return [s for s in p.steps if isinstance(s, kind)]


def position(p: Plan, step: object) -> int:
    return p.steps.index(step)


# --- first plan and unchanged re-apply ---------------------------------------------------------


def test_first_plan_builds_everything_in_order() -> None:
    p = plan(EMPTY, full_spec())
    assert p.steps == [
        build("dns"),
        build("outbound", "direct", 1),
        build("outbound", "proxy", 1),
        build("group", "lb"),
        build("route"),
        build("user set", "people"),
        Bind("mixed", MIXED_BIND),
        build("inbound", "mixed"),
        PublishPlane(),
    ]
    assert p.versions == {"direct": 1, "proxy": 1, "lb": 1}
    assert list(p.disruptions()) == []  # RL-07: a plan from empty never disrupts


def test_unchanged_reapply_is_all_reuse_without_publish() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec())
    # the fixture declares seven resources: dns, direct, proxy, lb, route, people, mixed
    assert p.steps == [
        reuse("dns"),
        reuse("outbound", "direct", 1),
        reuse("outbound", "proxy", 1),
        reuse("group", "lb"),
        reuse("route"),
        reuse("user set", "people"),
        reuse("inbound", "mixed"),
    ]
    assert not p.publishes
    assert p.versions == running.versions


def test_plan_does_not_mutate_the_running_versions() -> None:
    running = applied(full_spec())
    before = dict(running.versions)
    plan(running, full_spec(outbounds=(DIRECT, replace(PROXY, node=socks("proxy", OTHER_PROXY_PORT)))))
    assert running.versions == before


# --- versions and drains ----------------------------------------------------------------------


def test_changed_outbound_is_a_new_version_drained_after_the_publish() -> None:
    running = applied(full_spec())
    changed = replace(PROXY, node=socks("proxy", OTHER_PROXY_PORT))
    p = plan(running, full_spec(outbounds=(DIRECT, changed)))
    assert p.steps == [
        reuse("dns"),
        reuse("outbound", "direct", 1),
        build("outbound", "proxy", 2),
        build("group", "lb"),  # its member was rebuilt
        reuse("route"),
        reuse("user set", "people"),
        reuse("inbound", "mixed"),
        PublishPlane(),
        Drain(OutboundId("proxy", 1), KEEP),  # the default policy
    ]
    assert p.versions == {"direct": 1, "proxy": 2, "lb": 2}


def test_each_rebuild_of_a_tag_takes_the_next_version() -> None:
    v1 = full_spec()
    v2 = full_spec(outbounds=(replace(DIRECT, node=replace(DIRECT.node, params=(("ip", "4"),))), PROXY))
    v3 = full_spec(outbounds=(replace(DIRECT, node=replace(DIRECT.node, params=(("ip", "6"),))), PROXY))
    running = history(v1, v2)
    p = plan(running, v3)
    assert build("outbound", "direct", 3) in p.steps
    assert of_type(p, Drain) == [Drain(OutboundId("direct", 2), KEEP)]  # v1 is not drained again
    assert p.version_of("direct") == 3


def test_a_tag_added_back_takes_a_version_it_never_had() -> None:
    without_proxy = full_spec(outbounds=(DIRECT,), groups=())
    running = history(full_spec(), without_proxy)
    assert running.versions["proxy"] == 1  # a removed tag keeps its entry
    p = plan(running, full_spec())
    assert build("outbound", "proxy", 2) in p.steps
    assert of_type(p, Drain) == []  # nothing of proxy was running
    assert p.versions["proxy"] == 2


def test_a_tag_turned_from_group_to_outbound_continues_its_count() -> None:
    running = applied(full_spec())
    lb_outbound = OutboundDecl("lb", socks("lb", OTHER_PROXY_PORT))
    p = plan(running, full_spec(outbounds=(DIRECT, PROXY, lb_outbound), groups=()))
    assert build("outbound", "lb", 2) in p.steps
    assert of_type(p, Drain) == []  # groups are never drained
    assert p.publishes


def test_a_tag_turned_from_outbound_to_group_drains_the_outbound_and_continues_its_count() -> None:
    lb_outbound = OutboundDecl("lb", socks("lb", OTHER_PROXY_PORT))
    running = applied(full_spec(outbounds=(DIRECT, PROXY, lb_outbound), groups=()))
    p = plan(running, full_spec())
    assert build("group", "lb") in p.steps
    assert p.versions["lb"] == 2
    assert of_type(p, Drain) == [Drain(OutboundId("lb", 1), KEEP)]


def test_a_removed_outbound_drains_under_its_own_policy() -> None:
    running = applied(full_spec(outbounds=(DIRECT, replace(PROXY, drain=CLOSE))))
    p = plan(running, full_spec(outbounds=(DIRECT,), groups=()))
    assert of_type(p, Drain) == [Drain(OutboundId("proxy", 1), CLOSE)]
    assert p.versions["proxy"] == 1  # the entry stays
    assert p.steps[-1] == Drain(OutboundId("proxy", 1), CLOSE)
    assert position(p, PublishPlane()) < position(p, Drain(OutboundId("proxy", 1), CLOSE))


def test_a_removed_outbound_without_an_override_drains_under_the_new_default() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(outbounds=(DIRECT,), groups=(), policies=Policies(drain=close_after(GRACE))))
    assert of_type(p, Drain) == [Drain(OutboundId("proxy", 1), close_after(GRACE))]


def test_a_changed_outbound_drains_under_the_new_default() -> None:
    # RL-16: the old version drains under the *new* desired state's override or default
    running = applied(full_spec(outbounds=(DIRECT, replace(PROXY, drain=CLOSE))))
    changed = OutboundDecl("proxy", socks("proxy", OTHER_PROXY_PORT))  # the override is gone
    p = plan(running, full_spec(outbounds=(DIRECT, changed), policies=Policies(drain=close_after(GRACE))))
    assert of_type(p, Drain) == [Drain(OutboundId("proxy", 1), close_after(GRACE))]


def test_a_changed_outbound_drains_under_its_new_override() -> None:
    running = applied(full_spec())
    changed = OutboundDecl("proxy", socks("proxy", OTHER_PROXY_PORT), drain=CLOSE)
    p = plan(running, full_spec(outbounds=(DIRECT, changed)))
    assert of_type(p, Drain) == [Drain(OutboundId("proxy", 1), CLOSE)]


def test_a_changed_drain_override_alone_rebuilds_the_outbound() -> None:
    # the override is part of the outbound's declaration, so equality sees it
    running = applied(full_spec())
    p = plan(running, full_spec(outbounds=(DIRECT, replace(PROXY, drain=CLOSE))))
    assert build("outbound", "proxy", 2) in p.steps
    assert of_type(p, Drain) == [Drain(OutboundId("proxy", 1), CLOSE)]


def test_a_policy_change_alone_has_no_step() -> None:
    # RL-69: policies take effect from the apply that brings them, without a step
    running = applied(full_spec())
    p = plan(running, full_spec(policies=Policies(drain=CLOSE, user_removal=KEEP)))
    assert all(isinstance(s, Reuse) for s in p.steps)


# --- DNS --------------------------------------------------------------------------------------


def test_dns_change_rebuilds_every_outbound_but_reject() -> None:
    running = applied(dns_spec())
    p = plan(running, dns_spec(dns=DnsDecl(OTHER_DNS_TIMEOUT)))
    assert p.steps == [
        build("dns"),
        build("outbound", "direct", 2),
        reuse("outbound", "hole", 1),
        build("outbound", "proxy", 2),
        build("group", "lb"),
        build("group", "sel"),  # its member direct was rebuilt
        reuse("route"),
        PublishPlane(),
        Drain(OutboundId("direct", 1), KEEP),
        Drain(OutboundId("proxy", 1), KEEP),
    ]
    assert p.versions == {"direct": 2, "hole": 1, "proxy": 2, "lb": 2, "sel": 2}


def test_a_changed_proxy_alone_rebuilds_its_group_and_reuses_the_other() -> None:
    running = applied(dns_spec())
    p = plan(
        running, dns_spec(outbounds=(DIRECT, HOLE, replace(PROXY, node=socks("proxy", OTHER_PROXY_PORT))))
    )
    assert p.steps == [
        reuse("dns"),
        reuse("outbound", "direct", 1),
        reuse("outbound", "hole", 1),
        build("outbound", "proxy", 2),
        build("group", "lb"),
        reuse("group", "sel"),
        reuse("route"),
        PublishPlane(),
        Drain(OutboundId("proxy", 1), KEEP),
    ]


def test_a_route_change_alone_rebuilds_the_route_and_publishes() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(route=RouteDecl(RoutingSpec(fallback="lb"))))
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [build("route"), PublishPlane()]
    assert p.versions == running.versions


# --- groups -----------------------------------------------------------------------------------


def group_steps(p: Plan) -> dict[str, type]:
    """Each group's step kind (Build or Reuse) by tag."""
    return {
        s.resource.tag: type(s)
        for s in p.steps
        if isinstance(s, Build | Reuse) and s.resource.kind == "group"
    }


def test_group_is_rebuilt_exactly_when_a_member_is() -> None:
    running = applied(full_spec())
    changed_member = plan(
        running, full_spec(outbounds=(DIRECT, replace(PROXY, node=socks("proxy", OTHER_PROXY_PORT))))
    )
    assert group_steps(changed_member) == {"lb": Build}
    changed_other = plan(running, full_spec(outbounds=(replace(DIRECT, drain=CLOSE), PROXY)))
    assert build("outbound", "direct", 2) in changed_other.steps
    assert group_steps(changed_other) == {"lb": Reuse}


def test_a_changed_group_declaration_rebuilds_the_group_alone() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(groups=(replace(LB, spec=replace(LB.spec, tolerance=0.2)),)))
    assert build("group", "lb") in p.steps
    assert reuse("outbound", "proxy", 1) in p.steps
    assert of_type(p, Drain) == []
    assert p.versions["lb"] == 2
    assert p.publishes


NESTED_INNER = GroupDecl("inner", GroupSpec("inner", policy=Policy.FALLBACK), ("proxy",))
NESTED_OUTER = GroupDecl("outer", GroupSpec("outer", subgroups=("inner",)), ("inner",))


@pytest.mark.parametrize(
    "order", [(NESTED_INNER, NESTED_OUTER), (NESTED_OUTER, NESTED_INNER)], ids=["inner-first", "outer-first"]
)
def test_nested_groups_are_rebuilt_exactly_when_a_transitive_member_is(order: tuple[GroupDecl, ...]) -> None:
    running = applied(full_spec(groups=order))
    changed_proxy = plan(
        running,
        full_spec(groups=order, outbounds=(DIRECT, replace(PROXY, node=socks("proxy", OTHER_PROXY_PORT)))),
    )
    assert group_steps(changed_proxy) == {"inner": Build, "outer": Build}
    assert changed_proxy.versions["inner"] == 2 and changed_proxy.versions["outer"] == 2
    # the steps still follow desired-state order
    assert [s.resource.tag for s in of_type(changed_proxy, Build) if s.resource.kind == "group"] == [
        g.tag for g in order
    ]
    changed_unrelated = plan(
        running, full_spec(groups=order, outbounds=(replace(DIRECT, drain=CLOSE), PROXY))
    )
    assert group_steps(changed_unrelated) == {"inner": Reuse, "outer": Reuse}


def test_a_group_whose_final_is_rebuilt_is_rebuilt() -> None:
    with_final = GroupDecl("lb", GroupSpec("lb", policy=Policy.FALLBACK, final="direct"), ("proxy",))
    running = applied(full_spec(groups=(with_final,)))
    p = plan(running, full_spec(groups=(with_final,), outbounds=(replace(DIRECT, drain=CLOSE), PROXY)))
    assert group_steps(p) == {"lb": Build}


def test_a_group_whose_changed_nested_group_is_rebuilt_is_rebuilt() -> None:
    running = applied(full_spec(groups=(NESTED_INNER, NESTED_OUTER)))
    inner = replace(NESTED_INNER, spec=replace(NESTED_INNER.spec, tolerance=0.2))
    p = plan(running, full_spec(groups=(inner, NESTED_OUTER)))
    assert group_steps(p) == {"inner": Build, "outer": Build}


def test_removing_a_group_alone_republishes_the_plane() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(groups=()))
    assert all(isinstance(s, Reuse) for s in p.steps[:-1])
    assert p.steps[-1] == PublishPlane()
    assert of_type(p, Drain) == []  # groups are never drained
    assert p.versions["lb"] == 1  # the entry stays


# --- user sets --------------------------------------------------------------------------------


def test_user_set_change_touches_neither_plane_nor_inbounds() -> None:
    running = applied(full_spec())
    more = replace(PEOPLE, users=(*PEOPLE.users, InboundUser("carol", "carol-pw")))
    p = plan(running, full_spec(user_sets=(more,)))
    assert build("user set", "people") in p.steps
    assert reuse("inbound", "mixed") in p.steps
    assert not p.publishes
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [build("user set", "people")]


def test_a_removed_user_set_has_no_step() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(user_sets=(), inbounds=(replace(MIXED, users=None),)))
    assert [s for s in p.steps if isinstance(s, Build | Reuse) and s.resource.kind == "user set"] == []
    assert not p.publishes


# --- inbounds ---------------------------------------------------------------------------------


def test_protocol_change_on_the_same_port_plans_a_swap() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(inbounds=(replace(MIXED, kind="http"),)))
    assert build("inbound", "mixed") in p.steps
    assert of_type(p, SwapHandler) == [SwapHandler("mixed")]
    assert of_type(p, Bind) == []
    assert of_type(p, StopAccepting) == []
    assert of_type(p, CloseSessions) == []
    assert list(p.disruptions()) == []
    assert not p.publishes  # inbound changes never touch the plane


def test_bind_change_binds_anew_and_stops_the_old_bind_without_closing_sessions() -> None:
    running = applied(full_spec())
    moved = BindSpec("tcp", "127.0.0.1", OTHER_PORT)
    p = plan(running, full_spec(inbounds=(replace(MIXED, bind=moved),)))
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [
        Bind("mixed", moved),
        build("inbound", "mixed"),
        StopAccepting("mixed", MIXED_BIND),
    ]
    assert of_type(p, CloseSessions) == []  # sessions belong to the tag, which stays


def test_renamed_inbound_on_the_same_bind_swaps_and_closes_the_old_tags_sessions() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(inbounds=(replace(MIXED, tag="mixed2"),)))
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [
        build("inbound", "mixed2"),
        SwapHandler("mixed2"),
        CloseSessions("mixed"),
    ]
    assert of_type(p, Bind) == [] and of_type(p, StopAccepting) == []


def test_removed_inbound_stops_accepting_and_closes_its_sessions() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(inbounds=()))
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [
        StopAccepting("mixed", MIXED_BIND),
        CloseSessions("mixed"),
    ]


def test_a_changed_removal_policy_is_a_handler_swap() -> None:
    running = applied(full_spec())
    p = plan(running, full_spec(inbounds=(replace(MIXED, user_removal=KEEP),)))
    assert of_type(p, SwapHandler) == [SwapHandler("mixed")]
    assert of_type(p, Bind) == []


def test_inbounds_that_trade_binds_swap_both_and_stop_nothing() -> None:
    a = InboundDecl("a", "mixed", BindSpec("tcp", "127.0.0.1", MIXED_PORT))
    b = InboundDecl("b", "mixed", BindSpec("tcp", "127.0.0.1", OTHER_PORT))
    running = applied(full_spec(inbounds=(a, b)))
    p = plan(running, full_spec(inbounds=(replace(a, bind=b.bind), replace(b, bind=a.bind))))
    assert of_type(p, SwapHandler) == [SwapHandler("a"), SwapHandler("b")]
    assert of_type(p, Bind) == [] and of_type(p, StopAccepting) == [] and of_type(p, CloseSessions) == []


# --- disruptions (1.6 #10, pure) --------------------------------------------------------------

TUN_BIND = BindSpec("tun", path="tun0")
TUN = InboundDecl("tun", "tun", TUN_BIND, settings=(("mtu", 1500),))
TPROXY_BIND = BindSpec("tproxy", "0.0.0.0", TPROXY_PORT)
TPROXY = InboundDecl("tp", "tproxy", TPROXY_BIND, interception=(("fwmark", 1),))


def test_a_changed_tun_setting_plans_a_swap_and_a_disruption() -> None:
    running = applied(full_spec(inbounds=(MIXED, TUN)))
    p = plan(running, full_spec(inbounds=(MIXED, replace(TUN, settings=(("mtu", 9000),)))))
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [
        build("inbound", "tun"),
        SwapHandler("tun"),
        Disrupt("tun", TUN_SETTINGS_CHANGED),
    ]
    assert (
        TUN_SETTINGS_CHANGED == "the tun inbound's settings changed; its runtime restarts and its flows end"
    )
    assert list(p.disruptions()) == [("tun", TUN_SETTINGS_CHANGED)]


def test_a_renamed_tun_inbound_on_the_same_device_is_a_disruption() -> None:
    running = applied(full_spec(inbounds=(TUN,)))
    p = plan(running, full_spec(inbounds=(replace(TUN, tag="tun2"),)))
    assert list(p.disruptions()) == [("tun2", TUN_SETTINGS_CHANGED)]
    assert of_type(p, CloseSessions) == [CloseSessions("tun")]


def test_a_changed_tun_device_binds_stops_and_disrupts() -> None:
    running = applied(full_spec(inbounds=(MIXED, TUN)))
    device = BindSpec("tun", path="tun1")
    p = plan(running, full_spec(inbounds=(MIXED, replace(TUN, bind=device))))
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [
        Bind("tun", device),
        build("inbound", "tun"),
        Disrupt("tun", TUN_DEVICE_CHANGED),
        StopAccepting("tun", TUN_BIND),
    ]
    assert TUN_DEVICE_CHANGED == "the tun device changed; the old device and its flows end"
    assert of_type(p, SwapHandler) == []


def test_a_changed_tproxy_interception_plans_a_swap_and_a_disruption() -> None:
    running = applied(full_spec(inbounds=(MIXED, TPROXY)))
    p = plan(running, full_spec(inbounds=(MIXED, replace(TPROXY, interception=(("fwmark", 2),)))))
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [
        build("inbound", "tp"),
        SwapHandler("tp"),
        Disrupt("tp", INTERCEPTION_CHANGED),
    ]
    assert INTERCEPTION_CHANGED == (
        "the transparent inbound's interception changed; its kernel rules are replaced and its flows end"
    )


def test_a_changed_redir_interception_is_a_disruption() -> None:
    redir = InboundDecl(
        "rd", "redir", BindSpec("redir", "0.0.0.0", TPROXY_PORT), interception=(("table", 100),)
    )
    running = applied(full_spec(inbounds=(redir,)))
    p = plan(running, full_spec(inbounds=(replace(redir, interception=(("table", 101),)),)))
    assert list(p.disruptions()) == [("rd", INTERCEPTION_CHANGED)]


def test_a_tproxy_port_change_alone_is_no_disruption() -> None:
    running = applied(full_spec(inbounds=(MIXED, TPROXY)))
    moved = BindSpec("tproxy", "0.0.0.0", OTHER_TPROXY_PORT)
    p = plan(running, full_spec(inbounds=(MIXED, replace(TPROXY, bind=moved))))
    assert list(p.disruptions()) == []
    assert of_type(p, Bind) == [Bind("tp", moved)]
    assert of_type(p, StopAccepting) == [StopAccepting("tp", TPROXY_BIND)]


def test_a_tproxy_handler_change_that_keeps_the_interception_is_no_disruption() -> None:
    running = applied(full_spec(inbounds=(MIXED, TPROXY)))
    p = plan(running, full_spec(inbounds=(MIXED, replace(TPROXY, settings=(("sniff", True),)))))
    assert of_type(p, SwapHandler) == [SwapHandler("tp")]
    assert list(p.disruptions()) == []


def test_disruptions_come_in_step_order() -> None:
    running = applied(full_spec(inbounds=(TPROXY, MIXED, TUN)))
    p = plan(
        running,
        full_spec(
            inbounds=(
                replace(TPROXY, interception=(("fwmark", 2),)),
                MIXED,
                replace(TUN, settings=(("mtu", 9000),)),
            )
        ),
    )
    assert list(p.disruptions()) == [("tp", INTERCEPTION_CHANGED), ("tun", TUN_SETTINGS_CHANGED)]
    assert [(s.inbound, s.reason) for s in of_type(p, Disrupt)] == list(p.disruptions())


def test_a_plan_from_empty_never_disrupts() -> None:
    p = plan(EMPTY, full_spec(inbounds=(MIXED, TUN, TPROXY)))
    assert list(p.disruptions()) == []


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("desired", "error", "text"),
    [
        (
            full_spec(route=RouteDecl(RoutingSpec(fallback="nope"))),
            UnknownReference,
            "route references unknown outbound nope",
        ),
        (
            full_spec(route=RouteDecl(RoutingSpec(rules=(RuleSpec((), "nope"),)))),
            UnknownReference,
            "route references unknown outbound nope",
        ),
        (
            full_spec(
                outbounds=(DIRECT, PROXY, OutboundDecl("x", socks("x")), OutboundDecl("x", socks("x")))
            ),
            DuplicateTag,
            "duplicate outbound tag x",
        ),
        (full_spec(groups=(LB, LB)), DuplicateTag, "duplicate group tag lb"),
        (
            full_spec(inbounds=(replace(MIXED, users="nosuch"),)),
            UnknownReference,
            "inbound mixed references unknown user set nosuch",
        ),
        (
            full_spec(groups=(replace(LB, members=("nosuch",)),)),
            UnknownReference,
            "group lb references unknown outbound nosuch",
        ),
        (
            full_spec(outbounds=(DIRECT, PROXY, OutboundDecl("", socks("")))),
            Invalid,
            "outbound: a tag must not be empty",
        ),
        (full_spec(inbounds=(MIXED, replace(MIXED, tag=""))), Invalid, "inbound: a tag must not be empty"),
        (
            full_spec(inbounds=(MIXED, replace(MIXED, tag="mixed2"))),
            Invalid,
            "inbound mixed2: inbound mixed is already bound to 127.0.0.1:7890",
        ),
    ],
    ids=[
        "unknown-fallback",
        "unknown-rule-target",
        "duplicate-outbound",
        "duplicate-group",
        "unknown-user-set",
        "unknown-member",
        "empty-outbound-tag",
        "empty-inbound-tag",
        "shared-bind",
    ],
)
def test_invalid_spec_is_refused_without_a_plan(desired: DesiredState, error: type, text: str) -> None:
    for running in (EMPTY, applied(full_spec())):
        with pytest.raises(error) as caught:
            plan(running, desired)
        assert str(caught.value) == text


def test_a_refused_plan_leaves_the_running_versions_alone() -> None:
    running = applied(full_spec())
    before = dict(running.versions)
    with pytest.raises(UnknownReference):
        plan(
            running,
            full_spec(
                outbounds=(replace(DIRECT, drain=CLOSE), PROXY), route=RouteDecl(RoutingSpec(fallback="nope"))
            ),
        )
    assert running.versions == before


# --- invariants over random histories ---------------------------------------------------------

PROXY_TAGS = ("p1", "p2", "p3")
INBOUND_TAGS = ("in1", "in2", "in3")
INBOUND_PORTS = (7901, 7902, 7903)
# the fixed order of RL-12, as ranks
RANK_DNS, RANK_OUTBOUND, RANK_GROUP, RANK_ROUTE, RANK_USERS, RANK_INBOUND = range(6)
RANK_PUBLISH, RANK_SWAP, RANK_STOP, RANK_CLOSE, RANK_DRAIN = range(6, 11)
RESOURCE_RANK = {
    "dns": RANK_DNS,
    "outbound": RANK_OUTBOUND,
    "group": RANK_GROUP,
    "route": RANK_ROUTE,
    "user set": RANK_USERS,
    "inbound": RANK_INBOUND,
}
PLANE_KINDS = frozenset({"dns", "outbound", "group", "route"})


def rank(step: object) -> int:
    if isinstance(step, Build | Reuse):
        return RESOURCE_RANK[step.resource.kind]
    return {
        Bind: RANK_INBOUND,
        PublishPlane: RANK_PUBLISH,
        SwapHandler: RANK_SWAP,
        Disrupt: RANK_SWAP,
        StopAccepting: RANK_STOP,
        CloseSessions: RANK_CLOSE,
        Drain: RANK_DRAIN,
    }[type(step)]


# A desired state is a point in a small space of knobs; a history is a start point and a
# series of single-knob edits, so consecutive states mostly differ in one resource.
KNOBS = {  # name: number of values
    "dns": 2,
    "hole": 2,  # absent, present
    "p1": 4,
    "p2": 4,
    "p3": 4,  # absent, port A, port B, port A with a close override
    "lb": 4,  # absent, outbound on port A, outbound on port B, group: a tag that changes kind
    "g1": 3,  # absent, selector, fallback
    "g1_members": 8,  # a bit per proxy (only present ones count)
    "g2": 4,  # absent, nested over g1, nested with final direct, nested with final hole
    "group_order": 3,  # rotation of the groups' declaration order
    "fallback": 10,  # index into the targets
    "people": 3,  # absent, one user, two users
    "in1": 7,
    "in2": 7,
    "in3": 7,  # absent, or (mixed | http) on one of three ports
    "admits": 8,  # a bit per inbound: admits `people`
    "drain": 2,  # default drain policy: keep, close
}
KNOB_NAMES = tuple(KNOBS)


def state_of(k: dict[str, int]) -> DesiredState:
    outbounds = [DIRECT]
    if k["hole"]:
        outbounds.append(HOLE)
    for tag in PROXY_TAGS:
        if k[tag]:
            port = OTHER_PROXY_PORT if k[tag] == 2 else PROXY_PORT
            outbounds.append(OutboundDecl(tag, socks(tag, port), CLOSE if k[tag] == 3 else None))
    proxies = [o.tag for o in outbounds if o.tag in PROXY_TAGS]
    if k["lb"] in (1, 2):
        outbounds.append(OutboundDecl("lb", socks("lb", PROXY_PORT if k["lb"] == 1 else OTHER_PROXY_PORT)))
    groups = []
    if k["g1"]:
        members = tuple(t for i, t in enumerate(PROXY_TAGS) if t in proxies and k["g1_members"] >> i & 1)
        policy = Policy.SELECTOR if k["g1"] == 1 else Policy.FALLBACK
        groups.append(GroupDecl("g1", GroupSpec("g1", policy=policy), members))
    if k["g2"]:
        nested = ("g1",) if k["g1"] else ()
        final = {1: None, 2: "direct", 3: "hole" if k["hole"] else "direct"}[k["g2"]]
        groups.append(GroupDecl("g2", GroupSpec("g2", subgroups=nested, final=final), nested))
    if k["lb"] == 3:
        groups.append(GroupDecl("lb", GroupSpec("lb", policy=Policy.FALLBACK), tuple(proxies[:1])))
    turn = k["group_order"] % max(len(groups), 1)
    groups = groups[turn:] + groups[:turn]
    targets = [o.tag for o in outbounds] + [g.tag for g in groups]
    user_sets = (replace(PEOPLE, users=PEOPLE.users[: k["people"]]),) if k["people"] else ()
    inbounds, binds = [], set()
    for i, tag in enumerate(INBOUND_TAGS):
        if not k[tag]:
            continue
        port = INBOUND_PORTS[(k[tag] - 1) % len(INBOUND_PORTS)]
        if port in binds:
            continue  # one inbound per bind
        binds.add(port)
        kind = "mixed" if k[tag] <= len(INBOUND_PORTS) else "http"
        users = "people" if user_sets and k["admits"] >> i & 1 else None
        inbounds.append(InboundDecl(tag, kind, BindSpec("tcp", "127.0.0.1", port), users=users))
    return DesiredState(
        dns=DnsDecl(OTHER_DNS_TIMEOUT if k["dns"] else DNS_TIMEOUT),
        outbounds=tuple(outbounds),
        groups=tuple(groups),
        route=RouteDecl(RoutingSpec(fallback=targets[k["fallback"] % len(targets)])),
        user_sets=user_sets,
        inbounds=tuple(inbounds),
        policies=Policies(drain=CLOSE if k["drain"] else KEEP),
    )


@st.composite
def histories(draw: st.DrawFn) -> list[DesiredState]:
    knobs = {name: draw(st.integers(0, n - 1)) for name, n in KNOBS.items()}
    states = [state_of(knobs)]
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(KNOB_NAMES))
        knobs = {**knobs, name: draw(st.integers(0, KNOBS[name] - 1))}
        states.append(state_of(knobs))
    return states


def check_step_order(p: Plan, desired: DesiredState) -> None:
    ranks = [rank(s) for s in p.steps]
    assert ranks == sorted(ranks), p.steps
    # within one kind, desired-state order; every desired resource exactly once (RL-65)
    for kind, decls in (
        ("outbound", desired.outbounds),
        ("group", desired.groups),
        ("user set", desired.user_sets),
        ("inbound", desired.inbounds),
    ):
        tags = [s.resource.tag for s in p.steps if isinstance(s, Build | Reuse) and s.resource.kind == kind]
        assert tags == [d.tag for d in decls]
    assert sum(isinstance(s, PublishPlane) for s in p.steps) <= 1


def check_publish(p: Plan, running: RunningState, desired: DesiredState) -> None:
    plane_built = any(isinstance(s, Build) and s.resource.kind in PLANE_KINDS for s in p.steps)
    group_removed = running.desired is not None and any(
        desired.group(g.tag) is None for g in running.desired.groups
    )
    assert p.publishes == (plane_built or bool(of_type(p, Drain)) or group_removed)
    if p.publishes:  # the published plane holds every build
        publish = position(p, PublishPlane())
        assert all(i < publish for i, s in enumerate(p.steps) if isinstance(s, Build | Bind))


def check_versions(p: Plan, running: RunningState, highest: dict[str, int]) -> None:
    assert set(running.versions) <= set(p.versions)
    for tag, version in running.versions.items():
        assert p.versions[tag] >= version
    for step in p.steps:
        res = step.resource if isinstance(step, Build | Reuse) else None
        if res is not None and res.kind == "outbound":
            if isinstance(step, Build):
                assert res.version > highest.get(res.tag, 0)  # never a version seen before
                assert res.version == running.versions.get(res.tag, 0) + 1
            else:
                assert res.version == running.versions[res.tag]
            assert p.versions[res.tag] == res.version
        if res is not None and res.kind == "group":
            expected = running.versions.get(res.tag, 0) + (1 if isinstance(step, Build) else 0)
            assert p.versions[res.tag] == expected
    for drain in of_type(p, Drain):
        assert running.desired is not None and running.desired.outbound(drain.id.tag) is not None
        assert drain.id.version == running.versions[drain.id.tag]


def check_groups(p: Plan, running: RunningState, desired: DesiredState) -> None:
    """A group is reused exactly when its declaration is unchanged and nothing it reaches is built."""
    built = {s.resource.tag for s in of_type(p, Build) if s.resource.kind in ("outbound", "group")}
    for g in desired.groups:
        unchanged = running.desired is not None and running.desired.group(g.tag) == g
        reaches_built = any(t in built for t in g.reaches)
        assert (g.tag in built) == (not unchanged or reaches_built), g.tag


@settings(max_examples=400, deadline=None)
@given(histories())
def test_any_history_of_applies_keeps_the_plan_invariants(states: list[DesiredState]) -> None:
    running = EMPTY
    highest: dict[str, int] = {}
    drained: set[OutboundId] = set()
    for desired in states:
        p = plan(running, desired)
        check_step_order(p, desired)
        check_publish(p, running, desired)
        check_versions(p, running, highest)
        check_groups(p, running, desired)
        ids = [d.id for d in of_type(p, Drain)]
        assert len(ids) == len(set(ids)) and not drained & set(ids)  # a version drains once
        drained |= set(ids)
        for tag, version in p.versions.items():
            highest[tag] = max(highest.get(tag, 0), version)
        running = RunningState(desired, p.versions)
        again = plan(running, desired)
        assert all(isinstance(s, Reuse) for s in again.steps), again.steps
        assert again.versions == p.versions


# --- the report's summary ---------------------------------------------------------------------


def test_an_empty_report_has_nothing_to_run() -> None:
    assert ApplyReport().summary() == "nothing to run"


def test_the_summary_lists_fields_in_their_fixed_order() -> None:
    report = ApplyReport(
        reused=["dns"],
        built=["outbound direct@v2"],
        swapped=["in"],
        drained=["direct@v1"],
        rebound=["mixed"],
        restarted=["tp"],
        removed=["a"],
    )
    assert report.summary() == (
        "built [outbound direct@v2]; swapped [in]; drained [direct@v1]; "
        "rebound [mixed]; restarted [tp]; removed [a]; reused [dns]"
    )


def test_the_summary_skips_empty_fields_and_joins_items() -> None:
    reused = [str(s.resource) for s in plan(EMPTY, full_spec()).steps if isinstance(s, Build)]
    report = ApplyReport(reused=reused)
    assert report.summary() == (
        "reused [dns, outbound direct@v1, outbound proxy@v1, group lb, route, user set people, inbound mixed]"
    )
    assert ApplyReport(built=["route"], drained=["proxy@v1"]).summary() == "built [route]; drained [proxy@v1]"


def test_resources_and_versions_display_as_the_report_writes_them() -> None:
    assert str(Resource("dns")) == "dns"
    assert str(Resource("route")) == "route"
    assert str(Resource("outbound", "direct", 2)) == "outbound direct@v2"
    assert str(Resource("group", "lb")) == "group lb"
    assert str(Resource("user set", "people")) == "user set people"
    assert str(Resource("inbound", "socks")) == "inbound socks"
    assert str(OutboundId("direct", 1)) == "direct@v1"


def test_a_group_may_share_a_node_tag():
    # upstream honk's config.dae has node and group `iris`: the group answers to the name
    desired = full_spec(outbounds=(DIRECT, PROXY, OutboundDecl("lb", socks("lb"))))
    assert plan(EMPTY, desired).steps
