"""Small geodata files the tests build themselves from the v2fly protobuf schema
(``GeoSiteList``/``GeoIPList``, as honk.geo.dat declares them), in the shapes the real
``geosite.dat`` (v2fly domain-list-community) and ``geoip.dat`` (v2fly/geoip) have: lists by
code, domains typed plain/regex/domain/full with attributes such as ``@ads`` or ``@cn``, CIDRs
as packed addresses with a prefix length."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from pathlib import Path

from honk.geo import dat

SITES: dict[str, list[tuple[int, str, tuple[str, ...]]]] = {
    # modelled on dlc's cn and category-ads-all: suffixes, a full name, a keyword, a regex, attributes
    "CN": [
        (dat.DOMAIN, "example.cn", ()),
        (dat.DOMAIN, "cn-shop.example", ()),
        (dat.FULL, "www.cn-portal.example", ()),
        (dat.PLAIN, "cnkeyword", ()),
        (dat.REGEX, r"^cdn[0-9]+\.cn-video\.example$", ()),
    ],
    "CATEGORY-ADS-ALL": [
        (dat.DOMAIN, "ads.example", ("ads",)),
        (dat.DOMAIN, "tracker.example", ()),
        (dat.FULL, "pixel.cn-shop.example", ("ads", "cn")),
    ],
    "CATEGORY-ADS": [(dat.DOMAIN, "ads.example", ())],
    "GEOLOCATION-!CN": [(dat.DOMAIN, "example.org", ())],
    # more codes the corpus cases name, as users' configurations do
    "CATEGORY-AI-!CN": [(dat.DOMAIN, "ai.example", ())],
    "GOOGLE": [(dat.DOMAIN, "google.example", ()), (dat.DOMAIN, "google.example.cn", ("cn",))],
    "GITHUB": [(dat.DOMAIN, "git.example", ())],
    "CATEGORY-DOH": [(dat.FULL, "doh.example", ())],
    "YOUTUBE": [(dat.DOMAIN, "video.example", ())],
    "TELEGRAM": [(dat.DOMAIN, "chat.example", ())],
    "PRIVATE": [(dat.DOMAIN, "lan", ()), (dat.DOMAIN, "local", ())],
    "CATEGORY-RU": [(dat.DOMAIN, "example.ru", ())],
    "NETFLIX": [(dat.DOMAIN, "films.example", ())],
    "APPLE-CN": [(dat.DOMAIN, "apple.example.cn", ())],
    "GEOLOCATION-CN": [(dat.DOMAIN, "example.cn", ())],
    "CATEGORY-GAMES": [(dat.DOMAIN, "games.example", ()), (dat.DOMAIN, "games.example.cn", ("cn",))],
    "STEAM": [(dat.DOMAIN, "steam.example", ()), (dat.DOMAIN, "steam.example.cn", ("cn",))],
    "MICROSOFT": [(dat.DOMAIN, "ms.example", ()), (dat.DOMAIN, "ms.example.cn", ("cn",))],
    "ONEDRIVE": [(dat.DOMAIN, "drive.example", ())],
    "OPENAI": [(dat.DOMAIN, "chat-ai.example", ())],
    "BILIBILI": [(dat.DOMAIN, "video.example.cn", ())],
}
IPS: dict[str, tuple[list[str], bool]] = {
    "CN": (["198.51.100.0/24", "2001:db8:cc::/48"], False),
    "PRIVATE": (["10.0.0.0/8"], False),  # a file's own "private" never replaces the built-in set
    "NOT-CN": (["198.51.100.0/24"], True),  # reverse_match: everything outside
    "TELEGRAM": (["203.0.113.0/26"], False),
    "JP": (["203.0.113.64/26"], False),
    "LAN": (["192.168.0.0/16"], False),
}


def geosite_bytes(sites: Mapping[str, Sequence[tuple[int, str, tuple[str, ...]]]] = SITES) -> bytes:
    out = dat.GeoSiteList()
    for code, domains in sites.items():
        entry = out.entry.add(country_code=code)
        for kind, value, attrs in domains:
            domain = entry.domain.add(type=kind, value=value)
            for key in attrs:
                domain.attribute.add(key=key, bool_value=True)
    return out.SerializeToString()


def geoip_bytes(ips: Mapping[str, tuple[Sequence[str], bool]] = IPS) -> bytes:
    out = dat.GeoIPList()
    for code, (cidrs, reverse) in ips.items():
        entry = out.entry.add(country_code=code, reverse_match=reverse)
        for text in cidrs:
            net = ipaddress.ip_network(text)
            entry.cidr.add(ip=net.network_address.packed, prefix=net.prefixlen)
    return out.SerializeToString()


def write_geodata(directory: Path, *, site: bool = True, ip: bool = True) -> Path:
    """``geosite.dat`` and/or ``geoip.dat`` of :data:`SITES` / :data:`IPS` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    if site:
        (directory / "geosite.dat").write_bytes(geosite_bytes())
    if ip:
        (directory / "geoip.dat").write_bytes(geoip_bytes())
    return directory
