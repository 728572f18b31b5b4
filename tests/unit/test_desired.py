"""Lowering a loaded configuration to the desired state the planner compares (``lower``).

Specs come from real configuration text (``load_text``), so these tests also pin how the
loader's values reach the reconciler: node order, resolved group members, user sets, the
API listener, drain overrides and the global policies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from honk.config.diagnostics import ConfigError
from honk.config.links import derive_node_id, parse_node_link
from honk.config.load import load_file, load_text
from honk.config.policies import CLOSE, KEEP, close_after
from honk.config.spec import InboundUser
from honk.control.desired import (
    API_TAG,
    BindSpec,
    DesiredState,
    DnsDecl,
    InboundDecl,
    Policies,
    UserSetDecl,
    lower,
)
from honk.control.errors import ApplyError
from honk.control.plan import EMPTY, Build, Resource, Reuse, RunningState, plan

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"
GRACE = 5.0  # seconds, the "5s" below
API_PORT = 9091
MIXED_PORT = 7890

NODES = """
[node]
edge1 = "socks5://10.0.0.1:1080"
edge2 = "socks5://10.0.0.2:1080"
"""


def lowered(text: str, fmt: str = "toml") -> DesiredState:
    return lower(load_text(text, fmt))


def plannable(desired: DesiredState) -> None:
    """The lowered state plans from empty and re-plans to nothing but reuse."""
    first = plan(EMPTY, desired)
    again = plan(RunningState(desired, first.versions), desired)
    assert all(isinstance(s, Reuse) for s in again.steps)


# --- outbounds --------------------------------------------------------------------------------


def test_builtin_outbounds_come_first_then_nodes_in_declaration_order() -> None:
    desired = lowered(NODES)
    assert [o.tag for o in desired.outbounds] == ["direct", "block", "edge1", "edge2"]
    assert desired.outbound("direct").node.protocol == "direct"
    assert desired.outbound("block").node.protocol == "block"
    assert not desired.outbound("block").uses_dns  # the reject kind never resolves
    assert desired.outbound("direct").uses_dns and desired.outbound("edge1").uses_dns
    assert desired.outbound("edge1").node.host == "10.0.0.1"
    assert all(o.drain is None for o in desired.outbounds)


def test_the_first_declaration_of_a_node_name_wins() -> None:
    desired = lowered("node {\n  a: 'socks5://10.0.0.1:1080'\n  a: 'socks5://10.0.0.2:1080'\n}\n", "dae")
    assert [o.tag for o in desired.outbounds] == ["direct", "block", "a"]
    assert desired.outbound("a").node.host == "10.0.0.1"


def test_a_renamed_node_is_another_outbound_with_the_same_node_id() -> None:
    before = lowered(NODES)
    after = lowered(NODES.replace("edge2", "edge3"))
    assert after.outbound("edge3").node.id == before.outbound("edge2").node.id
    assert after.outbound("edge2") is None


# --- groups -----------------------------------------------------------------------------------

GROUP = """
[group.lb]
policy = "fallback"
filter = ["name(keyword: edge)"]

[routing]
fallback = "lb"
"""


def test_group_members_are_resolved_from_the_nodes() -> None:
    desired = lowered(NODES + GROUP)
    assert desired.group("lb").members == ("edge1", "edge2")
    assert desired.route.routing.fallback == "lb"


def test_a_new_node_matching_a_filter_changes_the_group_declaration() -> None:
    before = lowered(NODES + GROUP)
    after = lowered(NODES + 'edge3 = "socks5://10.0.0.3:1080"\n' + GROUP)
    assert after.group("lb").spec == before.group("lb").spec  # the declaration did not change
    assert after.group("lb") != before.group("lb")
    assert after.group("lb").members == ("edge1", "edge2", "edge3")
    running = RunningState(before, plan(EMPTY, before).versions)
    assert Build(Resource("group", "lb")) in plan(running, after).steps


def test_nested_groups_list_nodes_then_groups_and_cycles_are_cut() -> None:
    desired = lowered(
        NODES
        + """
[group.g1]
filter = ["group(g2)", "name(edge1)"]

[group.g2]
filter = ["group(g1)"]
"""
    )
    assert desired.group("g1").members == ("edge1", "g2")
    assert desired.group("g2").members == ()  # the cycle-closing edge is cut
    plannable(desired)


# --- user sets and inbounds -------------------------------------------------------------------


def test_inbound_users_become_a_user_set_tagged_like_the_inbound() -> None:
    desired = lowered(f"""
[inbound.lan]
url = "mixed://alice:alice-pw@127.0.0.1:{MIXED_PORT}"

[inbound.open]
url = "mixed://127.0.0.1:{MIXED_PORT + 1}"
""")
    assert desired.user_sets == (UserSetDecl("lan", (InboundUser("alice", "alice-pw"),)),)
    assert desired.inbounds == (
        InboundDecl("lan", "mixed", BindSpec("tcp", "127.0.0.1", MIXED_PORT), users="lan"),
        InboundDecl("open", "mixed", BindSpec("tcp", "127.0.0.1", MIXED_PORT + 1)),
    )


def test_the_api_secret_becomes_user_set_api_and_the_api_inbound_binds_the_controller() -> None:
    desired = lowered(f"""
[experimental.clash_api]
external_controller = "127.0.0.1:{API_PORT}"
external_ui = "ui"
secret = "api-secret"
""")
    assert desired.user_set(API_TAG) == UserSetDecl("api", (InboundUser("api", "api-secret"),))
    api = desired.inbound(API_TAG)
    assert api.kind == "api"
    assert api.bind == BindSpec("tcp", "127.0.0.1", API_PORT)
    assert api.users == "api"
    assert dict(api.settings)["external_ui"].endswith("ui")


def test_an_api_without_a_secret_admits_no_user_set() -> None:
    desired = lowered("[experimental.clash_api]\nexternal_controller = '[::1]:9090'\n")
    assert desired.user_sets == ()
    assert desired.inbound(API_TAG).users is None
    assert desired.inbound(API_TAG).bind == BindSpec("tcp", "::1", 9090)
    assert str(desired.inbound(API_TAG).bind) == "[::1]:9090"


def test_no_api_block_means_no_api_inbound() -> None:
    assert lowered(NODES).inbound(API_TAG) is None


def test_a_changed_api_secret_rebuilds_only_the_user_set() -> None:
    before = lowered("[experimental.clash_api]\nsecret = 'one'\n")
    after = lowered("[experimental.clash_api]\nsecret = 'two'\n")
    running = RunningState(before, plan(EMPTY, before).versions)
    p = plan(running, after)
    assert [s for s in p.steps if not isinstance(s, Reuse)] == [Build(Resource("user set", API_TAG))]


@pytest.mark.parametrize(
    ("bind", "text"),
    [
        (BindSpec("tcp", "127.0.0.1", 1080), "127.0.0.1:1080"),
        (BindSpec("tcp", "::1", 1080), "[::1]:1080"),
        (BindSpec("udp", "127.0.0.1", 8443), "udp 127.0.0.1:8443"),
        (BindSpec("unix", path="/run/honk.sock"), "unix:/run/honk.sock"),
        (BindSpec("tun", path="tun0"), "tun tun0"),
        (BindSpec("tun"), "tun auto"),
        (BindSpec("tproxy", "0.0.0.0", 7893), "tproxy 0.0.0.0:7893"),
        (BindSpec("redir", "0.0.0.0", 7892), "redir 0.0.0.0:7892"),
    ],
)
def test_a_bind_displays_as_the_errors_and_logs_name_it(bind: BindSpec, text: str) -> None:
    assert str(bind) == text


# --- drain overrides and policies -------------------------------------------------------------


def test_a_drain_parameter_becomes_the_drain_override_and_keeps_the_node_id() -> None:
    desired = lowered("""
[node]
closing = "socks5://10.0.0.1:1080?drain=close"
lingering = "socks5://10.0.0.2:1080?drain=5s"
""")
    assert desired.outbound("closing").drain == CLOSE
    assert desired.outbound("lingering").drain == close_after(GRACE)
    plain = parse_node_link("socks5://10.0.0.1:1080", "closing")
    assert desired.outbound("closing").node.id == plain.id == derive_node_id(plain)


def test_a_bad_drain_parameter_is_a_located_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(
            '[global]\nlog_level = "info"\n\n[node]\nx = "socks5://10.0.0.1:1080?drain=sometimes"\n', "toml"
        )
    (error,) = caught.value.errors
    assert error.code == "invalid-drain"
    assert error.key_path == "node.x"
    assert error.loc.line == 5
    assert "drain must be keep, close, or a positive duration" in error.message


@pytest.mark.parametrize(
    ("settings", "policies"),
    [
        ("", Policies(KEEP, CLOSE)),  # RL-16 / RL-55 defaults
        ('drain = "close"', Policies(CLOSE, CLOSE)),
        ('drain = "5s"', Policies(close_after(GRACE), CLOSE)),
        ('user_removal = "keep"', Policies(KEEP, KEEP)),
        ('drain = "keep"\nuser_removal = "5s"', Policies(KEEP, close_after(GRACE))),
    ],
    ids=["defaults", "drain-close", "drain-grace", "removal-keep", "removal-grace"],
)
def test_global_drain_and_user_removal_parse_into_policies(settings: str, policies: Policies) -> None:
    assert lowered(f"[global]\n{settings}\n").policies == policies


@pytest.mark.parametrize("key", ["drain", "user_removal"])
def test_a_bad_global_policy_is_a_located_config_error(key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(f'[global]\nlog_level = "info"\n{key} = "sometimes"\n', "toml")
    (error,) = caught.value.errors
    assert (error.key_path, error.loc.line) == (f"global.{key}", 3)


# --- equality ---------------------------------------------------------------------------------


def test_lowering_the_same_text_twice_gives_equal_states() -> None:
    assert lowered(NODES + GROUP) == lowered(NODES + GROUP)


def test_fields_without_steps_lower_to_an_equal_desired_state() -> None:
    quiet = lowered('[global]\nlog_level = "warn"\n' + NODES)
    loud = lowered('[global]\nlog_level = "debug"\n' + NODES)
    assert quiet == loud  # the spec travels but takes no part in equality
    assert quiet.spec.global_.log_level == "warn"


def test_the_connect_timeout_is_the_dns_declaration() -> None:
    desired = lowered('[global]\nconnect_timeout = "2s"\n')
    assert desired.dns == DnsDecl(2.0)


def test_the_demo_config_lowers_to_a_plannable_state() -> None:
    desired = lower(load_file(str(DEMO_CONFIG)))
    assert [i.tag for i in desired.inbounds] == ["lan", API_TAG]
    assert desired.group("proxy").members == ("direct",)
    plannable(desired)


# --- configurations the loader accepts must plan ----------------------------------------------


def test_a_group_default_naming_a_not_yet_fetched_subscription_node_plans() -> None:
    # the loader accepts it on purpose: "the default may be a subscription node, known only at run time"
    spec = load_text(
        """
[subscription.paid]
url = "https://sub.example/list"

[group.hk]
filter = ["subtag(paid)"]
default = "hk-1"

[routing]
fallback = "hk"
""",
        "toml",
    )
    plannable(lower(spec))


def test_an_inbound_named_like_the_api_is_refused_by_the_loader_or_plans() -> None:
    # RL-45 tags the API listener `api`; a config whose own inbound is also `api` must not
    # load cleanly and then fail every apply with "duplicate inbound tag api"
    text = f"""
[inbound.api]
url = "mixed://127.0.0.1:{MIXED_PORT}"

[experimental.clash_api]
external_controller = "127.0.0.1:{API_PORT}"
"""
    try:
        spec = load_text(text, "toml")
    except ConfigError as exc:
        assert any(d.key_path.startswith("inbound.api") for d in exc.errors)
        return
    try:
        plannable(lower(spec))
    except ApplyError as exc:
        pytest.fail(f"the loader accepted a config every apply refuses: {exc}")


# --- the transparent listener -----------------------------------------------------------

ROUTER = """
[global]
lan_interface = "br-lan,wlan0"
tproxy_port = 7893
dial_mode = "domain++"
auto_config_kernel_parameter = true
"""


def test_a_lan_interface_makes_the_tproxy_listener_with_its_interception() -> None:
    desired = lowered(ROUTER)
    tproxy = desired.inbound("tproxy")
    assert tproxy is not None and tproxy.kind == "tproxy"
    assert tproxy.bind == BindSpec("tproxy", "::", 7893)
    assert dict(tproxy.interception) == {
        "lan_interface": ("br-lan", "wlan0"),
        "tproxy_port": 7893,
        "mark": 0x08000000,
        "auto_config_kernel_parameter": True,
        "wan_interface": (),
    }
    assert dict(tproxy.settings) == {"dial_mode": "domain++", "sniffing_timeout": 0.030}
    plannable(desired)


def test_no_lan_interface_means_no_transparent_listener() -> None:
    assert lowered(NODES).inbound("tproxy") is None


def test_a_dial_mode_change_swaps_the_handler_without_disruption() -> None:
    running = lowered(ROUTER)
    changed = plan(
        RunningState(running, plan(EMPTY, running).versions), lowered(ROUTER.replace('"domain++"', '"ip"'))
    )
    assert [type(s).__name__ for s in changed.steps if getattr(s, "tag", None) == "tproxy"] == ["SwapHandler"]
    assert list(changed.disruptions()) == []


def test_a_lan_interface_change_is_a_disruption() -> None:
    running = lowered(ROUTER)
    changed = plan(
        RunningState(running, plan(EMPTY, running).versions),
        lowered(ROUTER.replace("br-lan,wlan0", "br-lan")),
    )
    assert [tag for tag, _ in changed.disruptions()] == ["tproxy"]


def test_a_redirect_inbound_is_transparent_and_takes_the_global_dial_settings() -> None:
    desired = lowered(ROUTER + '\n[inbound]\nnat = "redirect://0.0.0.0:7894"\n')
    nat = desired.inbound("nat")
    assert nat is not None and nat.kind == "redir" and nat.users is None
    assert dict(nat.settings)["dial_mode"] == "domain++"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[inbound]\nnat = "redirect://u:p@0.0.0.0:7894"\n', "takes no users"),
        ('[inbound]\ntproxy = "mixed://127.0.0.1:7894"\n', "transparent listener"),
        ('[global]\nlan_interface = "a-name-longer-than-15"\n', "not an interface name"),
    ],
)
def test_transparent_configuration_mistakes_are_located_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_text(text, "toml")


def test_wan_interface_alone_makes_the_transparent_listener_intercept_the_hosts_own_traffic() -> None:
    spec = load_text('[global]\nwan_interface = "eth0, auto"\ntproxy_port = 7893\n', "toml")
    assert [d for d in spec.diagnostics if "wan_interface" in d.key_path] == []
    tproxy = lower(spec).inbound("tproxy")
    assert tproxy is not None and tproxy.kind == "tproxy"
    settings = dict(tproxy.interception)
    assert settings["wan_interface"] == ("eth0", "auto") and settings["lan_interface"] == ()


def test_a_wan_interface_change_is_a_disruption() -> None:
    running = lowered(ROUTER)
    changed = plan(
        RunningState(running, plan(EMPTY, running).versions),
        lowered(ROUTER.replace("[global]\n", '[global]\nwan_interface = "eth0"\n', 1)),
    )
    assert [tag for tag, _ in changed.disruptions()] == ["tproxy"]
