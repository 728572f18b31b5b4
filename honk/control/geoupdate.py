"""``honkctl geodata update``: download the configured geodata, check it, swap it in, reload.

Why it is shaped this way:

* Downloads reuse the subscription fetcher (:func:`honk.subscription.fetch.fetch`: HTTP/1.1
  over any outbound, TLS verified, body bounded, one deadline on the injected clock), dialled
  the way ``assets.geodata.route`` says (upstream honk's assets reference): ``routing`` asks
  the running router for the download's own target, ``direct`` dials it, a node or group name
  dials through that outbound of the running plane (as a subscription ``detour`` does).
* As upstream, after a file arrives its checksum is asked at the same URL with
  :data:`CHECKSUM_SUFFIX` appended to the path: a 200 must name the file's SHA-256, a 404 means
  none is published (the file is used unverified), anything else fails the file.
* A file is accepted only if it parses as v2fly geodata, holds at least one list, and holds
  every code the running routing rules name (``domain(geosite: …)``, ``dip(geoip: …)``, with
  ``@attr`` selections that still select something): a file that would make a rule match
  nothing, or make the next reload refuse the configuration, never replaces a working one.
  Every candidate is checked before any file is replaced.
* The swap is atomic and durable: the bytes go to a temporary file in the target's directory,
  which is fsynced and renamed over the target (``os.replace``), then the directory is
  fsynced. The old file stays whole when anything fails, and the failure names the file.
* The file replaced is the one routing loaded when it lives in ``global.data_dir`` or
  ``$DAE_LOCATION_ASSET``; one found anywhere else (a package's ``/usr/share/honk``) is never
  overwritten: the new file goes to ``<data_dir>/<name>.dat``, which the lookup prefers.
* When a file changed, the daemon's ordinary reload runs (the one SIGHUP and ``honkctl
  reload`` run): it rebuilds the router because a data file's stamp changed.
* Bytes equal to the loaded file are not written (``unchanged``), and then nothing reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from honk.config.spec import ASSET_ROUTE_DIRECT, ASSET_ROUTE_ROUTING, RuleSpec, Spec
from honk.core.clock import Clock
from honk.core.net import Address, FlowMeta, Network
from honk.geo.assets import ASSET_ENV, GEOIP_FILE, GEOSITE_FILE, GeoAssets
from honk.geo.dat import GeoDataError, read_geoip, read_geosite
from honk.subscription.fetch import Dial, SubscriptionFetchError, fetch

__all__ = [
    "ASSETS",
    "AssetResult",
    "GeodataUpdater",
    "UpdateBusy",
    "UpdateReport",
    "check_candidate",
    "dial_for_route",
    "replace_atomically",
    "required_codes",
    "target_path",
]

ASSETS = ("geosite", "geoip")  # the names `--name` takes, in update order
ASSET_FILES = {"geosite": GEOSITE_FILE, "geoip": GEOIP_FILE}
MAX_ASSET_BYTES = 256 * 1024 * 1024  # upstream: "One update owns at most two 256 MiB assets"
DOWNLOAD_TIMEOUT = 600.0  # seconds for one file, redirects included (upstream: "capped at 10 minutes")
CHECKSUM_TIMEOUT = 10.0  # seconds for its checksum request (upstream: "a separate 10-second deadline")
CHECKSUM_SUFFIX = ".sha256sum"  # upstream: "the URL with .sha256sum appended to its path, keeping any query"
MAX_CHECKSUM_BYTES = 4096  # a checksum file is one line: the digest and a name
HTTP_NOT_FOUND = 404  # the checksum status that means "none published"
BUILTIN_GEOIP_CODES = frozenset({"private"})  # answered without any file (honk.geo.assets)
STAGING_PREFIX = ".honk-geodata-"  # temporary files next to the target
STAGING_SUFFIX = ".tmp"
FILE_MODE = 0o644  # what a package installs geodata with: readable by everyone
GEODATA_INBOUND = "geodata"  # the inbound name routing sees for a `route: routing` download
UNKNOWN_SOURCE = Address("0.0.0.0", 0)  # a download has no client

UPDATED = "updated"
UNCHANGED = "unchanged"
FAILED = "failed"


class UpdateBusy(Exception):
    """Another update is running; this one did nothing."""


@dataclass(slots=True)
class AssetResult:
    """What happened to one file. ``reason`` (failed only) names the file or URL's asset and why;
    it never holds the URL (it may carry a token)."""

    name: str  # "geosite" | "geoip"
    status: str  # UPDATED | UNCHANGED | FAILED
    file: str | None = None  # the file replaced or compared with
    bytes: int | None = None  # the downloaded size
    codes: int | None = None  # lists the downloaded file holds
    sha256: str | None = None
    verified: bool = False  # a published checksum matched
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "file": self.file,
            "bytes": self.bytes,
            "codes": self.codes,
            "sha256": self.sha256,
            "verified": self.verified,
            "reason": self.reason,
        }


@dataclass(slots=True)
class UpdateReport:
    assets: list[AssetResult]
    reloaded: bool = False  # a changed file made the daemon reload
    generation: int | None = None  # the generation serving after the reload
    reload_error: str | None = None  # the reload refused (the new files stay; the old router runs)

    @property
    def ok(self) -> bool:
        return self.reload_error is None and all(a.status != FAILED for a in self.assets)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "assets": [a.to_json() for a in self.assets],
            "reloaded": self.reloaded,
            "generation": self.generation,
            "reload_error": self.reload_error,
        }


# --- sans-I/O parts --------------------------------------------------------------------------


def required_codes(rules: Iterable[RuleSpec]) -> dict[str, set[str]]:
    """The ``geosite:`` and ``geoip:`` codes routing ``rules`` name, lower case, by asset (as
    :func:`honk.config.geodata.check_geodata` asks them; ``ext:`` files are not downloaded)."""
    out: dict[str, set[str]] = {name: set() for name in ASSETS}
    for rule in rules:
        for predicate in rule.predicates:
            for arg in predicate.args:
                key, value = arg.key.strip().lower(), arg.value.strip().lower()
                if key == "geosite" or (key == "geoip" and value not in BUILTIN_GEOIP_CODES):
                    out[key].add(value)
    return out


def check_candidate(name: str, data: bytes, required: Iterable[str]) -> int:
    """How many lists ``data`` (a downloaded ``name``.dat) holds; GeoDataError when it does not
    parse, holds none, or cannot answer a code in ``required`` the way
    :class:`honk.geo.assets.GeoAssets` would answer it for a rule."""
    entries = read_geosite(data) if name == "geosite" else read_geoip(data)
    if not entries:
        raise GeoDataError("geodata-empty", "holds no list")
    for asked in sorted(required):
        code, *selectors = asked.split("@") if name == "geosite" else (asked,)
        entry = entries.get(code)
        if entry is None:
            raise GeoDataError("geodata-unknown-code", f"has no list {code!r}, which a routing rule uses")
        if selectors and not any(
            set(selectors) <= {a.key.lower() for a in d.attribute} for d in entry.domain
        ):
            raise GeoDataError(
                "geodata-unknown-code",
                f"no entry of {code!r} has the attribute {'@'.join(selectors)!r}, which a routing rule uses",
            )
        if name == "geoip":
            for cidr in entry.cidr:
                try:
                    ipaddress.ip_network((bytes(cidr.ip), cidr.prefix), strict=False)
                except ValueError:
                    raise GeoDataError(
                        "geodata-unreadable", f"list {code!r} holds a malformed CIDR"
                    ) from None
    return len(entries)


def target_path(name: str, data_dir: str) -> tuple[str | None, str]:
    """(the file routing loads now or None, the file an update writes) for asset ``name``."""
    file = ASSET_FILES[name]
    current = GeoAssets(data_dir).find(file)
    writable = {os.path.abspath(data_dir)}
    if os.environ.get(ASSET_ENV):
        writable.add(os.path.abspath(os.environ[ASSET_ENV]))
    if current is not None and os.path.dirname(os.path.abspath(current)) in writable:
        return current, current
    return current, os.path.join(os.path.abspath(data_dir), file)


def checksum_matches(body: bytes, digest: str) -> bool:
    """Whether a ``.sha256sum`` body's first token is ``digest`` (hex, any case)."""
    tokens = body.decode("ascii", "replace").split()
    return bool(tokens) and tokens[0].lower() == digest.lower()


def checksum_url(url: str) -> str:
    """``url`` with :data:`CHECKSUM_SUFFIX` appended to its path, query kept, as upstream asks."""
    path, sep, query = url.partition("?")
    return path + CHECKSUM_SUFFIX + sep + query


def file_digest(path: str) -> str | None:
    """The SHA-256 of ``path``; None when it cannot be read. Blocking: run it in a thread."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def replace_atomically(target: str, data: bytes) -> None:
    """Make ``target`` hold ``data`` all at once: a temporary file beside it, fsynced, renamed
    over it, the directory fsynced. OSError leaves ``target`` as it was (and no temporary file).
    Blocking: run it in a thread."""
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=STAGING_PREFIX, suffix=STAGING_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(staged, FILE_MODE)
        os.replace(staged, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def fetch_reason(exc: SubscriptionFetchError) -> str:
    return f"download failed: {exc.reason}" + (f" (HTTP {exc.status})" if exc.status else "")


# --- the dial --------------------------------------------------------------------------------


def dial_for_route(
    route: str, *, direct: Dial, via: Callable[[str], Dial], route_flow: Callable[[FlowMeta], Awaitable[Any]]
) -> Dial:
    """How a download connects for ``route``: ``direct``, ``routing`` (``route_flow`` decides
    the leaf for the download's target, as for a client's flow), or through the node or group
    of that name (``via``)."""
    if route == ASSET_ROUTE_DIRECT:
        return direct
    if route != ASSET_ROUTE_ROUTING:
        return via(route)

    async def routed(target: Address, deadline: float) -> Any:
        decision = await route_flow(FlowMeta(Network.TCP, UNKNOWN_SOURCE, target, GEODATA_INBOUND))
        return await decision.leaf.dial_tcp(target, deadline)

    return routed


# --- the daemon's updater -------------------------------------------------------------------


class GeodataUpdater:
    """One update at a time for a daemon.

    ``spec`` returns the running spec (its ``assets``, ``routing`` and ``data_dir``); ``dial``
    turns an assets route into a dialer (:func:`dial_for_route` over the daemon's plane);
    ``reload`` is the daemon's reload (returns its report or raises ApplyError); ``generation``
    reads the serving generation.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        spec: Callable[[], Spec | None],
        dial: Callable[[str], Dial],
        reload: Callable[[], Awaitable[Any]],
        generation: Callable[[], int],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._clock = clock
        self._spec = spec
        self._dial = dial
        self._reload = reload
        self._generation = generation
        self._ssl = ssl_context
        self._lock = asyncio.Lock()

    @property
    def running(self) -> bool:
        return self._lock.locked()

    async def update(self, names: Sequence[str] | None = None) -> UpdateReport:
        """Update ``names`` (None: every asset); UpdateBusy if an update is running."""
        if self._lock.locked():
            raise UpdateBusy("a geodata update is already running")
        async with self._lock:
            return await self._update(tuple(names) if names else ASSETS)

    async def _update(self, names: tuple[str, ...]) -> UpdateReport:
        spec = self._spec()
        if spec is None:
            return UpdateReport([AssetResult(n, FAILED, reason="honk is not running") for n in names])
        geodata, data_dir = spec.assets.geodata, spec.global_.data_dir
        required = required_codes(spec.routing.rules)
        dial = self._dial(geodata.route)
        results: list[AssetResult] = []
        staged: list[tuple[AssetResult, bytes]] = []
        for name in names:  # every candidate is checked before any file is replaced
            result, data = await self._candidate(name, geodata.url(name), data_dir, required[name], dial)
            results.append(result)
            if data is not None:
                staged.append((result, data))
        for result, data in staged:
            assert result.file is not None
            try:
                await asyncio.to_thread(replace_atomically, result.file, data)
            except OSError as exc:
                result.status, result.reason = FAILED, f"{result.file}: cannot replace: {exc.strerror or exc}"
        report = UpdateReport(results)
        if any(r.status == UPDATED for r in results):
            try:
                await self._reload()
            except Exception as exc:  # ApplyError: the router keeps its data; say why
                report.reload_error = str(exc) or type(exc).__name__
            else:
                report.reloaded = True
            report.generation = self._generation()
        return report

    async def _candidate(
        self, name: str, url: str | None, data_dir: str, required: set[str], dial: Dial
    ) -> tuple[AssetResult, bytes | None]:
        """The checked download of one asset, and its bytes when they should replace the file."""
        current, target = target_path(name, data_dir)
        result = AssetResult(name, FAILED, file=target)
        if url is None:
            result.reason = f"no URL configured (set assets.geodata.{name})"
            return result, None
        try:
            body = await self._get(url, dial, DOWNLOAD_TIMEOUT, MAX_ASSET_BYTES)
        except SubscriptionFetchError as exc:
            result.reason = fetch_reason(exc)
            return result, None
        result.bytes = len(body)
        result.sha256 = hashlib.sha256(body).hexdigest()
        try:
            result.verified = await self._verify(url, dial, result.sha256)
        except SubscriptionFetchError as exc:
            result.reason = f"checksum {fetch_reason(exc)}"
            return result, None
        except ValueError as exc:
            result.reason = str(exc)
            return result, None
        try:
            result.codes = await asyncio.to_thread(check_candidate, name, body, required)
        except GeoDataError as exc:
            result.reason = f"{ASSET_FILES[name]} from its URL: {exc}; {target} is kept"
            return result, None
        if current is not None and await asyncio.to_thread(file_digest, current) == result.sha256:
            result.status, result.file = UNCHANGED, current
            return result, None
        result.status = UPDATED
        return result, body

    async def _verify(self, url: str, dial: Dial, digest: str) -> bool:
        """Whether a published checksum matched (False: none published); ValueError on a mismatch."""
        try:
            body = await self._get(checksum_url(url), dial, CHECKSUM_TIMEOUT, MAX_CHECKSUM_BYTES)
        except SubscriptionFetchError as exc:
            if exc.reason == "http-status" and exc.status == HTTP_NOT_FOUND:
                return False
            raise
        if not checksum_matches(body, digest):
            raise ValueError(
                f"checksum mismatch: the published {CHECKSUM_SUFFIX} does not match the download"
            )
        return True

    async def _get(self, url: str, dial: Dial, timeout: float, limit: int) -> bytes:
        deadline = self._clock.now() + timeout
        result = await fetch(
            url, dial=dial, clock=self._clock, deadline=deadline, ssl_context=self._ssl, max_bytes=limit
        )
        return result.body
