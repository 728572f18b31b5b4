"""honk.control.geoupdate without a network: which codes a download must hold, which file it replaces,
the atomic swap that keeps the old file on any failure, the checksum rules, and the updater's
per-file outcomes with downloads answered by a stand-in for the fetcher."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from helpers.geodata import geoip_bytes, geosite_bytes

from honk.config.load import load_text
from honk.config.spec import Spec
from honk.control import geoupdate as update
from honk.control.geoupdate import (
    FAILED,
    UNCHANGED,
    UPDATED,
    GeodataUpdater,
    UpdateBusy,
    check_candidate,
    checksum_matches,
    checksum_url,
    replace_atomically,
    required_codes,
    target_path,
)
from honk.core.clock import FakeClock
from honk.geo import dat
from honk.geo.assets import ASSET_ENV
from honk.geo.dat import GeoDataError
from honk.subscription.fetch import FetchResult, SubscriptionFetchError

SITE_URL = "https://mirror.example/geosite.dat"
IP_URL = "https://mirror.example/geoip.dat?key=1"
RULES = """routing {
    domain(geosite: mine) -> direct
    domain(geosite: category-ads-all@ads) -> block
    dip(geoip: mine) -> direct
    dip(geoip: private) -> direct
    domain(ext: "extra.dat:games") -> block
    fallback: block
}
"""
OLD_SITES = {
    "MINE": [(dat.FULL, "old.example", ())],
    "CATEGORY-ADS-ALL": [(dat.DOMAIN, "ads.example", ("ads",))],
}
NEW_SITES = {
    "MINE": [(dat.FULL, "new.example", ())],
    "CATEGORY-ADS-ALL": [(dat.DOMAIN, "ads.example", ("ads",))],
    "EXTRA": [(dat.DOMAIN, "x.example", ())],
}
OLD_IPS = {"MINE": (["192.0.2.0/24"], False)}
NEW_IPS = {"MINE": (["198.51.100.0/24"], False)}


def spec_for(data_dir: Path, *, geosite: str | None = SITE_URL, geoip: str | None = IP_URL) -> Spec:
    (data_dir / "extra.dat").write_bytes(geosite_bytes({"GAMES": [(dat.DOMAIN, "games.example", ())]}))
    urls = "".join(f"        {k}: '{v}'\n" for k, v in (("geosite", geosite), ("geoip", geoip)) if v)
    text = (
        f"global {{\n    data_dir: {data_dir}\n}}\n"
        + RULES
        + f"assets {{\n    geodata {{\n{urls}        route: direct\n    }}\n}}\n"
    )
    return load_text(text, "dae")


def write_old(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "geosite.dat").write_bytes(geosite_bytes(OLD_SITES))
    (data_dir / "geoip.dat").write_bytes(geoip_bytes(OLD_IPS))


# --- the codes a download must hold -------------------------------------------------------------


def test_the_required_codes_are_the_rules_geosite_and_geoip_codes_without_builtins_or_ext(
    no_geodata: Path,
) -> None:
    write_old(no_geodata / "var")
    spec = spec_for(no_geodata / "var")
    assert required_codes(spec.routing.rules) == {
        "geosite": {"mine", "category-ads-all@ads"},
        "geoip": {"mine"},
    }


def test_a_candidate_holding_every_required_code_counts_its_lists() -> None:
    assert check_candidate("geosite", geosite_bytes(NEW_SITES), {"mine", "category-ads-all@ads"}) == 3
    assert check_candidate("geoip", geoip_bytes(NEW_IPS), {"mine"}) == 1


def test_a_truncated_candidate_is_refused_as_unreadable() -> None:
    data = geosite_bytes(NEW_SITES)
    with pytest.raises(GeoDataError) as caught:
        check_candidate("geosite", data[: len(data) - 5], {"mine"})
    assert caught.value.code == "geodata-unreadable"


def test_a_candidate_lacking_a_code_a_rule_uses_is_refused_naming_the_code() -> None:
    with pytest.raises(GeoDataError, match="'mine'") as caught:
        check_candidate("geoip", geoip_bytes({"CN": (["203.0.113.0/24"], False)}), {"mine"})
    assert caught.value.code == "geodata-unknown-code"


def test_a_candidate_whose_attribute_selects_nothing_is_refused() -> None:
    sites = {"CATEGORY-ADS-ALL": [(dat.DOMAIN, "ads.example", ())]}
    with pytest.raises(GeoDataError, match="attribute 'ads'"):
        check_candidate("geosite", geosite_bytes(sites), {"category-ads-all@ads"})


def test_an_empty_candidate_is_refused_even_when_no_rule_needs_a_code() -> None:
    with pytest.raises(GeoDataError) as caught:
        check_candidate("geoip", b"", set())
    assert caught.value.code == "geodata-empty"


def test_a_checksum_file_matches_by_its_first_token_in_any_case() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    assert checksum_matches(f"{digest.upper()}  geoip.dat\n".encode(), digest)
    assert not checksum_matches(b"0123  geoip.dat\n", digest)
    assert not checksum_matches(b"", digest)
    assert checksum_url(IP_URL) == "https://mirror.example/geoip.dat.sha256sum?key=1"
    assert checksum_url(SITE_URL) == SITE_URL + ".sha256sum"


# --- which file an update writes ----------------------------------------------------------------


def test_a_file_in_data_dir_is_replaced_where_it_is(no_geodata: Path) -> None:
    write_old(no_geodata / "var")
    current, target = target_path("geosite", str(no_geodata / "var"))
    assert current == target == str(no_geodata / "var" / "geosite.dat")


def test_a_file_under_the_asset_variable_is_replaced_there(no_geodata: Path, monkeypatch) -> None:
    write_old(no_geodata / "env")
    monkeypatch.setenv(ASSET_ENV, str(no_geodata / "env"))
    assert target_path("geoip", str(no_geodata / "var")) == (str(no_geodata / "env" / "geoip.dat"),) * 2


def test_a_file_found_elsewhere_is_never_overwritten_the_new_one_goes_to_data_dir(no_geodata: Path) -> None:
    write_old(no_geodata)  # the working directory: below data_dir in the lookup
    current, target = target_path("geoip", str(no_geodata / "var"))
    assert current == str(no_geodata / "geoip.dat")
    assert target == str(no_geodata / "var" / "geoip.dat")


# --- the atomic swap -----------------------------------------------------------------------------


def test_the_swap_replaces_the_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "geosite.dat"
    target.write_bytes(b"old")
    replace_atomically(str(target), b"new bytes")
    assert target.read_bytes() == b"new bytes"
    assert os.listdir(tmp_path) == ["geosite.dat"]
    assert (target.stat().st_mode & 0o777) == update.FILE_MODE


def test_a_failed_swap_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "geosite.dat"
    target.write_bytes(b"old")

    def no_rename(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(update.os, "replace", no_rename)
    with pytest.raises(OSError):
        replace_atomically(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["geosite.dat"]


# --- the updater ---------------------------------------------------------------------------------


class Downloads:
    """A stand-in for the fetcher: URL -> body or the SubscriptionFetchError to raise; a URL not
    listed answers 404 (a checksum nobody published)."""

    def __init__(self, answers: dict[str, bytes | SubscriptionFetchError]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, url: str, **kw: object) -> FetchResult:
        self.asked.append(url)
        answer = self.answers.get(url, SubscriptionFetchError("http-status", status=404))
        if isinstance(answer, SubscriptionFetchError):
            raise answer
        assert len(answer) <= kw["max_bytes"]  # type: ignore[operator]
        return FetchResult(answer, 200, 0)


class Reloads:
    def __init__(self, error: Exception | None = None) -> None:
        self.count = 0
        self.error = error

    async def __call__(self) -> None:
        self.count += 1
        if self.error is not None:
            raise self.error


def updater(spec: Spec, reloads: Reloads) -> GeodataUpdater:
    async def never(target: object, deadline: float) -> object:
        raise AssertionError("the stand-in fetcher dials nothing")

    return GeodataUpdater(
        FakeClock(), spec=lambda: spec, dial=lambda route: never, reload=reloads, generation=lambda: 7
    )


async def test_good_downloads_replace_both_files_and_reload_once(no_geodata: Path, monkeypatch) -> None:
    var = no_geodata / "var"
    write_old(var)
    downloads = Downloads({SITE_URL: geosite_bytes(NEW_SITES), IP_URL: geoip_bytes(NEW_IPS)})
    monkeypatch.setattr(update, "fetch", downloads)
    reloads = Reloads()
    report = await updater(spec_for(var), reloads).update()
    assert [(a.name, a.status, a.codes) for a in report.assets] == [
        ("geosite", UPDATED, 3),
        ("geoip", UPDATED, 1),
    ]
    assert report.ok and report.reloaded and report.generation == 7 and reloads.count == 1
    assert (var / "geosite.dat").read_bytes() == geosite_bytes(NEW_SITES)
    assert (var / "geoip.dat").read_bytes() == geoip_bytes(NEW_IPS)
    assert "https://mirror.example/geoip.dat.sha256sum?key=1" in downloads.asked  # the checksum was asked


async def test_a_truncated_download_keeps_the_old_file(no_geodata: Path, monkeypatch) -> None:
    var = no_geodata / "var"
    write_old(var)
    good = geosite_bytes(NEW_SITES)
    monkeypatch.setattr(update, "fetch", Downloads({SITE_URL: good[: len(good) // 2]}))
    reloads = Reloads()
    report = await updater(spec_for(var), reloads).update(["geosite"])
    [site] = report.assets
    assert site.status == FAILED and str(var / "geosite.dat") in (site.reason or "")
    assert not report.ok and reloads.count == 0
    assert (var / "geosite.dat").read_bytes() == geosite_bytes(OLD_SITES)


async def test_a_download_missing_a_code_the_rules_need_keeps_the_old_file(
    no_geodata: Path, monkeypatch
) -> None:
    var = no_geodata / "var"
    write_old(var)
    monkeypatch.setattr(
        update, "fetch", Downloads({IP_URL: geoip_bytes({"CN": (["203.0.113.0/24"], False)})})
    )
    report = await updater(spec_for(var), Reloads()).update(["geoip"])
    assert report.assets[0].status == FAILED and "'mine'" in (report.assets[0].reason or "")
    assert (var / "geoip.dat").read_bytes() == geoip_bytes(OLD_IPS)


async def test_a_failed_file_does_not_stop_the_good_one_and_the_report_is_not_ok(
    no_geodata: Path, monkeypatch
) -> None:
    var = no_geodata / "var"
    write_old(var)
    monkeypatch.setattr(
        update,
        "fetch",
        Downloads(
            {SITE_URL: geosite_bytes(NEW_SITES), IP_URL: SubscriptionFetchError("http-status", status=404)}
        ),
    )
    reloads = Reloads()
    report = await updater(spec_for(var), reloads).update()
    assert [a.status for a in report.assets] == [UPDATED, FAILED]
    assert report.assets[1].reason == "download failed: http-status (HTTP 404)"
    assert reloads.count == 1 and not report.ok
    assert (var / "geoip.dat").read_bytes() == geoip_bytes(OLD_IPS)


async def test_bytes_equal_to_the_loaded_file_are_unchanged_and_nothing_reloads(
    no_geodata: Path, monkeypatch
) -> None:
    var = no_geodata / "var"
    write_old(var)
    before = (var / "geosite.dat").stat().st_mtime_ns
    monkeypatch.setattr(update, "fetch", Downloads({SITE_URL: geosite_bytes(OLD_SITES)}))
    reloads = Reloads()
    report = await updater(spec_for(var), reloads).update(["geosite"])
    assert report.assets[0].status == UNCHANGED and report.ok and reloads.count == 0
    assert (var / "geosite.dat").stat().st_mtime_ns == before


async def test_a_matching_checksum_verifies_and_a_wrong_one_keeps_the_old_file(
    no_geodata: Path, monkeypatch
) -> None:
    var = no_geodata / "var"
    write_old(var)
    body = geosite_bytes(NEW_SITES)
    digest = hashlib.sha256(body).hexdigest()
    monkeypatch.setattr(update, "fetch", Downloads({SITE_URL: body, SITE_URL + ".sha256sum": b"0" * 64}))
    report = await updater(spec_for(var), Reloads()).update(["geosite"])
    assert report.assets[0].status == FAILED and "checksum mismatch" in (report.assets[0].reason or "")
    assert (var / "geosite.dat").read_bytes() == geosite_bytes(OLD_SITES)
    monkeypatch.setattr(
        update, "fetch", Downloads({SITE_URL: body, SITE_URL + ".sha256sum": digest.encode()})
    )
    report = await updater(spec_for(var), Reloads()).update(["geosite"])
    assert report.assets[0].status == UPDATED and report.assets[0].verified


async def test_an_asset_without_a_configured_url_fails_saying_which_key_to_set(
    no_geodata: Path, monkeypatch
) -> None:
    var = no_geodata / "var"
    write_old(var)
    monkeypatch.setattr(update, "fetch", Downloads({}))
    report = await updater(spec_for(var, geoip=None), Reloads()).update(["geoip"])
    assert report.assets[0].status == FAILED
    assert report.assets[0].reason == "no URL configured (set assets.geodata.geoip)"


async def test_a_refused_reload_is_reported_and_the_update_is_not_ok(no_geodata: Path, monkeypatch) -> None:
    var = no_geodata / "var"
    write_old(var)
    monkeypatch.setattr(update, "fetch", Downloads({IP_URL: geoip_bytes(NEW_IPS)}))
    report = await updater(spec_for(var), Reloads(RuntimeError("the file does not load"))).update(["geoip"])
    assert report.assets[0].status == UPDATED and not report.reloaded
    assert report.reload_error == "the file does not load" and not report.ok


async def test_a_second_update_while_one_runs_is_refused(no_geodata: Path, monkeypatch) -> None:
    var = no_geodata / "var"
    write_old(var)
    gate = asyncio.Event()

    async def slow(url: str, **kw: object) -> FetchResult:
        await gate.wait()
        raise SubscriptionFetchError("timeout")

    monkeypatch.setattr(update, "fetch", slow)
    upd = updater(spec_for(var), Reloads())
    first = asyncio.create_task(upd.update(["geosite"]))
    while not upd.running:
        await asyncio.sleep(0)
    with pytest.raises(UpdateBusy):
        await upd.update()
    gate.set()
    assert (await first).assets[0].reason == "download failed: timeout"
