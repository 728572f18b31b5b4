"""dae's per-group check keys and filter annotations, as the dae loader reads them.

dae (config/config.go ``Group``; control/control_plane.go ``ParseGroupOverrideOption``) lets a
group override tcp_check_url, tcp_check_http_method, udp_check_dns, check_interval and
check_tolerance, and a filter line carry ``[add_latency: <Go duration>]``
(component/outbound/dialer/annotation.go)."""

from __future__ import annotations

import pytest
from config_helpers import run

from honk.config.diagnostics import Severity
from honk.config.expr import parse_go_duration
from honk.config.spec import Policy
from honk.group.membership import resolve_membership

NODES = (
    "node {\n    hk1: 'socks5://192.0.2.1:1080'\n    hk2: 'socks5://192.0.2.2:1080'\n"
    "    us1: 'socks5://192.0.2.3:1080'\n}\n"
)


def _config(group_body: str, global_body: str = "") -> str:
    # line 1: global, lines 2-6: nodes, line 7: group {, line 8: g {, the body from line 9
    return (
        f"global {{{global_body}}}\n" + NODES + "group {\ng {\n" + group_body + "\n}\n}\n"
        "routing {\n    fallback: g\n}\n"
    )


def _warnings(outcome):
    return [(d.code, d.key_path, d.loc.line) for d in outcome.diagnostics if d.severity is Severity.WARNING]


def test_a_group_tcp_check_url_becomes_the_groups_check_url():
    outcome = run(_config("policy: min_moving_avg\ntcp_check_url: 'http://example.com/generate_204'"))
    [g] = outcome.spec.groups
    assert g.check_url == "http://example.com/generate_204"
    assert _warnings(outcome) == []


def test_a_group_tcp_check_url_with_host_addresses_uses_the_url_and_says_so_at_its_line():
    outcome = run(_config("policy: min\ntcp_check_url: 'http://example.com/generate_204,192.0.2.9'"))
    assert outcome.spec.groups[0].check_url == "http://example.com/generate_204"
    assert _warnings(outcome) == [("not-honoured", "group.g.tcp_check_url", 10)]


def test_a_selector_groups_tcp_check_url_is_reported_as_ineffective():
    outcome = run(_config("policy: fixed(0)\ntcp_check_url: 'http://example.com/'"))
    assert outcome.spec.groups[0].policy is Policy.SELECTOR
    assert _warnings(outcome) == [("ineffective-option", "group.g.tcp_check_url", 10)]


def test_a_group_check_tolerance_is_its_urltest_tolerance():
    outcome = run(_config("policy: min_avg10\ncheck_tolerance: 120ms", "\n    check_tolerance: 30ms\n"))
    assert outcome.spec.groups[0].tolerance == pytest.approx(0.120)
    assert _warnings(outcome) == []


def test_a_group_check_tolerance_of_zero_keeps_the_global_one_as_dae_does():
    outcome = run(_config("policy: min\ncheck_tolerance: 0", "\n    check_tolerance: 30ms\n"))
    assert outcome.spec.groups[0].tolerance == pytest.approx(0.030)


def test_a_group_check_interval_is_the_interval_of_its_check_url_probes():
    outcome = run(_config("policy: min\ntcp_check_url: 'http://example.com/'\ncheck_interval: 2m"))
    assert outcome.spec.groups[0].check_interval == pytest.approx(120.0)
    assert _warnings(outcome) == []


def test_a_group_check_interval_without_a_check_url_is_not_honoured_at_its_line():
    outcome = run(_config("policy: min\ncheck_interval: 10s"))
    assert outcome.spec.groups[0].check_interval is None
    [warning] = [d for d in outcome.diagnostics if d.severity is Severity.WARNING]
    assert (warning.code, warning.key_path, warning.loc.line) == (
        "not-honoured",
        "group.g.check_interval",
        10,
    )
    assert "global check_interval" in warning.message


@pytest.mark.parametrize("line", ["udp_check_dns: 'dns.example.com:53'", "tcp_check_http_method: GET"])
def test_a_group_key_honk_cannot_honour_is_a_counted_warning_at_its_line(line):
    outcome = run(_config("policy: min\n" + line))
    assert outcome.spec is not None
    key = line.split(":")[0]
    [warning] = [d for d in outcome.diagnostics if d.severity is Severity.WARNING]
    assert (warning.code, warning.key_path, warning.loc.line) == ("not-honoured", f"group.g.{key}", 10)
    assert "global" in warning.message  # what honk does instead


def test_a_filter_with_an_annotation_keeps_its_members():
    outcome = run(
        _config("filter: name(keyword: 'hk')\nfilter: name(us1) [add_latency: -500ms]\npolicy: min")
    )
    assert _warnings(outcome) == []
    [g] = outcome.spec.groups
    assert [f.add_latency for f in g.filters] == [0.0, pytest.approx(-0.5)]
    membership = resolve_membership(g, outcome.spec.nodes, {"g"})
    assert membership.nodes == ("hk1", "hk2", "us1")
    assert membership.latency_offset("us1") == pytest.approx(-0.5)
    assert membership.latency_offset("hk1") == 0.0


def test_a_node_takes_the_offset_of_the_first_filter_line_that_selects_it():
    outcome = run(
        _config(
            "filter: name(hk1) [add_latency: 100ms]\n"
            "filter: name(keyword: 'hk') [add_latency: -1s]\npolicy: min"
        )
    )
    g = outcome.spec.groups[0]
    membership = resolve_membership(g, outcome.spec.nodes, {"g"})
    assert (membership.latency_offset("hk1"), membership.latency_offset("hk2")) == (
        pytest.approx(0.1),
        pytest.approx(-1.0),
    )


def test_the_first_add_latency_of_an_annotation_counts():
    outcome = run(_config("filter: name(hk1) [add_latency: 200ms, add_latency: 1s]\npolicy: min"))
    assert outcome.spec.groups[0].filters[0].add_latency == pytest.approx(0.2)


def test_an_unknown_annotation_key_is_located():
    outcome = run(_config("filter: name(hk1) [weight: 3]\npolicy: min"))
    assert outcome.error is not None
    [error] = [d for d in outcome.diagnostics if d.severity is Severity.ERROR]
    assert (error.code, error.key_path, error.loc.line) == ("unknown-annotation", "group.g.filter[0]", 9)
    assert "weight" in error.message


@pytest.mark.parametrize("annotation", ["[add_latency: 500]", "[add_latency: soon]", "[]", "[add_latency]"])
def test_a_malformed_annotation_is_located(annotation):
    outcome = run(_config(f"filter: name(hk1) {annotation}\npolicy: min"))
    assert outcome.error is not None
    [error] = [d for d in outcome.diagnostics if d.severity is Severity.ERROR]
    assert (error.key_path, error.loc.line) == ("group.g.filter[0]", 9)


def test_an_annotation_on_a_group_line_is_located():
    outcome = run(_config("filter: group(other) [add_latency: 1s]\npolicy: min"))
    assert outcome.error is not None
    [error] = [d for d in outcome.diagnostics if d.severity is Severity.ERROR]
    assert (error.code, error.loc.line) == ("invalid-annotation", 9)


def test_a_bracket_inside_a_regex_is_no_annotation():
    outcome = run(_config("filter: name(regex: ^hk[12]$) [add_latency: 50ms]\npolicy: min"))
    assert _warnings(outcome) == []
    g = outcome.spec.groups[0]
    assert g.filters[0].terms[0].args[0].value == "^hk[12]$"
    assert resolve_membership(g, outcome.spec.nodes, {"g"}).nodes == ("hk1", "hk2")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("-500ms", -0.5), ("1m30s", 90.0), ("+2s", 2.0), ("0", 0.0), ("1.5h", 5400.0), ("250us", 0.00025)],
)
def test_add_latency_reads_go_durations(text, seconds):
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["500", "-", "1d", "ms", "--1s"])
def test_add_latency_refuses_what_go_refuses(text):
    assert parse_go_duration(text) is None
