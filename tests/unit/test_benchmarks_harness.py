"""The benchmark harnesses' parsing, statistics, configs and verdicts (no subject is started here)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path

import pytest

from benchmarks import api, relay, v2ray
from honk.config.links import parse_node_link
from honk.config.load import load_text
from honk.config.spec import Policy

ROOT = Path(__file__).resolve().parents[2]


def test_parse_kv_keeps_pairs_and_ignores_bare_words() -> None:
    line = "ready mode=idle count=1000 origin_accepted=998 =x y="
    assert relay.parse_kv(line) == {"mode": "idle", "count": "1000", "origin_accepted": "998", "y": ""}


def test_parse_kv_of_a_bulk_line() -> None:
    kv = relay.parse_kv(
        "mode=bulk dir=up streams=8 threads=2 bytes=100 seconds=2.0000 mbps=50.0 "
        "total_bytes=150 errors=0 loadgen_cpu=1.5\n"
    )
    assert kv["dir"] == "up" and float(kv["mbps"]) == 50.0 and int(kv["total_bytes"]) == 150


def test_median_of_three_and_of_none() -> None:
    assert relay.median([3.0, 1.0, 2.0]) == 2.0
    assert relay.median([4.0, 1.0]) == 2.5
    assert relay.median([]) is None


def test_parse_stat_survives_spaces_and_parens_in_comm() -> None:
    fields = ["S", "10", "42", "42"] + ["0"] * 7 + ["150", "50", "7", "3"] + ["0"] * 30
    stat = relay.parse_stat("1234 (evil ) (name) " + " ".join(fields))
    assert stat == {"state": "S", "ppid": 10, "pgrp": 42, "utime": 150, "stime": 50, "cutime": 7, "cstime": 3}


def test_parse_stat_of_this_process() -> None:
    stat = relay.parse_stat(Path("/proc/self/stat").read_text())
    assert stat["pgrp"] == os.getpgrp()


def test_vmrss_from_status_and_zombie() -> None:
    assert relay.parse_vmrss_kb("Name:\tx\nVmHWM:\t 9 kB\nVmRSS:\t   2048 kB\n") == 2048
    assert relay.parse_vmrss_kb("Name:\tx\nState:\tZ (zombie)\n") == 0


def test_group_figures_of_this_process_group() -> None:
    pgid = os.getpgrp()
    assert relay.group_rss_kb(pgid) > 0
    assert relay.group_cpu_seconds(pgid) > 0


def _metrics() -> dict[str, dict[str, float]]:
    return {
        "haproxy": {"bulk_up_1": 1000.0, "cpu_up_1": 0.4, "added_p50_us": 20.0},
        "pproxy": {"bulk_up_1": 400.0, "idle_kb_per_conn": 10.0, "start_rss_mb": 32.0},
        "honk": {
            "bulk_up_1": 950.0,
            "cpu_up_1": 0.7,
            "added_p50_us": 30.0,
            "idle_kb_per_conn": 10.0,
            "demo_rss_mb": 48.5,
        },
    }


@pytest.mark.parametrize(
    ("target", "status", "ratio"),
    [
        (relay.Target("bulk", "bulk_up_1", ">=", 0.9, "haproxy"), "met", 0.95),
        (relay.Target("bulk", "bulk_up_1", ">=", 2.0, "pproxy"), "met", 2.375),
        (relay.Target("cpu", "cpu_up_1", "<=", 1.5, "haproxy"), "NOT met", 1.75),
        (relay.Target("lat", "added_p50_us", "<=", 1.5, "haproxy"), "met", 1.5),  # the bound itself passes
        (relay.Target("idle", "idle_kb_per_conn", "<=", 1.0, "pproxy"), "met", 1.0),
        (relay.Target("demo", "demo_rss_mb", "<=", 1.5, "pproxy", "start_rss_mb"), "NOT met", 48.5 / 32),
        (relay.Target("rate", "rate_16", ">=", 1.0, "microsocks"), "n/a", None),
    ],
)
def test_evaluate(target: relay.Target, status: str, ratio: float | None) -> None:
    got = relay.evaluate(target, "honk", _metrics())
    assert got["status"] == status
    assert got["ratio"] == (pytest.approx(ratio) if ratio is not None else None)


def test_targets_cover_what_the_issue_asks() -> None:
    labels = [t.label for t in relay.targets(relay.FULL)]
    assert len(labels) == len(set(labels)) == 8 + 4 + 1 + 4 + 2
    assert {t.peer for t in relay.targets(relay.FULL)} == {"haproxy", "pproxy", "microsocks"}


def test_figures_table_aligns_and_drops_empty_rows() -> None:
    text = relay.figures_table(relay.QUICK, ["haproxy", "honk"], _metrics())
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "haproxy", "honk"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert any(
        line.startswith("bulk up, 1 stream (MB/s)") and line.endswith("1,000    950") for line in lines
    )
    assert not any("conn/s" in line for line in lines)  # nobody has a rate figure
    assert len({len(line) for line in lines[:2]}) == 1


def test_targets_table_marks_each_verdict() -> None:
    results = [relay.evaluate(t, "honk", _metrics()) for t in relay.targets(relay.FULL)]
    text = relay.targets_table(results)
    assert "NOT met" in text and " met" in text and "n/a" in text


def test_busy_warning() -> None:
    assert relay.busy_warning("0.20 0.10 0.05 1/100 42", 2) == ""
    assert "load average 3.00" in relay.busy_warning("3.00 1.0 0.5 3/100 42", 2)


def test_haproxy_config_forces_splicing_on_loopback() -> None:
    cfg = relay.haproxy_config(8000, 9000)
    for option in ("splice-request", "splice-response", "splice-auto"):
        assert f"option {option}" in cfg
    assert "bind 127.0.0.1:8000" in cfg and "server origin 127.0.0.1:9000" in cfg and "mode tcp" in cfg


def test_honk_config_routes_the_mixed_port_direct() -> None:
    cfg = relay.honk_config(8123)
    assert "mixed://127.0.0.1:8123" in cfg and "fallback: direct" in cfg and "log_level: warn" in cfg


def test_demo_config_moves_to_free_ports_and_nothing_else() -> None:
    original = (ROOT / "configs" / "demo.toml").read_text()
    cfg = relay.demo_config(original, 8123, 8124)
    assert "mixed://127.0.0.1:8123" in cfg and '"127.0.0.1:8124"' in cfg and 'data_dir = "./var"' in cfg
    live = [line.split("#", 1)[0] for line in cfg.splitlines()]
    assert not any("7890" in line or "9090" in line or "../var" in line for line in live)
    rules = [line for line in original.splitlines() if "->" in line]
    assert rules and all(rule in cfg for rule in rules)


def test_demo_config_refuses_a_shape_it_does_not_know() -> None:
    with pytest.raises(ValueError):
        relay.demo_config("[global]\n", 1, 2)


def test_default_honk_runs_without_honk_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HONK_RELAY", "copy")
    assert "HONK_RELAY" not in relay.subject_env(relay.Subject("honk", "socks"))
    assert (
        relay.subject_env(relay.Subject("honk[copy]", "socks", env={"HONK_RELAY": "copy"}))["HONK_RELAY"]
        == "copy"
    )


# --- paired rows: Shadowsocks and v2ray sinks ----------------------------------------------

SECRET = str(uuid.UUID(int=7))


def test_v2ray_sink_server_takes_its_protocol_and_leaves_through_freedom() -> None:
    for tag in v2ray.TAGS:
        cfg = v2ray.server_config(tag, 9100, SECRET, "/c.pem", "/k.pem")
        (inbound,) = cfg["inbounds"]
        assert (inbound["listen"], inbound["port"], inbound["protocol"]) == (
            "127.0.0.1",
            9100,
            v2ray.protocol(tag),
        )
        assert cfg["outbounds"] == [{"protocol": "freedom", "settings": {}}]
        assert cfg["log"]["access"] == "none"  # no access log: a connection costs the relay only
        tls = inbound["streamSettings"]["security"]
        assert tls == ("tls" if tag in ("trojan", "vless", "trojan_ws", "vmess_tls", "vmess_ws") else "none")


@pytest.mark.parametrize(("tag", "protocol"), [("trojan_ws", "trojan"), ("vmess_ws", "vmess")])
def test_the_websocket_pairs_speak_over_websocket_and_tls_on_both_ends_and_in_honks_link(
    tag, protocol
) -> None:
    server = v2ray.server_config(tag, 9100, SECRET, "/c.pem", "/k.pem")["inbounds"][0]
    client = v2ray.client_config(tag, 9200, 9100, SECRET, "/ca.pem")["outbounds"][0]
    for end in (server, client):
        assert end["protocol"] == protocol
        assert end["streamSettings"]["network"] == "ws" and end["streamSettings"]["security"] == "tls"
        assert end["streamSettings"]["wsSettings"] == {"path": v2ray.WS_PATH}
    node = parse_node_link(v2ray.share_link(tag, 9100, SECRET))
    assert node.protocol == protocol
    assert {("type", "ws"), ("path", v2ray.WS_PATH), ("security", "tls")} <= set(node.params)


def test_v2ray_vmess_sink_is_aead_only_and_vless_has_no_decryption() -> None:
    vmess = v2ray.server_config("vmess", 1, SECRET)["inbounds"][0]["settings"]
    assert vmess == {"clients": [{"id": SECRET, "alterId": 0}]}
    vless = v2ray.server_config("vless", 1, SECRET, "/c", "/k")["inbounds"][0]["settings"]
    assert vless == {"clients": [{"id": SECRET}], "decryption": "none"}
    trojan = v2ray.server_config("trojan", 1, "pw", "/c", "/k")["inbounds"][0]
    assert trojan["settings"] == {"clients": [{"password": "pw"}]}
    certificates = trojan["streamSettings"]["tlsSettings"]["certificates"]
    assert certificates == [{"certificateFile": "/c", "keyFile": "/k"}]


def test_v2ray_tls_configs_refuse_to_go_without_their_files() -> None:
    with pytest.raises(ValueError):
        v2ray.server_config("trojan", 1, "pw")
    with pytest.raises(ValueError):
        v2ray.client_config("vless", 1, 2, SECRET)
    with pytest.raises(ValueError):
        v2ray.share_link("shadowsocks", 1, SECRET)


def test_v2ray_client_is_a_socks_port_into_the_sink() -> None:
    cfg = v2ray.client_config("vmess", 9200, 9100, SECRET)
    (inbound,) = cfg["inbounds"]
    assert (inbound["port"], inbound["protocol"], inbound["settings"]["auth"]) == (9200, "socks", "noauth")
    (outbound,) = cfg["outbounds"]
    (server,) = outbound["settings"]["vnext"]
    assert (server["address"], server["port"]) == ("127.0.0.1", 9100)
    assert server["users"] == [{"id": SECRET, "alterId": 0, "security": "aes-128-gcm"}]
    assert outbound["mux"] == {"enabled": False} and outbound["streamSettings"]["security"] == "none"


def test_v2ray_tls_client_trusts_only_the_given_ca_for_localhost() -> None:
    trojan = v2ray.client_config("trojan", 9200, 9100, "pw", "/ca.pem")["outbounds"][0]
    assert trojan["settings"] == {"servers": [{"address": "127.0.0.1", "port": 9100, "password": "pw"}]}
    tls = trojan["streamSettings"]["tlsSettings"]
    assert tls == {
        "serverName": "localhost",
        "allowInsecure": False,
        "certificates": [{"usage": "verify", "certificateFile": "/ca.pem"}],
    }
    vless = v2ray.client_config("vless", 9200, 9100, SECRET, "/ca.pem")["outbounds"][0]
    assert vless["settings"]["vnext"][0]["users"] == [{"id": SECRET, "encryption": "none"}]


def test_vmess_link_is_the_v2rayn_json_form_with_aes_128_gcm() -> None:
    link = v2ray.share_link("vmess", 9100, SECRET)
    fields = json.loads(base64.b64decode(link.removeprefix("vmess://")))
    assert fields["add"] == "127.0.0.1" and fields["port"] == "9100" and fields["id"] == SECRET
    assert (fields["aid"], fields["scy"], fields["net"], fields["tls"]) == ("0", "aes-128-gcm", "tcp", "")


@pytest.mark.parametrize("tag", v2ray.TAGS)
def test_honk_reads_each_v2ray_link_as_the_sink(tag: str) -> None:
    node = parse_node_link(v2ray.share_link(tag, 9100, SECRET))
    assert (node.protocol, node.host, node.port) == (v2ray.protocol(tag), "127.0.0.1", 9100)
    if tag == "vmess":
        assert node.encryption == "aes-128-gcm"
    else:
        assert ("security", "tls") in node.params and ("sni", "localhost") in node.params


def test_honk_node_config_routes_everything_to_the_one_node() -> None:
    sink = relay.SsSink("aes256", 9100, method="aes-256-gcm")
    spec = load_text(relay.honk_node_config(8123, sink.link()), "dae")
    (node,) = spec.nodes
    assert (node.protocol, node.port, node.encryption) == ("ss", 9100, "aes-256-gcm")
    assert spec.routing.fallback == node.name and not spec.routing.rules
    assert "mixed://127.0.0.1:8123" in relay.honk_node_config(8123, sink.link())


def test_ss_sink_link_is_sip002() -> None:
    link = relay.SsSink("chacha", 9100, method="chacha20-ietf-poly1305").link()
    userinfo = link.removeprefix("ss://").partition("@")[0]
    assert (
        base64.urlsafe_b64decode(userinfo + "=" * (-len(userinfo) % 4)).decode()
        == f"chacha20-ietf-poly1305:{relay.SS_PASSWORD}"
    )


def test_tls_sink_makes_its_ca_and_honk_trusts_it_through_ssl_cert_file(tmp_path: Path) -> None:
    sink = relay.V2raySink("trojan", 9100, secret="pw")
    argv = sink.command(tmp_path)
    config = json.loads(Path(argv[-1]).read_text())
    (cert,) = config["inbounds"][0]["streamSettings"]["tlsSettings"]["certificates"]
    assert Path(cert["certificateFile"]).is_file() and Path(cert["keyFile"]).is_file()
    assert Path(sink.ca_file).read_text().startswith("-----BEGIN CERTIFICATE-----")
    (honk,) = [s for s in relay.sink_subjects(sink, "", "", "", "") if s.name.startswith("honk")]
    assert relay.subject_env(honk)["SSL_CERT_FILE"] == sink.ca_file


def test_plain_vmess_sink_sets_no_trust_store() -> None:
    sink = relay.V2raySink("vmess", 9100, secret=SECRET)
    assert sink.env() == {}


def test_pairs_are_named_by_peer_family_and_tag() -> None:
    names = [s.name for s in relay.sink_subjects(relay.V2raySink("vless", 1, secret=SECRET), "", "", "", "")]
    assert names == ["v2ray:vless", "honk[v2ray]:vless"]
    ss = relay.SsSink("aes256", 1, method="aes-256-gcm")
    names = [s.name for s in relay.sink_subjects(ss, "", "", "", "")]
    assert names == ["ss-local:aes256", "honk[ss]:aes256"]


def test_only_selects_a_family_or_one_tag() -> None:
    subject = relay.Subject("honk[v2ray]:vmess", "socks")
    assert subject.selected({"honk[v2ray]"}) and subject.selected({"honk[v2ray]:vmess"})
    assert not subject.selected({"v2ray"}) and not subject.selected({"honk[v2ray]:vless"})
    assert relay.Subject("v2ray:trojan", "socks").selected({"v2ray"})


def test_v2ray_rows_are_skipped_when_v2ray_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = relay._which
    monkeypatch.setattr(relay, "_which", lambda name: None if name == "v2ray" else real(name))
    rows = relay.v2ray_subjects()
    assert [s.name for s in rows] == [
        name
        for tag in v2ray.TAGS
        for name in (f"v2ray:{tag}", f"honk[v2ray]:{tag}", *(["openssl:trojan"] if tag == "trojan" else []))
    ]
    assert {s.skip for s in rows} == {"v2ray not installed (make bench-peers)"}


def test_the_floor_subject_is_the_load_tool_speaking_trojan_straight_to_the_sink() -> None:
    sink = relay.V2raySink("trojan", 4443, secret=SECRET)
    sink.ca_file = "/w/ca.pem"
    floor = relay.Subject("openssl:trojan", "floor", sink=sink)
    lg = relay.LoadGen(Path("/x/loadgen"), 9000, relay.QUICK)
    argv = lg.argv("rate", floor, None, "--concurrency", "16")
    assert argv == [
        "/x/loadgen",
        "rate",
        "--origin-port",
        "9000",
        "--target",
        "127.0.0.1:4443",
        "--trojan",
        SECRET,
        "--tls-ca",
        "/w/ca.pem",
        "--sni",
        v2ray.SERVER_NAME,
        "--concurrency",
        "16",
    ]
    assert "--socks" not in argv


def test_v2ray_targets_ask_bulk_and_connection_rate_of_the_v2ray_client() -> None:
    got = relay.v2ray_targets(relay.FULL, "trojan")
    assert {t.peer for t in got} == {"v2ray:trojan"}
    # over TLS honk is held to 1.5 x the client's bulk: its records cross no Python code
    assert {(t.metric, t.op, t.factor) for t in got} == {
        ("bulk_up_1", ">=", 1.5),
        ("bulk_down_1", ">=", 1.5),
        ("rate_16", ">=", 1.0),
        ("rate_64", ">=", 1.0),
    }
    assert relay.V2raySink("trojan", 1).targets(relay.FULL) == got
    assert {(t.metric, t.factor) for t in relay.v2ray_targets(relay.FULL, "vmess")} == {
        ("bulk_up_1", 1.0),
        ("bulk_down_1", 1.0),
        ("rate_16", 1.0),
        ("rate_64", 1.0),
    }


def test_ss_targets_hold_bulk_cpu_and_connection_rate_against_ss_local() -> None:
    sink = relay.SsSink("chacha", 1, method="chacha20-ietf-poly1305")
    got = sink.targets(relay.FULL)
    assert {t.peer for t in got} == {"ss-local:chacha"}
    assert {(t.metric, t.factor) for t in got} == {
        ("bulk_up_1", 1.0),
        ("bulk_down_1", 1.0),
        ("cpu_up_1", 1.0),
        ("cpu_down_1", 1.0),
        ("rate_16", 0.8),
        ("rate_64", 0.8),
    }
    assert sink.rate  # so the pair's connection rate is measured at all


def test_a_pair_is_judged_against_its_own_peer() -> None:
    metrics = {
        "v2ray:vmess": {"bulk_up_1": 355.0, "rate_16": 2000.0},
        "honk[v2ray]:vmess": {"bulk_up_1": 400.0, "rate_16": 1000.0},
    }
    verdicts = {
        t.metric: relay.evaluate(t, "honk[v2ray]:vmess", metrics)["status"]
        for t in relay.v2ray_targets(relay.QUICK, "vmess")
    }
    assert verdicts == {"bulk_up_1": "met", "bulk_down_1": "n/a", "rate_16": "NOT met", "rate_64": "n/a"}


def test_parse_time_wait_reads_the_tcp_lines_tw_count() -> None:
    sockstat = (
        "sockets: used 8\nTCP: inuse 1 orphan 0 tw 15612 alloc 1 mem 0\nUDP: inuse 0 mem 0\n"
        "UDPLITE: inuse 0\n"
    )
    assert relay.parse_time_wait(sockstat) == 15612
    assert relay.parse_time_wait("sockets: used 8\n") == 0


# --- the control API benchmark ----------------------------------------------------------------


def test_api_config_has_every_node_in_a_selector_and_a_urltest_group_and_the_api_on(tmp_path: Path) -> None:
    spec = load_text(api.config_text(3, tmp_path / "var", secret="k", first_port=30000), "dae")
    assert [(n.name, n.protocol, n.host, n.port) for n in spec.nodes] == [
        ("n0", "socks5", "127.0.0.1", 30000),
        ("n1", "socks5", "127.0.0.1", 30001),
        ("n2", "socks5", "127.0.0.1", 30002),
    ]
    assert len({n.id for n in spec.nodes}) == 3  # distinct ports keep the NodeIds distinct
    assert {g.name: g.policy for g in spec.groups} == {"select": Policy.SELECTOR, "fastest": Policy.URLTEST}
    assert all(not g.filters for g in spec.groups)  # no filter: every node is a member
    assert spec.routing.fallback == "direct" and not spec.routing.rules
    assert spec.global_.check_interval == 3600 and not spec.global_.tcp_check_url
    assert spec.clash_api is not None
    assert (spec.clash_api.external_controller, spec.clash_api.secret) == ("127.0.0.1:0", "k")
    assert [i.name for i in spec.inbounds] == ["lan"]


def test_api_percentile_is_nearest_rank_and_p99_of_few_samples_is_the_worst() -> None:
    samples = [float(v) for v in range(100, 0, -1)]
    assert api.percentile(samples, 50) == 50.0 and api.percentile(samples, 99) == 99.0
    assert api.percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert api.percentile([7.0], 1) == 7.0
    with pytest.raises(ValueError):
        api.percentile([], 50)


def test_api_seeded_samples_stay_in_range_and_differ_between_nodes() -> None:
    first = [api.seeded_rtt(node, 0) for node in range(200)]
    assert all(api.BASE_RTT <= rtt < api.BASE_RTT + api.RTT_SPREAD for rtt in first)
    assert len(set(first)) > 150


def test_api_runner_lines_parse() -> None:
    got = api.parse_kv("ready api=127.0.0.1:4321 lan=5555 seeded=2000")
    assert got == {"api": "127.0.0.1:4321", "lan": "5555", "seeded": "2000"}
    assert float(api.parse_kv("stall ms=12.500")["ms"]) == 12.5


def _api_figures(worst_stall: float) -> api.Figures:
    endpoints = [
        api.EndpointFigures(path, [10.0, 20.0], [1.0, worst_stall if path == "/proxies" else 2.0], 3_000_000)
        for path in api.ENDPOINTS
    ]
    idle = api.PathFigures(api.Samples([100.0, 100.0, 200.0]), api.Samples([1000.0, 1000.0, 2000.0]))
    busy = api.PathFigures(api.Samples([140.0, 140.0, 800.0]), api.Samples([1520.0, 1520.0, 120_000.0]))
    return api.Figures(
        2000,
        endpoints,
        idle,
        busy,
        "native",
        {"polls": 5, "poll_ms": 180.0, "frames": {"/traffic": 5}, "errors": 0},
    )


@pytest.mark.parametrize(("worst", "status"), [(99.0, "met"), (100.0, "met"), (150.0, "NOT met")])
def test_api_target_is_the_worst_proxies_stall_and_the_rest_is_reference(worst: float, status: str) -> None:
    rows = api.rows(_api_figures(worst))
    (target,) = [r for r in rows if r[2]]
    assert target[0].startswith("GET /proxies (2000 nodes, 3.00 MB") and target[3] == status
    assert f"worst {worst:.1f} ms" in target[1]
    assert {r[3] for r in rows if r is not target} - {"reference"} == {"errors: 0"}


def test_api_rows_give_the_dashboard_over_idle_ratios() -> None:
    rows = api.rows(_api_figures(1.0))
    ratios = [r[1] for r in rows if r[0].strip().startswith("ratio")]
    assert ratios == ["p50 x1.40, p99 x4.00", "p50 x1.52, p99 x60.00"]
    assert any("(native relay)" in r[0] for r in rows)
    assert "p99 120.0 ms" in next(r[1] for r in rows if r[0].startswith("new tunnel") and "dashboard" in r[0])


def test_a_pairs_rate_runs_alternate_who_goes_first() -> None:
    assert relay.interleaved(["v2ray:trojan", "honk[v2ray]:trojan"], 3) == [
        ["v2ray:trojan", "honk[v2ray]:trojan"],
        ["honk[v2ray]:trojan", "v2ray:trojan"],
        ["v2ray:trojan", "honk[v2ray]:trojan"],
    ]
    assert relay.interleaved(["ss-local:aes256"], 2) == [["ss-local:aes256"], ["ss-local:aes256"]]


def test_the_time_wait_cap_is_set_for_the_body_and_restored(tmp_path: Path) -> None:
    buckets = tmp_path / "tcp_max_tw_buckets"
    buckets.write_text("131072\n")
    with relay.time_wait_capped(2000, buckets) as capped:
        assert capped
        assert buckets.read_text() == "2000"
    assert buckets.read_text() == "131072"


def test_without_the_right_to_cap_time_wait_the_body_still_runs(tmp_path: Path) -> None:
    with relay.time_wait_capped(2000, tmp_path / "missing" / "tcp_max_tw_buckets") as capped:
        assert not capped
