"""Geodata: loading a full-size geosite.dat and matching against its largest list.

    .venv/bin/python -m benchmarks.geodata [--quick]

The file is built here with the shape of the real ones (issue 34's targets): about 1,400 lists
and 180,000 entries, the largest (``cn``) 110,000 root domains like the China-domain lists users
load, keywords and regexes spread over the others, one entry in twenty with an attribute; about
4 MB. In a fresh process: the time to find, read and parse it and compile ``cn`` and
``category-ads-all`` into the router's domain matcher (target <= 2 s), the resident memory that
adds (<= 60 MB), and matcher lookups per second over a mix of listed and unlisted names, views
built beforehand as the router builds one per flow (>= 1,000,000/s).

Then a MaxMind DB (``Country.mmdb``, no geoip.dat) of GeoLite2-Country's size, built by the
tests' writer (tests/helpers/mmdb.py): 250,000 IPv4 and 50,000 IPv6 networks over about 240
countries, neighbours often of one country as real allocations are. The same three figures for
``dip(geoip: cn)``: load + walk the tree into cn's networks + compile (<= 5 s), the memory it
adds, and lookups of the compiled matcher; beside them, what a per-flow ``Reader.get`` of the
library (its C extension when installed) would give, the design not taken.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LISTS = 1_400
CN_DOMAINS = 110_000
OTHER_ENTRIES = 70_000
LOOKUPS = 400_000
LOAD_TARGET_S = 2.0
MEMORY_TARGET_MB = 60.0
LOOKUP_TARGET = 1_000_000.0
MMDB_V4_NETWORKS = 250_000
MMDB_V6_NETWORKS = 50_000
MMDB_LOOKUPS = 200_000
MMDB_LOAD_TARGET_S = 5.0
MMDB_MEMORY_TARGET_MB = 60.0
MMDB_LOOKUP_TARGET = 1_000_000.0
# how often a network takes its neighbour's country, and the big countries' shares
MMDB_SAME_AS_PREVIOUS = 0.5
MMDB_WEIGHTS = {"US": 25.0, "CN": 12.0, "JP": 6.0, "DE": 5.0, "GB": 4.0, "KR": 3.0, "BR": 3.0, "FR": 3.0}
MMDB_OTHER_COUNTRIES = 232


def _label(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(n))


def build(path: Path, seed: int = 34) -> int:
    """Write the synthetic geosite.dat; returns its size in bytes."""
    from honk.geo import dat

    rng = random.Random(seed)
    out = dat.GeoSiteList()
    cn = out.entry.add(country_code="CN")
    for _ in range(CN_DOMAINS):
        cn.domain.add(
            type=dat.DOMAIN,
            value=f"{_label(rng, rng.randint(4, 12))}.{rng.choice(['cn', 'com.cn', 'com', 'net'])}",
        )
    ads = out.entry.add(country_code="CATEGORY-ADS-ALL")
    for _ in range(3_000):
        ads.domain.add(type=dat.DOMAIN, value=f"{_label(rng, 8)}.ads{rng.randint(0, 99)}.example")
    for _ in range(40):
        ads.domain.add(type=dat.PLAIN, value=_label(rng, 6))
    for _ in range(20):
        ads.domain.add(type=dat.REGEX, value=rf"^{_label(rng, 4)}[0-9]+\.{_label(rng, 5)}\.example$")
    per_list = OTHER_ENTRIES // (LISTS - 2)
    kinds = [dat.DOMAIN] * 90 + [dat.FULL] * 6 + [dat.PLAIN] * 3 + [dat.REGEX]
    for i in range(LISTS - 2):
        site = out.entry.add(country_code=f"LIST-{i}")
        for _ in range(per_list):
            kind = rng.choice(kinds)
            value = (
                rf"^{_label(rng, 5)}\.example$"
                if kind == dat.REGEX
                else _label(rng, 7)
                if kind == dat.PLAIN
                else f"{_label(rng, 9)}.example"
            )
            domain = site.domain.add(type=kind, value=value)
            if rng.random() < 0.05:
                domain.attribute.add(key=rng.choice(["cn", "ads", "!cn"]), bool_value=True)
    data = out.SerializeToString()
    path.write_bytes(data)
    return len(data)


def build_mmdb(path: Path, seed: int = 34) -> int:
    """Write the synthetic Country.mmdb; returns its size in bytes."""
    import ipaddress

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers.mmdb import mmdb_bytes

    rng = random.Random(seed)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    codes = (
        list(MMDB_WEIGHTS)
        + [c for c in (a + b for a in letters for b in letters) if c not in MMDB_WEIGHTS][
            :MMDB_OTHER_COUNTRIES
        ]
    )
    weights = list(MMDB_WEIGHTS.values()) + [0.15] * MMDB_OTHER_COUNTRIES
    networks: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = []

    def fill(
        cursor: int,
        end: int,
        count: int,
        bits: int,
        shortest: int,
        longest: int,
        make: type[ipaddress.IPv4Network] | type[ipaddress.IPv6Network],
    ) -> None:
        previous = "US"
        made = 0
        while cursor < end and made < count:
            aligned = bits - ((cursor & -cursor).bit_length() - 1)  # the shortest prefix cursor starts
            prefix = max(aligned, rng.randint(shortest, longest))
            if rng.random() < 0.1:  # unallocated space between networks
                cursor += 1 << (bits - prefix)
                continue
            code = previous if rng.random() < MMDB_SAME_AS_PREVIOUS else rng.choices(codes, weights)[0]
            networks.append((make((cursor, prefix)), code))
            previous = code
            cursor += 1 << (bits - prefix)
            made += 1

    fill(1 << 24, 224 << 24, MMDB_V4_NETWORKS, 32, 16, 24, ipaddress.IPv4Network)
    fill(0x2001 << 112, 0x3000 << 112, MMDB_V6_NETWORKS, 128, 29, 48, ipaddress.IPv6Network)
    data = mmdb_bytes(networks)
    path.write_bytes(data)
    return len(data)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _child(directory: str, lookups: int) -> None:
    """In a fresh process: load, compile, look up; prints one JSON line."""
    from honk.config.spec import MatchArg, Predicate
    from honk.core.net import Address, FlowMeta, Network
    from honk.geo.assets import GeoAssets
    from honk.route.matchers import FlowView, compile_predicate

    before = _rss_mb()
    start = time.perf_counter()
    geo = GeoAssets(directory)
    matcher = compile_predicate(
        Predicate("domain", (MatchArg("geosite", "cn"), MatchArg("geosite", "category-ads-all"))), geo
    )
    loaded = time.perf_counter() - start
    grown = _rss_mb() - before
    listed = list(geo.domains("cn").suffixes[:2000])
    rng = random.Random(7)
    names = [
        f"www.{rng.choice(listed)}" if i % 2 else f"{_label(rng, 10)}.unlisted.example" for i in range(2000)
    ]
    views = [
        FlowView.of(FlowMeta(Network.TCP, Address("192.168.1.2", 40000), Address(n, 443), "lan"))
        for n in names
    ]
    hits = 0
    start = time.perf_counter()
    for i in range(lookups):
        hits += matcher.match(views[i % 2000])
    rate = lookups / (time.perf_counter() - start)
    print(
        json.dumps(
            {"load_s": loaded, "rss_mb": grown, "lookups_per_s": rate, "hits": hits, "lookups": lookups}
        )
    )


def _child_mmdb(directory: str, lookups: int) -> None:
    """In a fresh process: find Country.mmdb, walk cn, compile, look up; prints one JSON line."""
    import ipaddress

    import maxminddb

    from honk.config.spec import MatchArg, Predicate
    from honk.core.net import Address, FlowMeta, Network
    from honk.geo.assets import GeoAssets
    from honk.route.matchers import FlowView, compile_predicate

    before = _rss_mb()
    start = time.perf_counter()
    geo = GeoAssets(directory)
    matcher = compile_predicate(Predicate("dip", (MatchArg("geoip", "cn"),)), geo)
    loaded = time.perf_counter() - start
    grown = _rss_mb() - before
    cn = geo.networks("cn").networks
    rng = random.Random(7)
    addresses = []
    for i in range(2000):
        if i % 2:  # a listed address, else anywhere
            net = rng.choice(cn)
            addresses.append(str(net.network_address + rng.randrange(net.num_addresses)))
        else:
            addresses.append(str(ipaddress.IPv4Address(rng.randrange(1 << 24, 224 << 24))))
    views = [
        FlowView.of(FlowMeta(Network.TCP, Address("192.168.1.2", 40000), Address(a, 443), "lan"))
        for a in addresses
    ]
    hits = 0
    start = time.perf_counter()
    for i in range(lookups):
        hits += matcher.match(views[i % 2000])
    rate = lookups / (time.perf_counter() - start)
    ips = [v.dst_ip for v in views]
    with maxminddb.open_database(str(Path(directory) / "Country.mmdb")) as reader:  # the C extension if any
        start = time.perf_counter()
        for i in range(lookups):
            record = reader.get(ips[i % 2000])
            hits -= record is not None and record["country"]["iso_code"] == "CN"
        reader_rate = lookups / (time.perf_counter() - start)
        reader_kind = type(reader).__module__
    print(
        json.dumps(
            {
                "load_s": loaded,
                "rss_mb": grown,
                "lookups_per_s": rate,
                "networks": len(cn),
                "reader_per_s": reader_rate,
                "reader": reader_kind,
                "disagree": hits,
            }
        )
    )


def _measured(
    build_file: Callable[[Path], int], name: str, child_flag: str, lookups: int
) -> dict[str, float]:
    """Build ``name`` in a temporary directory, measure it in a fresh interpreter (its RSS is
    the data's alone) with ``child_flag``, and add the file's size."""
    with tempfile.TemporaryDirectory(prefix="honk-geodata-") as directory:
        size = build_file(Path(directory) / name)
        root = str(Path(__file__).resolve().parent.parent)
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.geodata", child_flag, directory, str(lookups)],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env=dict(os.environ, PYTHONPATH=root),
        )
        got = json.loads(out.stdout.strip().splitlines()[-1])
        got["file_mb"] = size / 1e6
        return got


def mmdb_figures(quick: bool = False) -> dict[str, float]:
    return _measured(build_mmdb, "Country.mmdb", "--child-mmdb", MMDB_LOOKUPS // 4 if quick else MMDB_LOOKUPS)


def figures(quick: bool = False) -> dict[str, float]:
    return _measured(build, "geosite.dat", "--child", LOOKUPS // 4 if quick else LOOKUPS)


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    print("geodata benchmark ...", file=sys.stderr, flush=True)
    f = figures(quick)
    m = mmdb_figures(quick)
    return [
        (
            f"load + compile a {f['file_mb']:.1f} MB geosite.dat",
            f"{f['load_s']:.2f} s",
            f"<= {LOAD_TARGET_S:.0f} s",
            "met" if f["load_s"] <= LOAD_TARGET_S else "NOT met",
        ),
        (
            "resident memory it adds",
            f"{f['rss_mb']:.0f} MB",
            f"<= {MEMORY_TARGET_MB:.0f} MB",
            "met" if f["rss_mb"] <= MEMORY_TARGET_MB else "NOT met",
        ),
        (
            "domain lookups (geosite:cn + category-ads-all)",
            f"{f['lookups_per_s']:,.0f}/s",
            f">= {LOOKUP_TARGET:,.0f}/s",
            "met" if f["lookups_per_s"] >= LOOKUP_TARGET else "NOT met",
        ),
        (
            f"load + walk + compile geoip:cn of a {m['file_mb']:.1f} MB Country.mmdb "
            f"({MMDB_V4_NETWORKS + MMDB_V6_NETWORKS:,} networks; cn {m['networks']:,})",
            f"{m['load_s']:.2f} s",
            f"<= {MMDB_LOAD_TARGET_S:.0f} s",
            "met" if m["load_s"] <= MMDB_LOAD_TARGET_S else "NOT met",
        ),
        (
            "resident memory it adds",
            f"{m['rss_mb']:.0f} MB",
            f"<= {MMDB_MEMORY_TARGET_MB:.0f} MB",
            "met" if m["rss_mb"] <= MMDB_MEMORY_TARGET_MB else "NOT met",
        ),
        (
            "IP lookups (geoip:cn from the mmdb, compiled)",
            f"{m['lookups_per_s']:,.0f}/s",
            f">= {MMDB_LOOKUP_TARGET:,.0f}/s",
            "met" if m["lookups_per_s"] >= MMDB_LOOKUP_TARGET else "NOT met",
        ),
        (
            f"  per-flow Reader.get instead ({m['reader']}; not used)",
            f"{m['reader_per_s']:,.0f}/s",
            "-",
            "agrees" if m["disagree"] == 0 else f"DISAGREES on {m['disagree']}",
        ),
    ]


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) >= 4 and sys.argv[1] == "--child-mmdb":
        _child_mmdb(sys.argv[2], int(sys.argv[3]))
        return
    from benchmarks import relay

    rows = run(quick="--quick" in sys.argv)
    print(relay.format_table(["geodata", "honk", "target", "status"], [list(r) for r in rows]))


if __name__ == "__main__":
    main()
