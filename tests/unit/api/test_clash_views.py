"""The Clash API's JSON views, built from a real plane and health state without sockets."""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import logging

import pytest

from honk.alive.group_checks import GroupCheck, GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.api import clash_views as views
from honk.config.load import load_text
from honk.config.spec import Policy
from honk.connection.plane import build_plane
from honk.connection.tracker import ConnectionInfo
from honk.core.clock import FakeClock
from honk.core.net import Address, Network
from honk.group.filter import HealthFilter
from honk.group.score.attempt import Result
from honk.group.score.cells import Outcome
from honk.group.score.keys import ScoreTarget

SOCKS_SECRET = "s0cksPW-topsecret"
SS_SECRET = "ssPW-topsecret"
SS_USERINFO = base64.urlsafe_b64encode(f"aes-256-gcm:{SS_SECRET}".encode()).decode().rstrip("=")

CONFIG = f"""
global {{
    tcp_check_url: 'http://check.example/generate_204'
    check_interval: 3600s
}}
inbound {{
    lan: 'mixed://0.0.0.0:7890?allow_unauthenticated=true'
}}
node {{
    hk: 'socks5://user:{SOCKS_SECRET}@127.0.0.1:9'
    '🇯🇵 Japan 04': 'ss://{SS_USERINFO}@127.0.0.1:19'
    us: 'socks5://127.0.0.1:29'
}}
group {{
    My Proxy {{
        filter: name(hk)
        filter: group(Auto, Fall back, LB, Smart)
    }}
    Auto {{
        filter: name(hk, '🇯🇵 Japan 04')
        policy: min_moving_avg
        check_url: 'http://group.example/check'
    }}
    Fall back {{
        filter: name(hk, us)
        policy: fallback
    }}
    LB {{
        filter: name(hk, us)
        policy: roundrobin
    }}
    Smart {{
        filter: name(us)
        policy: score
    }}
}}
routing {{
    domain(suffix: a.example, suffix: b.example) -> My Proxy
    domain(full: x.example, keyword: ads) -> block
    dport(22) && !sip(10.0.0.0/8) -> direct
    dip(geoip: private) -> direct
    l4proto(udp) -> Auto
    fallback: My Proxy
}}
"""


class World:
    """A plane over the test config with real health objects on a fake clock."""

    def __init__(self, text: str = CONFIG) -> None:
        self.clock = FakeClock()
        self.alive = AliveDialerSet(self.clock)
        self.checks = GroupChecks(self.clock)
        self.spec = load_text(text, "dae")
        self.plane = build_plane(self.spec, self.clock, 1, health=HealthFilter(self.alive, self.checks))
        self.ids = {n.name: n.id for n in self.spec.nodes}
        for name, node_id in self.ids.items():
            self.alive.register_node(node_id, name)
        self.global_choice = "direct"

    def ctx(self) -> views.ProxyContext:
        return views.ProxyContext(self.plane, self.alive, self.checks, self.global_choice)

    def kill(self, name: str, *families: Family) -> None:
        for family in families or (Family.V4,):
            for _ in range(3):
                self.alive.notify_check_failure(self.ids[name], Domain.TCP, family, force=True)


@pytest.fixture
def world() -> World:
    return World()


def test_group_types_use_mihomo_casing_and_score_shows_as_urltest(world):
    listed = json.loads(views.proxies_json(world.ctx()))["proxies"]
    assert {
        name: listed[name]["type"] for name in ("My Proxy", "Auto", "Fall back", "LB", "Smart", "GLOBAL")
    } == {
        "My Proxy": "Selector",
        "Auto": "URLTest",
        "Fall back": "Fallback",
        "LB": "LoadBalance",
        "Smart": "URLTest",
        "GLOBAL": "Selector",
    }
    assert listed["DIRECT"]["type"] == "Direct" and listed["REJECT"]["type"] == "Reject"
    assert listed["hk"]["type"] == "Socks5" and listed["🇯🇵 Japan 04"]["type"] == "Shadowsocks"
    assert "direct" not in listed and "block" not in listed


def test_every_group_has_a_non_empty_all_and_leaves_have_none(world):
    listed = json.loads(views.proxies_json(world.ctx()))["proxies"]
    groups = {name for name, p in listed.items() if p.get("all")}
    assert groups == {"My Proxy", "Auto", "Fall back", "LB", "Smart", "GLOBAL"}
    assert listed["My Proxy"]["all"] == ["hk", "Auto", "Fall back", "LB", "Smart"]


def test_global_lists_direct_block_nodes_then_groups_in_config_order(world):
    glob = json.loads(views.proxies_json(world.ctx()))["proxies"]["GLOBAL"]
    assert glob["all"] == [
        "DIRECT",
        "REJECT",
        "hk",
        "🇯🇵 Japan 04",
        "us",
        "My Proxy",
        "Auto",
        "Fall back",
        "LB",
        "Smart",
    ]
    assert glob["now"] == "DIRECT"
    world.global_choice = "Auto"
    assert views.global_proxy(world.ctx())["now"] == "Auto"


def test_a_group_sharing_a_nodes_name_is_listed_once_as_the_group():
    shared = World(
        CONFIG.replace("    Smart {{", "    us {{")
        .replace("    Smart {", "    us {")
        .replace("group(Auto, Fall back, LB, Smart)", "group(Auto, Fall back, LB, us)")
    )
    text = views.proxies_json(shared.ctx())
    pairs = json.loads(text, object_pairs_hook=lambda items: items)  # every key, duplicates kept
    names = [key for key, _ in dict(pairs)["proxies"]]
    assert names.count("us") == 1
    proxies = json.loads(text)["proxies"]
    assert proxies["us"]["type"] == "URLTest" and proxies["us"]["all"] == ["us"]  # the group, its node inside
    assert proxies["GLOBAL"]["all"].count("us") == 1


def test_proxy_objects_carry_mihomos_keys_sorted(world):
    listed = json.loads(views.proxies_json(world.ctx()))["proxies"]
    for obj in listed.values():
        assert list(obj) == sorted(obj)
    leaf_keys = {
        "alive",
        "dialer-proxy",
        "extra",
        "history",
        "id",
        "interface",
        "mptcp",
        "name",
        "provider-name",
        "routing-mark",
        "smux",
        "tfo",
        "type",
        "udp",
        "uot",
        "xudp",
    }
    assert set(listed["hk"]) == leaf_keys
    assert listed["hk"]["id"] == str(world.ids["hk"])
    auto = listed["Auto"]
    assert {"all", "now", "testUrl", "expectedStatus", "fixed", "hidden", "icon"} <= set(auto)
    assert auto["expectedStatus"] == "*" and auto["hidden"] is False and auto["icon"] == ""
    assert "fixed" not in listed["My Proxy"] and "expectedStatus" not in listed["My Proxy"]
    assert "fixed" not in listed["LB"]


def test_test_url_is_the_group_check_url_else_the_global_check_url(world):
    listed = json.loads(views.proxies_json(world.ctx()))["proxies"]
    assert listed["Auto"]["testUrl"] == "http://group.example/check"
    assert listed["Fall back"]["testUrl"] == "http://check.example/generate_204"


def test_now_of_a_selector_is_its_effective_choice_and_follows_a_write(world):
    ctx = world.ctx()
    assert views.group_proxy(ctx, "My Proxy")["now"] == "hk"  # no choice: the first member
    world.plane.groups.select("My Proxy", "Fall back")
    assert views.group_proxy(ctx, "My Proxy")["now"] == "Fall back"


def test_now_of_automatic_groups_is_the_member_their_tcp_chain_passes_through(world):
    ctx = world.ctx()
    assert views.group_proxy(ctx, "Fall back")["now"] == "hk"
    assert views.group_proxy(ctx, "LB")["now"] in ("hk", "us")
    assert views.group_proxy(ctx, "Smart")["now"] == "us"
    world.kill("hk")
    assert views.group_proxy(ctx, "Fall back")["now"] == "us"
    assert views.group_proxy(ctx, "LB")["now"] == "us"


def test_now_of_a_score_group_is_the_member_its_new_flows_went_to_after_the_incumbent_failed():
    smart = "filter: name(us)\n        policy: score"
    world = World(CONFIG.replace(smart, smart.replace("name(us)", "name(hk, us)")))
    groups, target, dest = (
        world.plane.groups,
        ScoreTarget.of("t.example", 443),
        ipaddress.ip_address("192.0.2.7"),
    )
    for name in ("hk", "us"):  # qualified: ordinary picks only
        for _ in range(8):
            groups.score.evidence.record(
                "Smart", Network.TCP, None, world.ids[name], Outcome.USEFUL, world.clock.now()
            )
    served = groups.resolve("Smart", Network.TCP, target=target, destination=dest)
    assert served.leaf.name == "hk" and views.group_proxy(world.ctx(), "Smart")["now"] == "hk"
    world.clock.advance(1)
    reporter = (
        groups.score_feedback(served.chain, served.leaf, Network.TCP, target, dest)
        .start()
        .begin(world.clock.now())
        .into_reporter(world.clock.now())
    )
    reporter.setup(world.clock.now())
    reporter.settle(world.clock.now(), Result.failure(node_scoped=False))
    assert groups.resolve("Smart", Network.TCP, target=target, destination=dest).leaf.name == "us"
    listed = json.loads(views.proxies_json(world.ctx()))["proxies"]
    assert listed["Smart"]["now"] == "us"  # where new flows go now, not the failed incumbent


def test_fixed_shows_the_tcp_pin_of_urltest_and_fallback(world):
    ctx = world.ctx()
    assert views.group_proxy(ctx, "Fall back")["fixed"] == ""
    world.plane.groups.pin("Fall back", "us")
    shown = views.group_proxy(ctx, "Fall back")
    assert shown["fixed"] == "us" and shown["now"] == "us"


def test_leaf_alive_is_false_for_a_dead_ipv4_node_even_with_its_ipv6_state_unknown(world):
    """GH-D-07, GH-K-01: a node is judged in its health family (hk's server is 127.0.0.1: IPv4);
    the IPv6 state it is never probed in cannot mask a dead IPv4 one."""
    ctx = world.ctx()
    node_id = world.ids["hk"]
    assert views.leaf_proxy(ctx, "hk", world.plane.outbounds["hk"])["alive"] is True  # unknown counts alive
    world.kill("hk", Family.V4)
    assert world.alive.tcp_alive(node_id, Family.V6)  # IPv6: unknown, read as alive
    assert views._node_alive(world.alive, node_id, Family.V4) is False
    assert views.leaf_proxy(ctx, "hk", world.plane.outbounds["hk"])["alive"] is False


def test_leaf_alive_with_no_health_verdict_follows_the_newest_delay_test(world):
    """A dashboard counts a group's ``alive === true`` members: a node whose health was never
    probed, but whose delay test just failed, is not counted; a later success counts it again;
    a health verdict outranks any delay test."""
    ctx = world.ctx()
    node_id = world.ids["hk"]
    hk = world.plane.outbounds["hk"]
    world.alive.record_delay_test(node_id, Family.V4, None, "https://t.example/204")
    assert views.leaf_proxy(ctx, "hk", hk)["alive"] is False
    world.clock.advance(1.0)
    world.alive.record_delay_test(node_id, Family.V4, 0.05, "https://other.example/")
    assert views.leaf_proxy(ctx, "hk", hk)["alive"] is True
    world.clock.advance(1.0)
    world.alive.record_delay_test(node_id, Family.V4, None, "https://t.example/204")
    assert views.leaf_proxy(ctx, "hk", hk)["alive"] is False
    world.alive.notify_check_success(node_id, Domain.TCP, Family.V4, 0.02)  # a probe's verdict decides
    assert views.leaf_proxy(ctx, "hk", hk)["alive"] is True


def test_leaf_alive_of_an_ipv6_reached_node_follows_its_ipv6_state_and_its_probes_fill_extra():
    text = CONFIG.replace(
        "us: 'socks5://127.0.0.1:29'", "us: 'socks5://127.0.0.1:29'\n    six: 'socks5://[::1]:39'"
    )
    world = World(text)
    six = world.plane.outbounds["six"]
    assert six.health_family == 6
    world.alive.notify_check_success(world.ids["six"], Domain.TCP, Family.V6, 0.02)
    extra = views.leaf_proxy(world.ctx(), "six", six)["extra"]
    assert extra["http://check.example/generate_204"]["alive"] is True  # the IPv6 probe history
    world.kill("six", Family.V4)  # a family it is not reached on: no verdict
    assert views.leaf_proxy(world.ctx(), "six", six)["alive"] is True
    world.kill("six", Family.V6)
    assert views.leaf_proxy(world.ctx(), "six", six)["alive"] is False


def test_udp_follows_the_leafs_capability(world):
    listed = json.loads(views.proxies_json(world.ctx()))["proxies"]
    assert listed["🇯🇵 Japan 04"]["udp"] is world.plane.outbounds["🇯🇵 Japan 04"].supports_udp
    assert listed["DIRECT"]["udp"] is True
    assert listed["REJECT"]["udp"] is world.plane.outbounds["block"].supports_udp


def test_history_is_in_whole_milliseconds_with_failures_as_zero(world):
    node_id = world.ids["hk"]
    world.alive.record_delay_test(node_id, Family.V4, 0.0841, "https://t.example/204")
    world.alive.record_delay_test(node_id, Family.V4, None, "https://t.example/204")
    world.alive.notify_check_success(node_id, Domain.TCP, Family.V4, 0.0004)
    leaf = views.leaf_proxy(world.ctx(), "hk", world.plane.outbounds["hk"])
    assert [h["delay"] for h in leaf["history"]] == [84, 1]  # a sub-millisecond success is not 0
    assert leaf["history"][0]["time"].startswith("20") and "T" in leaf["history"][0]["time"]
    extra = leaf["extra"]
    assert extra["https://t.example/204"] == {
        "alive": False,
        "history": [
            {"time": extra["https://t.example/204"]["history"][0]["time"], "delay": 84},
            {"time": extra["https://t.example/204"]["history"][1]["time"], "delay": 0},
        ],
    }
    # the global check URL carries the TCP probe history (v4)
    assert [h["delay"] for h in extra["http://check.example/generate_204"]["history"]] == [84, 0, 1]


def test_history_keeps_the_last_ten_entries(world):
    node_id = world.ids["us"]
    for ms in range(1, 16):
        world.alive.record_delay_test(node_id, Family.V4, ms / 1000, "")
    leaf = views.leaf_proxy(world.ctx(), "us", world.plane.outbounds["us"])
    assert [h["delay"] for h in leaf["history"]] == list(range(6, 16))


def test_extra_carries_group_check_url_histories_under_the_group_url(world):
    world.checks.sync_group_check_urls(
        [
            GroupCheck(
                "Auto",
                Policy.URLTEST,
                "http://group.example/check",
                lambda: [("hk", world.ids["hk"]), ("🇯🇵 Japan 04", world.ids["🇯🇵 Japan 04"])],
            ),
        ]
    )
    world.checks.notify("🇯🇵 Japan 04", "http://group.example/check", 0.2)
    leaf = views.leaf_proxy(world.ctx(), "🇯🇵 Japan 04", world.plane.outbounds["🇯🇵 Japan 04"])
    assert leaf["extra"]["http://group.example/check"]["alive"] is True
    assert [h["delay"] for h in leaf["extra"]["http://group.example/check"]["history"]] == [200]
    other = views.leaf_proxy(world.ctx(), "us", world.plane.outbounds["us"])
    assert "http://group.example/check" not in other["extra"]  # not a member of Auto


def test_builtins_map_to_clash_names_and_back():
    assert views.clash_name("direct") == "DIRECT" and views.clash_name("block") == "REJECT"
    assert views.clash_name("hk") == "hk"
    assert views.honk_name("DIRECT", ["a", "direct"]) == "direct"
    assert views.honk_name("REJECT", ["block"]) == "block"
    assert views.honk_name("DIRECT", ["DIRECT", "direct"]) == "DIRECT"  # a real name wins


def test_lookup_finds_leaves_groups_builtins_and_global(world):
    ctx = world.ctx()
    assert views.lookup(ctx, "Fall back") == "Fall back"
    assert views.lookup(ctx, "🇯🇵 Japan 04") == "🇯🇵 Japan 04"
    assert views.lookup(ctx, "DIRECT") == "direct" and views.lookup(ctx, "REJECT") == "block"
    assert views.lookup(ctx, "GLOBAL") == "GLOBAL"
    assert views.lookup(ctx, "nothing") is None


def test_chains_run_leaf_first_and_ports_are_strings():
    info = ConnectionInfo(
        id="id-1",
        network=Network.TCP,
        inbound="lan",
        source=Address("192.168.1.5", 50000),
        target=Address("example.com", 443),
        rule="domain(suffix:a.example,suffix:b.example)",
        chain=("My Proxy", "Auto", "hk"),
        upload=10,
        download=20,
        start=1_700_000_000.5,
        plane_generation=1,
    )
    snap = views.connections(
        [info],
        (100, 200),
        4096,
        views.rule_index(World().spec),
        {"lan": views.InboundInfo("mixed", "0.0.0.0", 7890)},
    )
    assert snap["uploadTotal"] == 100 and snap["downloadTotal"] == 200 and snap["memory"] == 4096
    conn = snap["connections"][0]
    assert conn["chains"] == ["hk", "Auto", "My Proxy"]
    assert conn["rule"] == "DomainSuffix" and conn["rulePayload"] == "a.example,b.example"
    meta = conn["metadata"]
    assert (
        meta["sourcePort"] == "50000" and meta["destinationPort"] == "443" and meta["inboundPort"] == "7890"
    )
    assert meta["host"] == "example.com" and meta["destinationIP"] == ""
    assert meta["network"] == "tcp" and meta["inboundName"] == "lan" and meta["sourceIP"] == "192.168.1.5"


def test_an_ip_target_and_the_fallback_rule_and_a_builtin_leaf():
    info = ConnectionInfo(
        id="id-2",
        network=Network.UDP,
        inbound="lan",
        source=Address("127.0.0.1", 1),
        target=Address("10.0.0.1", 53),
        rule="fallback",
        chain=("direct",),
        upload=0,
        download=0,
        start=0.0,
        plane_generation=1,
    )
    conn = views.connection_view(info, views.rule_index(World().spec), {})
    assert conn["chains"] == ["DIRECT"] and conn["rule"] == "Match" and conn["rulePayload"] == ""
    assert conn["metadata"]["destinationIP"] == "10.0.0.1" and conn["metadata"]["host"] == ""
    assert conn["metadata"]["network"] == "udp"


def test_rules_carry_mihomo_types_payloads_and_a_final_match(world):
    listed = views.rules(world.spec)["rules"]
    assert [(r["type"], r["payload"], r["proxy"]) for r in listed] == [
        ("DomainSuffix", "a.example,b.example", "My Proxy"),
        ("OR", "((Domain,x.example),(DomainKeyword,ads))", "REJECT"),
        ("AND", "((DstPort,22),(NOT,((SrcIPCIDR,10.0.0.0/8))))", "DIRECT"),
        ("GeoIP", "private", "DIRECT"),
        ("Network", "udp", "Auto"),
        ("Match", "", "My Proxy"),
    ]
    assert [r["index"] for r in listed] == list(range(6))
    assert all(r["size"] == -1 for r in listed)


def test_providers_have_default_and_a_compatible_provider_per_group(world):
    out = json.loads(views.providers_json(world.ctx(), []))["providers"]
    assert out["default"]["vehicleType"] == "Compatible"
    assert [p["name"] for p in out["default"]["proxies"]][:3] == ["DIRECT", "REJECT", "hk"]
    assert out["Auto"]["vehicleType"] == "Compatible"
    assert [p["name"] for p in out["Auto"]["proxies"]] == ["hk", "🇯🇵 Japan 04"]
    assert all(p["type"] == "Proxy" for p in out.values())


def test_a_subscription_provider_lists_its_nodes_with_usage_and_update_time():
    w = World()
    extra = dataclasses.replace(w.spec.nodes[2], name="sub-1", subscription="paid", port=39)
    w.spec = dataclasses.replace(w.spec, nodes=(*w.spec.nodes, extra))
    w.plane = build_plane(w.spec, w.clock, 2)
    info = views.ProviderInfo(
        "paid", 1_700_000_000.0, {"upload": 1, "download": 2, "total": 30, "expire": 99}
    )
    out = json.loads(views.providers_json(w.ctx(), [info]))["providers"]["paid"]
    assert out["vehicleType"] == "HTTP" and [p["name"] for p in out["proxies"]] == ["sub-1"]
    assert out["proxies"][0]["provider-name"] == "paid"
    assert out["subscriptionInfo"] == {"Upload": 1, "Download": 2, "Total": 30, "Expire": 99}
    assert out["updatedAt"].startswith("2023-11-1")


def test_no_credential_appears_in_any_view(world):
    node_id = world.ids["hk"]
    world.alive.record_delay_test(node_id, Family.V4, 0.05, "https://t.example/204")
    info = ConnectionInfo(
        id="id-1",
        network=Network.TCP,
        inbound="lan",
        source=Address("127.0.0.1", 5),
        target=Address("example.com", 443),
        rule="fallback",
        chain=("My Proxy", "hk"),
        upload=1,
        download=2,
        start=0.0,
        plane_generation=1,
    )
    ctx = world.ctx()
    text = json.dumps(
        [
            json.loads(views.proxies_json(ctx)),
            views.groups_list(ctx),
            json.loads(views.providers_json(ctx, [])),
            views.rules(world.spec),
            views.connections([info], (0, 0), 0, views.rule_index(world.spec), {}),
            views.configs(world.spec, "rule", "info", 7890),
        ],
        ensure_ascii=False,
    )
    for secret in (SOCKS_SECRET, SS_SECRET, SS_USERINFO, "user:"):
        assert secret not in text


def test_configs_report_the_mixed_port_lan_access_and_mode(world):
    conf = views.configs(world.spec, "Global", "info", 7890)
    assert conf["mixed-port"] == 7890 and conf["port"] == 0 and conf["socks-port"] == 0
    assert conf["allow-lan"] is True and conf["bind-address"] == "*"
    assert conf["mode"] == "global" and conf["mode-list"] == ["rule", "global", "direct"]
    assert conf["tun"] == {"enable": False} and conf["log-level"] == "info" and conf["ipv6"] is True
    local = World(CONFIG.replace("0.0.0.0:7890", "127.0.0.1:7890"))
    conf = views.configs(local.spec, "rule", "debug", 7890)
    assert conf["allow-lan"] is False and conf["bind-address"] == "127.0.0.1"


def test_traffic_frames_are_per_second_differences_with_totals():
    assert views.traffic((100, 1000), (100, 1000), 1.0) == {
        "up": 0,
        "down": 0,
        "upTotal": 100,
        "downTotal": 1000,
    }
    assert views.traffic((100, 1000), (600, 3000), 2.0) == {
        "up": 250,
        "down": 1000,
        "upTotal": 600,
        "downTotal": 3000,
    }


def test_rss_comes_from_the_second_statm_field_in_pages():
    assert views.rss_from_statm("1000 250 30 1 0 100 0\n", 4096) == 250 * 4096
    assert views.rss_from_statm("", 4096) == 0


def test_log_frames_in_plain_and_structured_form():
    assert views.log_plain("info", "hello") == {"type": "info", "payload": "hello"}
    frame = views.log_structured(1_700_000_000.0, "warning", "careful")
    assert frame["level"] == "warning" and frame["message"] == "careful" and frame["fields"] == []
    assert len(frame["time"]) == 8 and frame["time"][2] == ":" and frame["time"][5] == ":"


def test_clash_log_level_names_the_running_level():
    from honk.api.clash import clash_log_level

    assert clash_log_level(5) == "debug" and clash_log_level(logging.INFO) == "info"
    assert (
        clash_log_level(logging.WARNING) == "warning" and clash_log_level(logging.CRITICAL + 10) == "silent"
    )


def test_delay_ms_never_reports_a_success_as_zero_and_caps_at_uint16():
    assert views.delay_ms(0.0001) == 1 and views.delay_ms(0.0846) == 85
    assert views.delay_ms(100.0) == 65535


def test_a_raw_request_target_is_escaped_as_a_browser_would_and_a_clean_one_is_untouched():
    from honk.api.server import escape_request_line

    raw = "PUT /proxies/🇯🇵 Japan 04 HTTP/1.1\r\n".encode()
    assert escape_request_line(raw) == b"PUT /proxies/%F0%9F%87%AF%F0%9F%87%B5%20Japan%2004 HTTP/1.1\r\n"
    clean = b"GET /proxies/My%20Proxy?x=1 HTTP/1.1\r\n"
    assert escape_request_line(clean) is clean
    assert escape_request_line(b"not a request line\r\n") == b"not a request line\r\n"
