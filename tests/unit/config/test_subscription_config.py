"""The subscription section in the dae dialect and the structured formats."""

from __future__ import annotations

import pytest
from config_helpers import SECRET, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.config.diagnostics import ConfigError, Severity
from honk.config.load import load_text
from honk.config.spec import DEFAULT_SUBSCRIPTION_INTERVAL, SubscriptionSpec

TOKEN_URL = f"https://sub.example/api?token={SECRET}"


def subs(text: str, fmt: str = "dae") -> tuple[SubscriptionSpec, ...]:
    outcome = run(text, fmt)
    assert outcome.spec is not None, [str(d) for d in outcome.diagnostics]
    return outcome.spec.subscriptions


def one(entry: str) -> SubscriptionSpec:
    (spec,) = subs(f"subscription {{\n    {entry}\n}}\n")
    return spec


def test_documented_inline_and_block_forms_with_their_defaults():
    got = subs(
        "subscription {\n"
        "    primary: 'https://example.com/sub'\n"
        "    compatible: 'https://example.net/sub'(honk/1.0 like)\n"
        "    'https://example.com/no_tag_link'\n"
        "    detailed: {\n"
        "        url: 'https://example.org/sub'\n"
        "        ua: 'honk/1.0'\n"
        "        interval: '10000s'\n"
        "        cache: false\n"
        "    }\n"
        "}\n"
    )
    assert [(s.name, s.url, s.user_agent, s.interval, s.cache) for s in got] == [
        ("primary", "https://example.com/sub", None, DEFAULT_SUBSCRIPTION_INTERVAL, True),
        ("compatible", "https://example.net/sub", "honk/1.0 like", DEFAULT_SUBSCRIPTION_INTERVAL, True),
        ("example.com", "https://example.com/no_tag_link", None, DEFAULT_SUBSCRIPTION_INTERVAL, True),
        ("detailed", "https://example.org/sub", "honk/1.0", 10000.0, False),
    ]
    assert DEFAULT_SUBSCRIPTION_INTERVAL == 86400.0
    assert got[3].loc.line == 5


@pytest.mark.parametrize(
    ("entry", "name", "url", "ua"),
    [
        (
            "https://bare.example/sub?filter=(hk)#token",
            "bare.example",
            "https://bare.example/sub?filter=(hk)#token",
            None,
        ),
        ("paid: https://paid.example/sub", "paid", "https://paid.example/sub", None),
        ("'paid:https://example.com/sub'", "paid", "https://example.com/sub", None),
        ("'paid:https://example.com/sub'(agent)", "paid", "https://example.com/sub", "agent"),
        ("'https://example.com/sub'(agent:1)", "example.com", "https://example.com/sub", "agent:1"),
        (
            '"tag": "https://example.com/sub"(\'agent # build\')',
            "tag",
            "https://example.com/sub",
            "agent # build",
        ),
        (
            "t: 'https://example.com/sub'(Mozilla/5.0 (X11; (Linux)#build))",
            "t",
            "https://example.com/sub",
            "Mozilla/5.0 (X11; (Linux)#build)",
        ),
        ("t:'https://example.com/sub'()", "t", "https://example.com/sub", None),
        ("'https://[2001:db8::1]:8443/sub'", "2001:db8::1", "https://[2001:db8::1]:8443/sub", None),
    ],
)
def test_inline_entry_spellings(entry, name, url, ua):
    spec = one(entry)
    assert (spec.name, spec.url, spec.user_agent) == (name, url, ua)


@pytest.mark.parametrize(
    ("entry", "ua"),
    [("'http://q.example/'#c", None), ("'http://q.example/'(ua)#c", "ua")],
)
def test_a_comment_glued_after_the_url_or_its_suffix_is_accepted_with_a_hint(entry, ua):
    outcome = run(f"subscription {{\n    {entry}\n}}\n")
    assert outcome.spec is not None and outcome.spec.subscriptions[0].user_agent == ua
    (d,) = outcome.find("legacy-glued-hash")
    assert d.loc.line == 2 and d.severity is Severity.INFO


@pytest.mark.parametrize(
    ("entry", "code"),
    [
        ("'http://q.example/'(ua)(x)", "legacy-ua-boundary"),
        ("'http://q.example/'(agent) junk", "legacy-ua-boundary"),
        ("'http://q.example/' junk", "trailing-entry-text"),
        ("'http://q.example/'(unclosed", "trailing-entry-text"),
        ("just-words-without-a-url", "invalid-statement"),
    ],
)
def test_malformed_entries_are_skipped_with_a_located_warning(entry, code):
    outcome = run(f"subscription {{\n    ok: 'https://ok.example/'\n    {entry}\n}}\n")
    assert outcome.spec is not None
    assert [s.name for s in outcome.spec.subscriptions] == ["ok"]
    (d,) = outcome.find(code)
    assert (d.key_path, d.loc.line, d.severity) == ("subscription[1]", 3, Severity.WARNING)


@pytest.mark.parametrize(
    ("text", "code", "key_path", "line"),
    [
        (
            f"subscription {{\n    paid: 'ftp://{SECRET}.example/sub'\n}}\n",
            "invalid-subscription-url",
            "subscription.paid",
            2,
        ),
        (
            "subscription {\n    paid: 'file://'\n}\n",
            "invalid-subscription-url",  # dae's file:// needs a path
            "subscription.paid",
            2,
        ),
        (
            f"subscription {{\n    paid: 'https://h.example:99999/{SECRET}'\n}}\n",
            "invalid-subscription-url",
            "subscription.paid",
            2,
        ),
        (
            f"subscription {{\n    '': 'https://h.example/{SECRET}'\n}}\n",
            "invalid-value",
            "subscription[0]",
            2,
        ),
        (f"subscription {{\n    'https:///{SECRET}'\n}}\n", "invalid-subscription-url", "subscription[0]", 2),
        ("subscription {\n    d: {\n        ua: x\n    }\n}\n", "missing-value", "subscription.d", 2),
        (
            f"subscription {{\n    d: {{\n        url: 'gopher://{SECRET}'\n    }}\n}}\n",
            "invalid-subscription-url",
            "subscription.d.url",
            3,
        ),
    ],
)
def test_invalid_subscriptions_are_located_errors_without_the_url(text, code, key_path, line):
    outcome = run(text)
    assert outcome.error is not None
    (d,) = outcome.find(code)
    assert (d.severity, d.key_path, d.loc.line) == (Severity.ERROR, key_path, line)
    outcome.assert_no_secret()


def test_the_url_stays_out_of_the_spec_repr_and_of_diagnostics():
    outcome = run(f"subscription {{\n    paid: '{TOKEN_URL}'(agent)#c\n}}\n")
    assert outcome.spec is not None and outcome.spec.subscriptions[0].url == TOKEN_URL
    outcome.assert_no_secret()


def test_interval_zero_disables_refresh_and_unparseable_interval_reads_as_zero_with_a_warning():
    assert one("a: {\n        url: 'https://a.example/'\n        interval: 0\n    }").interval == 0.0
    outcome = run(
        "subscription {\n    a: {\n        url: 'https://a.example/'\n        interval: soon\n    }\n}\n"
    )
    assert outcome.spec is not None and outcome.spec.subscriptions[0].interval == 0.0
    (d,) = outcome.find("invalid-duration")
    assert (d.key_path, d.loc.line) == ("subscription.a.interval", 4)


def test_a_second_declaration_of_the_same_url_and_agent_is_dropped_but_equal_names_are_fine():
    outcome = run(
        "subscription {\n"
        "    a: 'https://one.example/'\n"
        "    b: 'https://one.example/'\n"
        "    b2: 'https://one.example/'(other)\n"
        "    a: 'https://two.example/'\n"
        "}\n"
    )
    assert outcome.spec is not None
    assert [(s.name, s.user_agent) for s in outcome.spec.subscriptions] == [
        ("a", None),
        ("b2", "other"),
        ("a", None),
    ]
    (d,) = outcome.find("duplicate-subscription")
    assert (d.key_path, d.loc.line) == ("subscription.b", 3)


def test_unknown_setting_in_a_block_warns_and_nested_blocks_are_skipped():
    outcome = run(
        "subscription {\n    a: {\n        url: 'https://a.example/'\n        colour: red\n"
        "        inner {\n        }\n    }\n}\n"
    )
    assert outcome.spec is not None and outcome.spec.subscriptions[0].url == "https://a.example/"
    assert [d.key_path for d in outcome.find("unknown-key")] == ["subscription.a.colour"]
    assert [d.key_path for d in outcome.find("unknown-block")] == ["subscription.a.inner"]


def test_the_section_is_no_longer_reported_as_unsupported():
    outcome = run("subscription {\n    a: 'https://a.example/'\n}\n")
    assert outcome.find("not-yet-supported") == []


# --- global.store_subscribe ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"), [("", True), ("store_subscribe: false", False), ("store_subscribe: true", True)]
)
def test_store_subscribe_defaults_to_true(text, expected):
    outcome = run(f"global {{\n    {text}\n}}\n")
    assert outcome.spec is not None and outcome.spec.global_.store_subscribe is expected
    assert outcome.find("unknown-key") == []


def test_store_subscribe_in_toml_must_be_a_boolean():
    outcome = run("[global]\nstore_subscribe = 'maybe'\n", "toml")
    (d,) = outcome.find("invalid-type")
    assert (d.key_path, d.loc.line) == ("global.store_subscribe", 2)


# --- structured formats ----------------------------------------------------------------------

DAE = """\
global {
    store_subscribe: false
}
subscription {
    paid: 'https://paid.example/sub'
    backup: {
        url: 'https://backup.example/sub'
        ua: 'clash'
        interval: 1h
        cache: false
    }
}
"""
TOML = """\
[global]
store_subscribe = false

[subscription]
paid = "https://paid.example/sub"

[subscription.backup]
url = "https://backup.example/sub"
ua = "clash"
interval = "1h"
cache = false
"""
TOML_LIST = """\
global = { store_subscribe = false }

[[subscription]]
name = "paid"
url = "https://paid.example/sub"

[[subscription]]
name = "backup"
url = "https://backup.example/sub"
user_agent = "clash"
update_interval = 3600
cache = false
"""
JSON = """\
{
  "global": {"store_subscribe": false},
  "subscription": {
    "paid": "https://paid.example/sub",
    "backup": {"url": "https://backup.example/sub", "ua": "clash", "interval": 3600, "cache": false}
  }
}
"""


def test_dae_toml_and_json_mean_the_same_subscriptions():
    expected = run(DAE).spec
    assert expected is not None and len(expected.subscriptions) == 2
    for text, fmt in ((TOML, "toml"), (TOML_LIST, "toml"), (JSON, "json")):
        got = run(text, fmt).spec
        assert got == expected, fmt


def test_structured_list_entries_need_a_name_and_never_take_the_host():
    outcome = run(
        '[[subscription]]\nurl = "https://h.example/sub"\n\n[[subscription]]\nname = ""\nurl = "https://h.example/x"\n',
        "toml",
    )
    assert outcome.error is not None
    missing, empty = outcome.find("missing-value"), outcome.find("invalid-value")
    assert [(d.key_path, d.loc.line) for d in missing] == [("subscription[0]", 1)]
    assert [(d.key_path, d.loc.line) for d in empty] == [("subscription[1]", 4)]


def test_structured_errors_name_the_key_and_line():
    outcome = run('[subscription.paid]\nurl = "https://h.example/sub"\nua = 3\ncolour = 1\n', "toml")
    assert outcome.error is not None
    assert [(d.code, d.key_path, d.loc.line) for d in outcome.diagnostics] == [
        ("invalid-type", "subscription.paid.ua", 3),
        ("unknown-key", "subscription.paid.colour", 4),
    ]
    outcome = run('{"subscription": {"paid": {"url": "ftp://h.example/sub"}}}', "json")
    (d,) = outcome.find("invalid-subscription-url")
    assert (d.key_path, d.loc.line) == ("subscription.paid.url", 1)


# --- groups that take subscription nodes --------------------------------------------------------


def test_a_default_naming_a_future_subscription_node_is_accepted_when_subscriptions_exist():
    group = "group {\n    proxy {\n        filter: subtag(paid)\n        default: 'HK-01'\n    }\n}\n"
    without = run(group)
    assert [d.code for d in without.diagnostics if d.severity is Severity.ERROR] == ["unknown-default"]
    with_subs = run("subscription {\n    paid: 'https://paid.example/'\n}\n" + group)
    assert with_subs.spec is not None and with_subs.spec.group("proxy").default == "HK-01"


# --- fuzz --------------------------------------------------------------------------------------

_PIECES = st.sampled_from(
    [
        "'",
        '"',
        ":",
        "(",
        ")",
        "#",
        " ",
        "{",
        "}",
        "\n",
        "https://",
        "http://",
        "h.example",
        "/sub",
        "paid",
        "url:",
        "ua:",
        "interval:",
        "cache:",
        "0",
        "1h",
        "false",
        "\\",
        "[::1]",
        ":8080",
        "?a=(b)#c",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=30).map("".join))
def test_arbitrary_subscription_entries_load_or_raise_config_error(body):
    try:
        spec = load_text(f"subscription {{\n    {body}\n}}\n", "dae")
    except ConfigError as exc:
        assert exc.errors
        return
    for sub in spec.subscriptions:
        assert sub.name and sub.url.lower().startswith(("http://", "https://"))


def test_a_detour_names_the_node_or_group_downloads_go_through():
    (spec,) = subs(
        "node {\n    up: 'socks5://127.0.0.1:1080'\n}\n"
        "subscription {\n    paid: {\n        url: 'https://sub.example/a'\n        detour: up\n    }\n}\n"
    )
    assert spec.detour == "up"
    (plain,) = subs("subscription {\n    paid: 'https://sub.example/a'\n}\n")
    assert plain.detour is None  # direct


def test_a_detour_naming_no_outbound_is_a_located_error():
    outcome = run(
        "subscription {\n    paid: {\n        url: 'https://sub.example/a'\n        detour: nowhere\n    }\n}\n",
        "dae",
    )
    assert outcome.spec is None
    (error,) = [d for d in outcome.diagnostics if d.severity is Severity.ERROR]
    assert error.code == "unknown-outbound" and error.loc.line == 4 and "nowhere" not in str(error)


def test_a_structured_detour_means_the_same():
    toml = (
        '[node]\nup = "socks5://127.0.0.1:1080"\n'
        '[[subscription]]\nname = "paid"\nurl = "https://sub.example/a"\ndetour = "up"\n'
    )
    (spec,) = subs(toml, "toml")
    assert spec.detour == "up"
