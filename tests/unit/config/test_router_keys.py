"""The router's global keys (upstream's global reference): LAN and WAN interfaces, the
transparent port, the socket mark, dial mode, sniffing timeout and kernel parameters;
defaults, both syntaxes, and located refusals."""

from __future__ import annotations

import pytest

from honk.config.diagnostics import ConfigError
from honk.config.load import load_text
from honk.config.spec import DEFAULT_SNIFFING_TIMEOUT, DEFAULT_TPROXY_PORT, GlobalSpec


def test_defaults_install_no_interception():
    glob = GlobalSpec()
    assert glob.lan_interface == () and glob.wan_interface == ()
    assert (glob.tproxy_port, glob.dial_mode, glob.auto_config_kernel_parameter) == (
        DEFAULT_TPROXY_PORT,
        "domain",
        False,
    )
    assert glob.tproxy_port == 12345 and glob.sniffing_timeout == DEFAULT_SNIFFING_TIMEOUT == 0.030


def test_dae_and_toml_spell_the_same_router():
    dae = load_text(
        "global {\n    lan_interface: br-lan, eth1\n    wan_interface: auto\n    tproxy_port: 7893\n"
        "    dial_mode: domain++\n    sniffing_timeout: 100ms\n    auto_config_kernel_parameter: true\n"
        "    so_mark_from_dae: 0x100\n}\n",
        "dae",
    ).global_
    toml = load_text(
        '[global]\nlan_interface = ["br-lan", "eth1"]\nwan_interface = "auto"\ntproxy_port = 7893\n'
        'dial_mode = "domain++"\nsniffing_timeout = "100ms"\nauto_config_kernel_parameter = true\n'
        "so_mark_from_dae = 256\n",
        "toml",
    ).global_
    assert dae == toml
    assert dae.lan_interface == ("br-lan", "eth1") and dae.wan_interface == ("auto",)
    assert (dae.tproxy_port, dae.dial_mode, dae.sniffing_timeout, dae.so_mark_from_dae) == (
        7893,
        "domain++",
        0.1,
        0x100,
    )


@pytest.mark.parametrize(
    ("line", "key", "words"),
    [
        ("tproxy_port: 70000", "global.tproxy_port", "port number"),
        ("dial_mode: fast", "global.dial_mode", "ip, domain, domain+, domain++"),
        ("so_mark_from_dae: 0x08000000", "global.so_mark_from_dae", "tproxy mark"),
        ("so_mark_from_dae: lots", "global.so_mark_from_dae", "hexadecimal"),
    ],
)
def test_a_bad_value_is_a_located_error(line, key, words):
    with pytest.raises(ConfigError) as caught:
        load_text(f"global {{\n    {line}\n}}\n", "dae")
    [error] = caught.value.errors
    assert error.key_path == key and words in error.message and error.loc.line == 2
