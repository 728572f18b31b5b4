"""The three formats describe one schema: equal meaning gives equal Specs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.geodata import write_geodata

from honk.config.load import load_file
from honk.config.spec import Policy

DATA = Path(__file__).parent / "data"
SECRET = "s3cretPW"


def _without_location(spec):
    return [(d.severity, d.code, d.key_path, d.message) for d in spec.diagnostics]


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:  # the geosite/geoip codes the files name
        patch.setenv("DAE_LOCATION_ASSET", str(write_geodata(tmp_path_factory.mktemp("geodata"))))
        return {ext: load_file(DATA / f"same.{ext}") for ext in ("dae", "toml", "json")}


def test_dae_toml_and_json_files_load_to_equal_specs(specs):
    assert specs["dae"] == specs["toml"]
    assert specs["dae"] == specs["json"]


def test_equal_specs_carry_equal_diagnostics_modulo_location(specs):
    expected = _without_location(specs["dae"])
    assert expected  # the fixture has one deliberate unknown key
    assert _without_location(specs["toml"]) == expected
    assert _without_location(specs["json"]) == expected
    # locations point into each file, on the line of the unknown key
    for ext, spec in specs.items():
        (d,) = spec.diagnostics
        assert d.loc.file.endswith(f"same.{ext}")
        assert d.loc.line == 16


def test_shared_spec_has_the_declared_settings(specs):
    spec = specs["dae"]
    g = spec.global_
    assert g.log_level == "debug"
    assert g.tcp_check_url == ("https://check.example/generate_204", "http://check2.example/ok")
    assert g.tcp_check_http_method == "GET"
    assert g.check_interval == 45.0
    assert g.check_tolerance == pytest.approx(0.080)
    assert g.connect_timeout == 2.0
    assert g.max_concurrent_dials == 32
    assert g.data_dir == os.path.join(str(DATA.resolve()), "var")
    assert (g.relay_idle_timeout, g.udp_idle_timeout, g.shutdown_grace) == (600.0, 90.0, 2.5)
    (inbound,) = spec.inbounds
    assert (inbound.name, inbound.kind, inbound.host, inbound.port) == ("lan", "mixed", "127.0.0.1", 7890)
    assert inbound.users[0].username == "alice" and inbound.users[0].password == SECRET
    assert [n.name for n in spec.nodes] == ["edge", "backup"]
    assert spec.node("edge").password == SECRET
    assert [g.name for g in spec.groups] == ["hk", "proxy", "spare"]
    assert spec.group("hk").policy is Policy.URLTEST
    assert spec.group("hk").tolerance == pytest.approx(0.080)  # global check_tolerance
    assert spec.group("proxy").subgroups == ("hk", "spare")
    assert spec.group("spare").has_filter_lines is False
    assert len(spec.routing.rules) == 12
    assert spec.routing.fallback == "proxy"
    assert spec.clash_api is not None and spec.clash_api.default_mode == "Global"
    assert spec.clash_api.secret == SECRET


def test_every_predicate_kind_is_covered_with_negation_and_must(specs):
    rules = specs["dae"].routing.rules
    kinds = {p.name for r in rules for p in r.predicates}
    assert kinds == {"domain", "dip", "sip", "dport", "sport", "l4proto", "ipversion", "pname", "mac", "dscp"}
    assert any(p.negated for r in rules for p in r.predicates)
    assert [r.must for r in rules].count(True) == 2


def test_repr_of_a_loaded_spec_hides_every_secret(specs):
    for spec in specs.values():
        assert SECRET not in repr(spec)
        assert all(SECRET not in str(d) for d in spec.diagnostics)


def test_shipped_demo_configs_mean_the_same_thing():
    """configs/demo.dae is documented as the same as configs/demo.toml."""
    from pathlib import Path

    from honk.config.load import load_file

    configs = Path(__file__).resolve().parents[3] / "configs"
    dae, toml = load_file(configs / "demo.dae"), load_file(configs / "demo.toml")
    assert dae == toml
    assert [i.port for i in toml.inbounds] == [7890]
    assert toml.clash_api is not None and toml.clash_api.external_controller == "127.0.0.1:9090"
    assert toml.global_.data_dir == str(configs.parent / "var")
    assert not [d for d in dae.diagnostics + toml.diagnostics if d.severity.value != "info"]
