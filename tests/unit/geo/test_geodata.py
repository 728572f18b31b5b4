"""Reading v2fly geodata and answering codes: honk.geo.dat and honk.geo.assets."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
from helpers.geodata import geoip_bytes, geosite_bytes, write_geodata

from honk.geo import assets, dat
from honk.geo.assets import ASSET_ENV, GeoAssets
from honk.geo.dat import GeoDataError


@pytest.fixture
def no_assets(no_geodata: Path) -> Path:
    return no_geodata


def test_a_hand_encoded_geosite_list_decodes_by_the_v2ray_field_numbers() -> None:
    # GeoSiteList{entry=1: GeoSite{country_code=1: "CN", domain=2: Domain{type=1: 2, value=2: "a.cn",
    # attribute=3: {key=1: "ads", bool_value=2: true}}}}, written byte by byte from the wire format
    domain = b"\x08\x02" + b"\x12\x04a.cn" + b"\x1a\x07\x0a\x03ads\x10\x01"
    site = b"\x0a\x02CN" + b"\x12" + bytes([len(domain)]) + domain
    data = b"\x0a" + bytes([len(site)]) + site
    entry = dat.read_geosite(data)["cn"]
    assert [(d.type, d.value, [a.key for a in d.attribute]) for d in entry.domain] == [
        (dat.DOMAIN, "a.cn", ["ads"])
    ]


def test_a_hand_encoded_geoip_list_decodes_by_the_v2ray_field_numbers() -> None:
    # GeoIPList{entry=1: GeoIP{country_code=1: "JP", cidr=2: CIDR{ip=1: 192.0.2.0, prefix=2: 24},
    # reverse_match=3: true}}
    cidr = b"\x0a\x04\xc0\x00\x02\x00" + b"\x10\x18"
    geoip = b"\x0a\x02JP" + b"\x12" + bytes([len(cidr)]) + cidr + b"\x18\x01"
    data = b"\x0a" + bytes([len(geoip)]) + geoip
    entry = dat.read_geoip(data)["jp"]
    assert (bytes(entry.cidr[0].ip), entry.cidr[0].prefix, entry.reverse_match) == (
        bytes([192, 0, 2, 0]),
        24,
        True,
    )


def test_a_geosite_code_splits_its_domains_by_how_they_match(no_assets: Path) -> None:
    write_geodata(no_assets / "data")
    listed = GeoAssets(str(no_assets / "data")).domains("cn")
    assert listed.suffixes == ("example.cn", "cn-shop.example")
    assert listed.full == ("www.cn-portal.example",)
    assert listed.keywords == ("cnkeyword",)
    assert listed.regexes == (r"^cdn[0-9]+\.cn-video\.example$",)


def test_codes_and_attributes_compare_case_insensitively_and_every_attribute_must_be_present(
    no_assets: Path,
) -> None:
    geo = GeoAssets(str(write_geodata(no_assets / "data")))
    assert geo.domains("Category-Ads-All@ADS").suffixes == ("ads.example",)
    assert geo.domains("category-ads-all@ads").full == ("pixel.cn-shop.example",)
    assert geo.domains("category-ads-all@ads@cn") == assets.DomainList(full=("pixel.cn-shop.example",))
    with pytest.raises(GeoDataError, match="attribute 'nothing'") as info:
        geo.domains("category-ads-all@nothing")
    assert info.value.code == "geodata-unknown-code"


def test_a_missing_file_names_every_place_searched_in_order(no_assets: Path, monkeypatch) -> None:
    monkeypatch.setenv(ASSET_ENV, str(no_assets / "env"))
    geo = GeoAssets(str(no_assets / "data"))
    with pytest.raises(GeoDataError) as info:
        geo.domains("cn")
    assert info.value.code == "geodata-missing"
    searched = str(info.value).split("looked in ", 1)[1].split(", ")
    assert searched == [
        str(no_assets / "env"),
        str(no_assets / "data"),
        str(no_assets),
        str(no_assets / "honk-share"),
        str(no_assets / "xdg" / "dae"),
        str(no_assets / "system"),
    ]


def test_the_first_directory_that_holds_the_file_wins(no_assets: Path, monkeypatch) -> None:
    env = no_assets / "env"
    env.mkdir()
    (env / "geosite.dat").write_bytes(geosite_bytes({"CN": [(dat.FULL, "from-env.example", ())]}))
    write_geodata(no_assets / "data")
    monkeypatch.setenv(ASSET_ENV, str(env))
    assert GeoAssets(str(no_assets / "data")).domains("cn").full == ("from-env.example",)
    monkeypatch.delenv(ASSET_ENV)
    assert GeoAssets(str(no_assets / "data")).domains("cn").full == ("www.cn-portal.example",)


def test_an_unknown_code_and_a_malformed_file_are_typed_errors(no_assets: Path) -> None:
    data = write_geodata(no_assets / "data")
    geo = GeoAssets(str(data))
    with pytest.raises(GeoDataError, match="no list 'xx'") as info:
        geo.networks("xx")
    assert info.value.code == "geodata-unknown-code"
    (data / "geosite.dat").write_bytes(b"\x0a\xff\xff\xff")  # a length past the end
    with pytest.raises(GeoDataError) as info:
        geo.domains("cn")
    assert info.value.code == "geodata-unreadable" and str(data / "geosite.dat") in str(info.value)


def test_a_geoip_code_gives_its_networks_and_a_reverse_list_says_so(no_assets: Path) -> None:
    geo = GeoAssets(str(write_geodata(no_assets / "data")))
    cn = geo.networks("CN")
    assert cn.networks == (ipaddress.ip_network("198.51.100.0/24"), ipaddress.ip_network("2001:db8:cc::/48"))
    assert not cn.reverse
    assert geo.networks("not-cn").reverse


def test_ext_codes_read_a_named_file_in_the_same_directories_or_an_absolute_path(no_assets: Path) -> None:
    data = no_assets / "data"
    data.mkdir()
    (data / "mysite.dat").write_bytes(geosite_bytes({"games": [(dat.DOMAIN, "play.example", ())]}))
    (no_assets / "abs-ip.dat").write_bytes(geoip_bytes({"office": (["192.0.2.0/28"], False)}))
    geo = GeoAssets(str(data))
    assert geo.domains("mysite.dat:games", ext=True).suffixes == ("play.example",)
    assert geo.networks(f"{no_assets / 'abs-ip.dat'}:office", ext=True).networks == (
        ipaddress.ip_network("192.0.2.0/28"),
    )
    with pytest.raises(GeoDataError) as info:
        geo.domains("no-tag", ext=True)
    assert info.value.code == "geodata-invalid-code"


def test_a_file_is_parsed_once_per_content_and_again_after_it_changes(no_assets: Path, monkeypatch) -> None:
    data = write_geodata(no_assets / "data")
    parsed: list[int] = []
    real = assets.read_geosite
    monkeypatch.setattr(assets, "read_geosite", lambda raw: parsed.append(len(raw)) or real(raw))
    geo = GeoAssets(str(data))
    geo.domains("cn")
    GeoAssets(str(data)).domains("category-ads-all")
    assert len(parsed) == 1
    path = data / "geosite.dat"
    path.write_bytes(geosite_bytes({"CN": [(dat.FULL, "new.example", ())]}))
    os.utime(path, ns=(1, 1))  # a new mtime even on a coarse clock
    assert geo.domains("cn").full == ("new.example",)
    assert len(parsed) == 2


def test_a_code_is_split_into_its_list_once_per_file_content(no_assets: Path) -> None:
    """honk check and the router's compile ask for the same codes: the second answer is the
    first one, until the file changes."""
    data = write_geodata(no_assets / "data")
    first = GeoAssets(str(data)).domains("CN")
    assert GeoAssets(str(data)).domains("cn") is first
    assert GeoAssets(str(data)).networks("cn") is GeoAssets(str(data)).networks("CN")
    (data / "geosite.dat").write_bytes(geosite_bytes({"CN": [(dat.FULL, "new.example", ())]}))
    os.utime(data / "geosite.dat", ns=(3, 3))
    assert GeoAssets(str(data)).domains("cn") is not first
