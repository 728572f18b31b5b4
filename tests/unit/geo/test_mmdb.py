"""MaxMind/DB-IP ``.mmdb`` country databases as geoip data: honk.geo.mmdb walks the search tree
into a country's networks, honk.geo.assets finds the file (``geoip:`` without a geoip.dat, or
``ext:"file.mmdb:cn"``), and routing and ``honk check`` use it as they use a geoip.dat list."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import maxminddb
import pytest
from helpers.geodata import geoip_bytes
from helpers.mmdb import mmdb_bytes, write_mmdb

from honk.config.diagnostics import ConfigError
from honk.config.load import load_text
from honk.config.spec import MatchArg, Predicate, RuleSpec
from honk.core.net import Address, FlowMeta, Network
from honk.geo import assets, mmdb
from honk.geo.assets import GEOIP_MMDB_FILES, GeoAssets
from honk.geo.dat import GeoDataError
from honk.route.matchers import geodata_files
from honk.route.router import NeedsResolution, Router

RULES = """global {{
    data_dir: {data_dir}
}}
node {{
    proxy: 'socks5://192.0.2.1:1080'
}}
routing {{
    dip(geoip:private) -> direct
    dip({arg}) -> direct
    fallback: proxy
}}
"""

CN_V4 = ("1.0.1.0/24", "1.0.8.0/21", "36.96.0.0/11")
CN_V6 = ("240e::/20",)


@pytest.fixture
def isolated(no_geodata: Path) -> Path:
    return no_geodata


def _spec(data: Path, arg: str = "geoip:cn"):
    return load_text(RULES.format(data_dir=data, arg=arg), "dae")


def _route(spec, host: str) -> str:
    router = Router.compile(spec.routing, GeoAssets(spec.global_.data_dir))
    meta = FlowMeta(Network.TCP, Address("192.168.1.10", 50000), Address(host, 443), "lan")
    decision = router.route(meta)
    if isinstance(decision, NeedsResolution):
        decision = router.route(meta, start=decision.rule_index, resolution_failed=True)
    return decision.outbound


def _nets(*cidrs: str) -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return {ipaddress.ip_network(c) for c in cidrs}


@pytest.mark.parametrize("record_size", [24, 28, 32])
@pytest.mark.parametrize("mode", [maxminddb.MODE_MEMORY, maxminddb.MODE_AUTO])
def test_the_test_writer_produces_what_the_maxminddb_library_reads(
    tmp_path: Path, record_size: int, mode: int
) -> None:
    path = write_mmdb(tmp_path / "Country.mmdb", record_size=record_size)
    with maxminddb.open_database(str(path), mode) as reader:
        meta = reader.metadata()
        assert (meta.ip_version, meta.record_size, meta.database_type) == (6, record_size, "GeoLite2-Country")
        assert reader.get("1.0.1.7")["country"]["iso_code"] == "CN"
        assert reader.get("240e:1::1")["country"]["iso_code"] == "CN"
        assert reader.get("2600:1::1")["country"]["names"]["en"] == "United States"
        assert reader.get("::ffff:8.8.8.8")["country"]["iso_code"] == "US"  # the IPv4-mapped alias
        assert reader.get("2002:8501:0101::1")["country"]["iso_code"] == "JP"  # 6to4 of 133.1.1.1
        assert reader.get("45.76.1.1")["registered_country"]["iso_code"] == "US"
        assert reader.get("9.9.9.9") is None
        record, prefix = reader.get_with_prefix_len("1.0.8.9")
        assert prefix == 21 and record["country"]["iso_code"] == "CN"


def test_an_mmdb_country_code_routes_its_networks_direct(isolated: Path) -> None:
    write_mmdb(isolated / "var" / "Country.mmdb")  # no geoip.dat anywhere
    spec = _spec(isolated / "var")
    assert _route(spec, "1.0.1.20") == "direct"
    assert _route(spec, "36.100.0.1") == "direct"
    assert _route(spec, "240e:3b4::8") == "direct"
    assert _route(spec, "::ffff:1.0.9.1") == "direct"  # an IPv4-mapped address is its IPv4 address
    assert _route(spec, "8.8.8.8") == "proxy"
    assert _route(spec, "2600::1") == "proxy"
    assert _route(spec, "9.9.9.9") == "proxy"  # in no network of the file
    assert _route(spec, "10.1.2.3") == "direct"  # the built-in private set, as ever


def test_a_country_is_its_networks_once_each_ipv4_as_ipv4_and_the_aliases_skipped(isolated: Path) -> None:
    write_mmdb(isolated / "data" / "geoip.mmdb")
    listed = GeoAssets(str(isolated / "data")).networks("CN")
    assert sorted(map(str, listed.networks)) == sorted(CN_V4 + CN_V6)
    assert not listed.reverse


def test_the_country_decides_not_the_registered_country(isolated: Path) -> None:
    geo = GeoAssets(str(write_mmdb(isolated / "data" / "Country.mmdb").parent))
    assert ipaddress.ip_network("45.76.0.0/16") in geo.networks("jp").networks
    assert ipaddress.ip_network("45.76.0.0/16") not in geo.networks("us").networks


def test_a_geoip_dat_wins_over_an_mmdb_and_the_mmdb_names_go_in_order(isolated: Path) -> None:
    data = isolated / "data"
    write_mmdb(data / "dbip-country-lite.mmdb", [("192.0.2.0/24", "CN")])
    assert set(GeoAssets(str(data)).networks("cn").networks) == _nets("192.0.2.0/24")
    write_mmdb(data / "Country.mmdb")
    assert set(GeoAssets(str(data)).networks("cn").networks) == _nets(*CN_V4, *CN_V6)
    (data / "geoip.dat").write_bytes(geoip_bytes({"CN": (["198.51.100.0/24"], False)}))
    assert set(GeoAssets(str(data)).networks("cn").networks) == _nets("198.51.100.0/24")


def test_ext_names_a_country_of_an_mmdb_file_in_any_case_or_by_absolute_path(isolated: Path) -> None:
    data = isolated / "var"
    write_mmdb(data / "MyCountries.mmdb")
    write_mmdb(isolated / "elsewhere.mmdb", [("203.0.113.0/24", "JP")])
    spec = _spec(data, 'ext:"MyCountries.mmdb:CN"')
    assert _route(spec, "1.0.1.1") == "direct" and _route(spec, "8.8.8.8") == "proxy"
    geo = GeoAssets(str(data))
    assert set(geo.networks(f"{isolated / 'elsewhere.mmdb'}:jp", ext=True).networks) == _nets(
        "203.0.113.0/24"
    )
    with pytest.raises(GeoDataError, match="not domain lists") as info:
        geo.domains("MyCountries.mmdb:cn", ext=True)
    assert info.value.code == "geodata-invalid-code"


def test_an_unknown_country_code_is_an_error_naming_the_file(isolated: Path) -> None:
    path = write_mmdb(isolated / "data" / "Country.mmdb")
    geo = GeoAssets(str(path.parent))
    for _ in range(2):  # before and after a walk has learned every code the file has
        with pytest.raises(GeoDataError, match="no network with the country code 'xx'") as info:
            geo.networks("xx")
        assert info.value.code == "geodata-unknown-code" and str(path) in str(info.value)
        geo.networks("cn")


def test_a_missing_mmdb_is_an_error_naming_every_place_searched(isolated: Path) -> None:
    geo = GeoAssets(str(isolated / "data"))
    with pytest.raises(GeoDataError) as info:
        geo.networks("absent.mmdb:cn", ext=True)
    assert info.value.code == "geodata-missing"
    assert str(info.value).startswith("absent.mmdb not found; looked in ") and str(isolated / "data") in str(
        info.value
    )
    with pytest.raises(GeoDataError) as info:
        geo.networks("cn")
    assert info.value.code == "geodata-missing"
    assert str(info.value).startswith(f"geoip.dat not found (nor {', '.join(GEOIP_MMDB_FILES)}); looked in")


def test_an_unreadable_mmdb_is_a_typed_error_naming_the_file(isolated: Path) -> None:
    data = isolated / "data"
    data.mkdir()
    (data / "Country.mmdb").write_bytes(b"not a database at all")
    with pytest.raises(GeoDataError) as info:
        GeoAssets(str(data)).networks("cn")
    assert info.value.code == "geodata-unreadable" and str(data / "Country.mmdb") in str(info.value)
    whole = mmdb_bytes()
    tree_end = whole.index(bytes(16))  # the search tree, cut short under intact metadata
    (data / "Country.mmdb").write_bytes(whole[: tree_end // 2] + whole[tree_end:])
    os.utime(data / "Country.mmdb", ns=(5, 5))
    with pytest.raises(GeoDataError) as info:
        GeoAssets(str(data)).networks("cn")
    assert info.value.code == "geodata-unreadable"


def test_an_mmdb_is_read_once_per_content_and_a_code_walked_once(isolated: Path, monkeypatch) -> None:
    path = write_mmdb(isolated / "data" / "Country.mmdb")
    reads: list[int] = []
    walks: list[object] = []
    real_read, real_walk = assets.read_mmdb, mmdb.MmdbCountries._walk
    monkeypatch.setattr(
        assets, "read_mmdb", lambda data, name: reads.append(len(data)) or real_read(data, name)
    )
    monkeypatch.setattr(
        mmdb.MmdbCountries, "_walk", lambda self, code: walks.append(code) or real_walk(self, code)
    )
    first = GeoAssets(str(path.parent)).networks("CN")
    assert GeoAssets(str(path.parent)).networks("cn") is first  # honk check, then the router's compile
    GeoAssets(str(path.parent)).networks("jp")
    assert (len(reads), walks) == (1, ["cn", "jp"])
    write_mmdb(path, [("192.0.2.0/24", "CN")])
    os.utime(path, ns=(9, 9))  # a new mtime even on a coarse clock
    assert set(GeoAssets(str(path.parent)).networks("cn").networks) == _nets("192.0.2.0/24")
    assert len(reads) == 2


def test_the_pure_python_and_c_readers_give_the_same_networks_as_their_own_lookups(tmp_path: Path) -> None:
    path = write_mmdb(tmp_path / "Country.mmdb", record_size=28)
    data = path.read_bytes()
    modes = [maxminddb.MODE_MEMORY] + ([maxminddb.MODE_MMAP_EXT] if _has_extension() else [])
    probes = [
        ipaddress.ip_address(a)
        for a in (
            "1.0.1.1",
            "1.0.15.255",
            "1.0.16.0",
            "36.127.255.255",
            "8.8.8.8",
            "45.76.9.9",
            "133.1.2.3",
            "9.9.9.9",
            "240e::1",
            "240e:fff:ffff::1",
            "2400:4000::5",
            "2600::1",
            "2001:db8::1",
        )
    ]
    answers = []
    for mode in modes:
        with maxminddb.open_database(str(path), mode) as reader:
            countries = mmdb.MmdbCountries(data, reader)
            compiled = {code: countries.networks(code) for code in ("cn", "us", "jp")}
            for ip in probes:
                looked_up = mmdb.country_code(reader.get(ip))
                inside = [c for c, nets in compiled.items() if any(ip in n for n in nets)]
                assert inside == ([looked_up] if looked_up else []), (mode, ip)
            answers.append(compiled)
    assert all(a == answers[0] for a in answers)


def _has_extension() -> bool:
    try:
        import maxminddb.extension  # noqa: F401
    except ImportError:
        return False
    return True


def test_an_ipv4_only_database_answers_ipv4_networks(isolated: Path) -> None:
    write_mmdb(
        isolated / "data" / "geoip.mmdb", [(c, "CN") for c in CN_V4] + [("8.8.8.0/24", "US")], ip_version=4
    )
    assert set(GeoAssets(str(isolated / "data")).networks("cn").networks) == _nets(*CN_V4)


def test_honk_check_accepts_an_mmdb_backed_geoip_and_refuses_a_code_it_lacks(isolated: Path) -> None:
    data = write_mmdb(isolated / "var" / "Country.mmdb").parent
    assert _spec(data).routing is not None
    with pytest.raises(ConfigError) as info:
        _spec(data, "geoip:zz")
    [problem] = [d for d in info.value.diagnostics if d.code == "geodata-unknown-code"]
    assert problem.key_path == "routing.rules[1]" and str(data / "Country.mmdb") in problem.message


def test_a_reload_sees_an_mmdb_appear_or_change(isolated: Path) -> None:
    data = isolated / "var"
    data.mkdir()
    names = geodata_files([RuleSpec((Predicate("dip", (MatchArg("geoip", "cn"),)),), "direct")])
    assert names[0] == "geoip.dat" and set(GEOIP_MMDB_FILES) <= set(names)
    geo = GeoAssets(str(data))
    before = geo.stamp(names)
    path = write_mmdb(data / "Country.mmdb")
    appeared = geo.stamp(names)
    write_mmdb(path, [("192.0.2.0/24", "CN")])
    os.utime(path, ns=(11, 11))
    assert len({before, appeared, geo.stamp(names)}) == 3
