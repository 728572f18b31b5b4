"""An API or a proxy anyone on the network can use is refused unless the file says so."""

from __future__ import annotations

import pytest
from config_helpers import run

from honk.core.net import is_loopback_listen

FALLBACK = "routing {\n    fallback: direct\n}\n"


def api(controller: str, extra: str = "") -> str:
    return (
        "experimental {\n    clash_api {\n"
        f"        external_controller: '{controller}'\n{extra}    }}\n}}\n" + FALLBACK
    )


def inbound(url: str) -> str:
    return f"inbound {{\n    lan: '{url}'\n}}\n" + FALLBACK


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_listen_addresses(host):
    assert is_loopback_listen(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.1", "10.0.0.1", "router.lan", "fe80::1"])
def test_addresses_other_hosts_reach(host):
    assert not is_loopback_listen(host)


@pytest.mark.parametrize("controller", ["0.0.0.0:9090", "[::]:9090", "192.168.1.1:9090"])
def test_a_non_loopback_api_without_a_secret_is_an_error_naming_the_key_and_line(controller):
    outcome = run(api(controller))
    assert outcome.error is not None
    [found] = outcome.find("open-api")
    assert found.key_path == "experimental.clash_api.external_controller"
    assert found.loc.line == 3
    assert "allow_unauthenticated" in found.message


def test_an_explicitly_open_api_loads_with_a_warning():
    outcome = run(api("0.0.0.0:9090", "        allow_unauthenticated: true\n"))
    assert outcome.error is None
    [found] = outcome.find("open-api")
    assert (
        found.severity.name == "WARNING" and found.key_path == "experimental.clash_api.allow_unauthenticated"
    )
    assert outcome.spec.clash_api.allow_unauthenticated is True


@pytest.mark.parametrize(
    "text", [api("127.0.0.1:9090"), api("[::1]:9090"), api("0.0.0.0:9090", "        secret: 'long-secret'\n")]
)
def test_a_loopback_api_or_one_with_a_secret_loads_silently(text):
    outcome = run(text)
    assert outcome.error is None and not outcome.find("open-api")


def test_a_mixed_inbound_on_the_lan_without_users_is_an_open_proxy_error():
    outcome = run(inbound("mixed://192.168.1.1:7890"))
    assert outcome.error is not None
    [found] = outcome.find("open-proxy")
    assert found.key_path == "inbound.lan" and found.loc.line == 2
    assert "?allow_unauthenticated=true" in found.message


def test_an_explicitly_open_proxy_loads_with_a_warning_and_users_or_loopback_need_nothing():
    outcome = run(inbound("mixed://0.0.0.0:7890?allow_unauthenticated=true"))
    assert outcome.error is None
    [found] = outcome.find("open-proxy")
    assert found.severity.name == "WARNING"
    assert outcome.spec.inbounds[0].allow_unauthenticated is True
    for url in ("mixed://user:pass@0.0.0.0:7890", "mixed://127.0.0.1:7890", "redirect://0.0.0.0:12345"):
        outcome = run(inbound(url))
        assert outcome.error is None and not outcome.find("open-proxy"), url


def test_an_inbound_url_parameter_other_than_the_open_switch_is_an_error():
    outcome = run(inbound("mixed://127.0.0.1:7890?allow_unauthenticated=maybe"))
    assert outcome.error is not None and outcome.find("invalid-bool")
    outcome = run(inbound("mixed://127.0.0.1:7890?udp=true"))
    assert outcome.error is not None and outcome.find("unknown-param")
