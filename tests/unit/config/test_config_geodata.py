"""``honk check`` and routing with geodata: the codes a rule names are answered by the
geosite.dat/geoip.dat found from the configuration (honk.geo), or the rule is refused with its
key path and line; it never silently matches nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from config_helpers import run
from helpers.geodata import geoip_bytes, geosite_bytes, write_geodata

from honk.control.desired import lower
from honk.core.net import Address, FlowMeta, Network
from honk.geo import dat
from honk.geo.assets import GeoAssets
from honk.route.router import NeedsResolution, Router

RULES = """global {{
    data_dir: {data_dir}
}}
node {{
    proxy: 'socks5://192.0.2.1:1080'
}}
routing {{
    domain(geosite:category-ads-all) -> block
    domain(geosite:cn) -> direct
    dip(geoip:private) -> direct
    dip(geoip:cn) -> direct
    fallback: proxy
}}
"""


@pytest.fixture
def isolated(no_geodata: Path) -> Path:
    return no_geodata


def _route(spec, host: str) -> str:
    router = Router.compile(spec.routing, GeoAssets(spec.global_.data_dir))
    meta = FlowMeta(Network.TCP, Address("192.168.1.10", 50000), Address(host, 443), "lan")
    decision = router.route(meta)
    if isinstance(decision, NeedsResolution):  # a name past the domain rules: it resolves to nothing here
        decision = router.route(meta, start=decision.rule_index, resolution_failed=True)
    return decision.outbound


def test_china_bound_traffic_goes_direct_with_the_data_in_data_dir(isolated: Path) -> None:
    data = write_geodata(isolated / "var")
    spec = run(RULES.format(data_dir=data)).spec
    assert spec is not None
    assert _route(spec, "www.example.cn") == "direct"
    assert _route(spec, "198.51.100.20") == "direct"
    assert _route(spec, "x.ads.example") == "block"
    assert _route(spec, "example.org") == "proxy"
    assert _route(spec, "1.2.3.4") == "proxy"  # outside geoip:cn and the private set; never dialled


def test_a_missing_geosite_file_is_an_error_at_the_rule_naming_the_places_searched(isolated: Path) -> None:
    outcome = run(RULES.format(data_dir=isolated / "var"))
    assert outcome.spec is None
    missing = [d for d in outcome.diagnostics if d.code == "geodata-missing"]
    assert [(d.key_path, d.loc.line) for d in missing] == [
        ("routing.rules[0]", 8),
        ("routing.rules[1]", 9),
        ("routing.rules[3]", 11),
    ]
    assert "geosite.dat not found" in missing[0].message and str(isolated / "var") in missing[0].message
    assert "geoip.dat not found" in missing[2].message


def test_a_code_the_data_lacks_is_an_error_naming_the_file(isolated: Path) -> None:
    data = isolated / "var"
    data.mkdir()
    (data / "geosite.dat").write_bytes(geosite_bytes({"cn": [(dat.DOMAIN, "example.cn", ())]}))
    write_geodata(data, site=False)
    outcome = run(RULES.format(data_dir=data))
    [unknown] = [d for d in outcome.diagnostics if d.code == "geodata-unknown-code"]
    assert unknown.key_path == "routing.rules[0]"
    assert str(data / "geosite.dat") in unknown.message and "'category-ads-all'" in unknown.message


def test_geoip_private_needs_no_file(isolated: Path) -> None:
    spec = run("routing {\n    dip(geoip:private) -> direct\n    fallback: block\n}\n").spec
    assert spec is not None and _route(spec, "10.1.2.3") == "direct"


def test_a_reload_sees_changed_geodata_as_a_changed_route(isolated: Path) -> None:
    data = write_geodata(isolated / "var")
    spec = run(RULES.format(data_dir=data)).spec
    before = lower(spec).route
    assert before == lower(spec).route
    (data / "geosite.dat").write_bytes(
        geosite_bytes(
            {"cn": [(dat.DOMAIN, "other.cn", ())], "category-ads-all": [(dat.DOMAIN, "ads.example", ())]}
        )
    )
    os.utime(data / "geosite.dat", ns=(7, 7))
    after = lower(spec).route
    assert after != before and after.routing == before.routing


def test_ext_codes_route_by_lists_of_other_files_and_are_never_a_literal_suffix(isolated: Path) -> None:
    data = isolated / "var"
    data.mkdir()
    (data / "games.dat").write_bytes(geosite_bytes({"games": [(dat.DOMAIN, "play.example", ())]}))
    (data / "office.dat").write_bytes(geoip_bytes({"office": (["192.0.2.0/28"], False)}))
    text = (
        f'global {{\n    data_dir: {data}\n}}\nrouting {{\n    domain(ext:"games.dat:GAMES") -> direct\n'
        "    dip(ext:'office.dat:office') -> direct\n    fallback: block\n}\n"
    )
    spec = run(text).spec
    assert spec is not None
    [domain_arg] = spec.routing.rules[0].predicates[0].args
    assert (domain_arg.key, domain_arg.value) == ("ext", "games.dat:games")
    assert _route(spec, "eu.play.example") == "direct"
    assert _route(spec, "192.0.2.3") == "direct"
    assert _route(spec, "games.dat") == "block"  # once read as a suffix; never again
    missing = run(text.replace("office.dat:office", "absent.dat:office"))
    assert [d.code for d in missing.diagnostics if d.severity.name == "ERROR"] == ["geodata-missing"]
