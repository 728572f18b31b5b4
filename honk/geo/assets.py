"""Finding and loading geodata, and answering a rule's code.

Files are looked up in upstream honk's order, first match wins: ``$DAE_LOCATION_ASSET``,
``global.data_dir``, the working directory, ``/usr/local/share/honk``, ``/usr/share/honk``,
then where dae looks: ``$XDG_DATA_HOME/dae`` (``~/.local/share/dae``), ``/usr/local/share/dae``,
``/usr/share/dae``, ``/etc/dae``. A file is read once per content (path, mtime, size) for the
whole process: routing, DNS and every reload share it.

Codes, as rules write them (case-insensitive):

* ``geosite: cn`` -- the list ``cn`` of ``geosite.dat``; ``geosite: category-ads-all@ads``
  keeps the entries that carry the attribute ``ads`` (several ``@attr``: all of them).
* ``geoip: cn`` -- the list ``cn`` of ``geoip.dat``; ``geoip: private`` is built in and needs
  no file. A list marked ``reverse_match`` matches the addresses outside it. Where no
  ``geoip.dat`` is found, the first MaxMind DB of :data:`GEOIP_MMDB_FILES` found answers
  instead: ``cn`` is every network whose record's ``country.iso_code`` is CN
  (:mod:`honk.geo.mmdb`).
* ``ext: file.dat:tag`` -- the list ``tag`` of another file in the same format, looked up the
  same way (an absolute path is taken as it is); ``ext: file.mmdb:cn`` -- a country code of a
  MaxMind DB file (a name ending ``.mmdb``).

A code the data cannot answer raises :class:`~honk.geo.dat.GeoDataError`: the file is missing
(the message lists every place searched), unreadable, lacks the code, or the attribute selects
nothing. ``honk check`` reports it with the rule's key path and line; a running daemon keeps
its rules.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from honk.geo.dat import DOMAIN, FULL, PLAIN, REGEX, GeoDataError, read_geoip, read_geosite
from honk.geo.mmdb import read_mmdb

ASSET_ENV = "DAE_LOCATION_ASSET"  # dae's variable: a directory searched before any other
GEOSITE_FILE = "geosite.dat"
GEOIP_FILE = "geoip.dat"
# geoip: without a geoip.dat, the first of these found (in this order) answers: honk's own name,
# then the names Clash/mihomo, MaxMind (GeoLite2) and DB-IP (IP-to-Country Lite) give theirs
GEOIP_MMDB_FILES = ("geoip.mmdb", "Country.mmdb", "GeoLite2-Country.mmdb", "dbip-country-lite.mmdb")
MMDB_SUFFIX = ".mmdb"  # an ext: file named so is a MaxMind DB
HONK_ASSET_DIRS = ("/usr/local/share/honk", "/usr/share/honk")  # where the package puts its data
SYSTEM_ASSET_DIRS = ("/usr/local/share/dae", "/usr/share/dae", "/etc/dae")  # dae's own places

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class DomainList:
    """One geosite list, split by how each value matches (lower case, except regexes)."""

    suffixes: tuple[str, ...] = ()
    full: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    regexes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NetworkList:
    """One geoip list; ``reverse``: it matches the addresses outside ``networks``."""

    networks: tuple[IPNetwork, ...] = ()
    reverse: bool = False


def asset_dirs(data_dir: str | None = None) -> tuple[str, ...]:
    """The directories searched, in order, without repeats."""
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    candidates = [
        os.environ.get(ASSET_ENV, ""),
        data_dir or "",
        os.getcwd(),
        *HONK_ASSET_DIRS,
        os.path.join(xdg, "dae"),
        *SYSTEM_ASSET_DIRS,
    ]
    out: list[str] = []
    for d in candidates:
        if d and os.path.abspath(d) not in out:
            out.append(os.path.abspath(d))
    return tuple(out)


@dataclass(slots=True)
class _Loaded:
    """One file content: its lists by code, and the codes already answered (``honk check`` and
    the router's compile ask for the same ones; a list of 100,000 domains is split once)."""

    entries: Any  # a .dat's code -> message dict, or an .mmdb's MmdbCountries
    answered: dict[str, DomainList | NetworkList] = field(default_factory=dict)


# (kind, path) -> ((mtime_ns, size), its content); one parse per file content for the process
_LOADED: dict[tuple[str, str], tuple[tuple[int, int], _Loaded]] = {}


class GeoAssets:
    """The geodata a configuration's rules read, found from its ``data_dir``."""

    __slots__ = ("dirs",)

    def __init__(self, data_dir: str | None = None) -> None:
        self.dirs = asset_dirs(data_dir)

    def find(self, name: str) -> str | None:
        """The first existing file called ``name`` in :attr:`dirs` (``name`` may be absolute)."""
        if os.path.isabs(name):
            return name if os.path.isfile(name) else None
        for d in self.dirs:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path
        return None

    def domains(self, code: str, *, ext: bool = False) -> DomainList:
        """A ``geosite:`` code (``ext``: an ``ext:`` code ``file:tag``) as a :class:`DomainList`."""
        name, code = _split_ext(code) if ext else (GEOSITE_FILE, code)
        if _is_mmdb(name):
            raise GeoDataError(
                "geodata-invalid-code", f"{name} is a MaxMind DB: it holds IP networks, not domain lists"
            )
        loaded = self._load(name, "geosite")
        asked = code.strip().lower()
        answered = loaded.answered.get(asked)
        if isinstance(answered, DomainList):
            return answered
        code, *selectors = asked.split("@")
        site = loaded.entries.get(code)
        if site is None:
            raise GeoDataError("geodata-unknown-code", f"{self._where(name)} has no list {code!r}")
        suffixes: list[str] = []
        full: list[str] = []
        keywords: list[str] = []
        regexes: list[str] = []
        for domain in site.domain:
            if selectors:
                keys = {a.key.lower() for a in domain.attribute}
                if not all(s in keys for s in selectors):
                    continue
            kind = domain.type
            if kind == REGEX:
                regexes.append(domain.value)
                continue
            value = domain.value.strip().rstrip(".").lower()
            if not value:
                continue
            if kind == DOMAIN:
                suffixes.append(value.lstrip("."))
            elif kind == FULL:
                full.append(value)
            elif kind == PLAIN:
                keywords.append(value)
        found = DomainList(tuple(suffixes), tuple(full), tuple(keywords), tuple(regexes))
        if selectors and found == DomainList():
            raise GeoDataError(
                "geodata-unknown-code",
                f"no entry of {code!r} in {self._where(name)} has the attribute {'@'.join(selectors)!r}",
            )
        loaded.answered[asked] = found
        return found

    def networks(self, code: str, *, ext: bool = False) -> NetworkList:
        """A ``geoip:`` code (``ext``: an ``ext:`` code ``file:tag``) as a :class:`NetworkList`."""
        name, code = _split_ext(code) if ext else (self._geoip_file(), code)
        if _is_mmdb(name):
            return self._mmdb_networks(name, code)
        loaded = self._load(name, "geoip")
        asked = code.strip().lower()
        answered = loaded.answered.get(asked)
        if isinstance(answered, NetworkList):
            return answered
        geoip = loaded.entries.get(asked)
        if geoip is None:
            raise GeoDataError("geodata-unknown-code", f"{self._where(name)} has no list {code.strip()!r}")
        networks = []
        for cidr in geoip.cidr:
            try:
                networks.append(ipaddress.ip_network((bytes(cidr.ip), cidr.prefix), strict=False))
            except ValueError:
                raise GeoDataError(
                    "geodata-unreadable", f"{self._where(name)}: list {code.strip()!r} holds a malformed CIDR"
                ) from None
        found = NetworkList(tuple(networks), bool(geoip.reverse_match))
        loaded.answered[asked] = found
        return found

    def _geoip_file(self) -> str:
        """``geoip.dat`` if there is one, else the first MaxMind DB of :data:`GEOIP_MMDB_FILES`
        found (the error for none names geoip.dat and these)."""
        if self.find(GEOIP_FILE) is not None:
            return GEOIP_FILE
        return next((n for n in GEOIP_MMDB_FILES if self.find(n) is not None), GEOIP_FILE)

    def _mmdb_networks(self, name: str, code: str) -> NetworkList:
        loaded = self._load(name, "mmdb")
        asked = code.strip().lower()
        answered = loaded.answered.get(asked)
        if isinstance(answered, NetworkList):
            return answered
        try:
            networks = loaded.entries.networks(asked)
        except GeoDataError as exc:
            raise GeoDataError(exc.code, f"{self._where(name)}: {exc}") from None
        if networks is None:
            raise GeoDataError(
                "geodata-unknown-code",
                f"{self._where(name)} has no network with the country code {code.strip()!r}",
            )
        found = NetworkList(networks)
        loaded.answered[asked] = found
        return found

    def stamp(self, names: tuple[str, ...]) -> tuple[tuple[str, str, int, int], ...]:
        """(name, path, mtime_ns, size) of each file in ``names`` that exists: what a reload
        compares to know the data changed."""
        out = []
        for name in names:
            path = self.find(name)
            if path is not None:
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    out.append((name, path, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _where(self, name: str) -> str:
        return self.find(name) or name

    def _load(self, name: str, kind: str) -> _Loaded:
        path = self.find(name)
        if path is None:
            also = f" (nor {', '.join(GEOIP_MMDB_FILES)})" if name == GEOIP_FILE else ""
            raise GeoDataError(
                "geodata-missing",
                f"{name} not found{also}; looked in "
                f"{', '.join(self.dirs) if not os.path.isabs(name) else name}",
            )
        try:
            st = os.stat(path)
            key = (st.st_mtime_ns, st.st_size)
            cached = _LOADED.get((kind, path))
            if cached is not None and cached[0] == key:
                return cached[1]
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise GeoDataError("geodata-unreadable", f"{path}: {exc.strerror}") from None
        try:
            entries = (
                read_geosite(data)
                if kind == "geosite"
                else read_geoip(data)
                if kind == "geoip"
                else read_mmdb(data, path)
            )
        except GeoDataError as exc:
            raise GeoDataError(exc.code, f"{path}: {exc}") from None
        loaded = _Loaded(entries)
        _LOADED[(kind, path)] = (key, loaded)
        return loaded


def _is_mmdb(name: str) -> bool:
    return name.lower().endswith(MMDB_SUFFIX)


def _split_ext(code: str) -> tuple[str, str]:
    """``file.dat:tag`` -> ``("file.dat", "tag")`` (the last colon splits)."""
    name, sep, tag = code.strip().rpartition(":")
    if not sep or not name or not tag:
        raise GeoDataError("geodata-invalid-code", f"ext: expects 'file.dat:tag', got {code.strip()!r}")
    return name, tag
