"""The ``assets`` section: where ``honkctl geodata update`` downloads geodata from, and through
what.

The form is upstream honk's (its assets reference, doc/en/reference/assets.md), so one file
serves both::

    assets {
        route: routing                  # routing (default) | direct | a node or group name
        geodata {
            geosite: 'https://example.org/geosite.dat'
            geoip: 'https://example.org/geoip.dat'
            route: direct               # overrides assets.route for geodata downloads
        }
    }

TOML/JSON spell it as the table ``[assets]`` with a ``[assets.geodata]`` table. Upstream's
``ui`` and ``subscription`` blocks are read and warned about (``not-honoured``): honk serves no
downloaded dashboard and its subscriptions take their own options, so a file written for upstream
still loads. A URL must be http(s) with a host, at most :data:`MAX_URL_BYTES`, without userinfo or
fragment (upstream's limits: a URL is sent as it is, and a password in it would be logged by
every proxy on the way); a route name must be declared in the file (a node or group: a
subscription's own nodes cannot carry a download that may be needed to start). Problems are
reported with the key path and line; values never appear in messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from honk.config import values as V
from honk.config.spec import ASSET_ROUTE_DIRECT, ASSET_ROUTE_ROUTING, AssetsSpec, GeodataSpec
from honk.config.tree import Entry, Sink, join_path

SECTION = "assets"
GEODATA_BLOCK = "geodata"
GEODATA_URL_KEYS = ("geosite", "geoip")
ROUTE_KEY = "route"
URL_SCHEMES = ("http", "https")
MAX_URL_BYTES = 4096  # upstream: "HTTP(S) source ..., at most 4096 bytes"
# upstream's other assets blocks: read, warned about, not used
UNHONOURED_BLOCKS: dict[str, str] = {
    "ui": "honk serves no downloaded dashboard; the ui block is ignored",
    "subscription": "honk's subscriptions take their options per entry; assets.subscription is ignored",
}
ROUTE_KEYWORDS = (ASSET_ROUTE_ROUTING, ASSET_ROUTE_DIRECT)


# --- reading: both syntaxes to entries keyed "route", "geodata.geosite", "ui.url", ... ---------


def dae_entries(block: Any, file: str, sink: Sink) -> list[Entry]:
    """The dae ``assets`` block (a :class:`honk.config.dae.Block`) as entries."""
    from honk.config import dae  # dae imports this module for its hook

    out: list[Entry] = []
    for item in block.items:
        if isinstance(item, dae.Block):
            if item.header != GEODATA_BLOCK and item.header not in UNHONOURED_BLOCKS:
                dae._skip_unknown_block(item, SECTION, file, sink)
                continue
            path = join_path(SECTION, item.header)
            for e in dae._settings(item, path, file, sink):
                out.append(Entry(f"{item.header}.{e.key}", e.value, e.path, e.loc, raw=True))
        else:
            out.extend(dae._settings(dae.Block(SECTION, block.line, [item]), SECTION, file, sink))
    return out


def structured_entries(value: object, entry: Callable[..., Entry], table: Callable[..., Any]) -> list[Entry]:
    """The TOML/JSON ``assets`` table as entries; ``entry`` and ``table`` are the structured
    reader's own helpers (they locate each key's line and report a non-table)."""
    out: list[Entry] = []
    for key, v in (table(value, SECTION) or {}).items():
        if key == GEODATA_BLOCK or key in UNHONOURED_BLOCKS:
            for sub, x in (table(v, SECTION, key) or {}).items():
                e = entry(f"{key}.{sub}", x, SECTION, key, sub)
                out.append(e)
        else:
            out.append(entry(key, v, SECTION, key))
    return out


# --- building -------------------------------------------------------------------------------


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a download source, or None."""
    if len(url.encode("utf-8")) > MAX_URL_BYTES:
        return f"a URL has at most {MAX_URL_BYTES} bytes"
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        return "a URL holds no whitespace or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return "not a valid URL"
    if parts.scheme.lower() not in URL_SCHEMES or not parts.hostname:
        return "a download URL must be http:// or https:// with a host"
    if parts.username is not None or parts.password is not None:
        return "a download URL carries no user or password"
    if parts.fragment or url.endswith("#"):
        return "a download URL has no #fragment"
    return None


def build_assets(entries: list[Entry], outbounds: set[str], sink: Sink) -> AssetsSpec:
    """The merged ``assets`` entries (last occurrence wins) as an :class:`AssetsSpec`;
    ``outbounds`` are the node, group and builtin names a route may name."""
    route = ASSET_ROUTE_ROUTING
    geodata_route: str | None = None
    urls: dict[str, str | None] = dict.fromkeys(GEODATA_URL_KEYS)
    for e in entries:
        key = e.key or ""
        block, _, sub = key.rpartition(".")
        if block in UNHONOURED_BLOCKS:
            sink.warning("not-honoured", e.path, UNHONOURED_BLOCKS[block], e.loc)
        elif key == ROUTE_KEY or (block == GEODATA_BLOCK and sub == ROUTE_KEY):
            name = _route(e, outbounds, sink)
            if name is not None:
                if block:
                    geodata_route = name
                else:
                    route = name
        elif block == GEODATA_BLOCK and sub in GEODATA_URL_KEYS:
            url = V.get_str(e, sink)
            if url is None:
                continue
            url = url.strip()
            if not url:
                urls[sub] = None  # empty: not configured
                continue
            problem = url_problem(url)
            if problem is not None:
                sink.error("invalid-url", e.path, problem, e.loc)
                continue
            urls[sub] = url
        else:
            sink.warning("unknown-key", e.path, "unknown key is ignored", e.loc)
    geodata = GeodataSpec(geosite=urls["geosite"], geoip=urls["geoip"], route=geodata_route or route)
    return AssetsSpec(route=route, geodata=geodata)


def _route(e: Entry, outbounds: set[str], sink: Sink) -> str | None:
    name = V.get_str(e, sink)
    if name is None:
        return None
    name = name.strip()
    if name in ROUTE_KEYWORDS:
        return name
    if not name:
        sink.error("invalid-value", e.path, "a route is routing, direct, or a node or group name", e.loc)
        return None
    if name not in outbounds:
        sink.error("unknown-outbound", e.path, "route names no node, group or builtin outbound", e.loc)
        return None
    return name
