"""``honk check``'s geodata check: every ``geosite:``, ``geoip:`` and ``ext:`` code a routing
rule names must be answerable by the data found from ``global.data_dir`` (see
:mod:`honk.geo.assets`), else the rule is refused with its key path and line and the reason: the
file is missing (with every place searched), unreadable, or lacks the code. A rule that would
silently match nothing is never accepted."""

from __future__ import annotations

from honk.config.spec import RuleSpec
from honk.config.tree import Entry, Sink
from honk.geo.assets import GeoAssets
from honk.geo.dat import GeoDataError


def check_geodata(rules: list[tuple[RuleSpec, Entry]], data_dir: str | None, sink: Sink) -> None:
    geo = GeoAssets(data_dir)
    answers: dict[tuple[str, str, str], GeoDataError | None] = {}  # one lookup per distinct code
    for rule, entry in rules:
        for predicate in rule.predicates:
            ip = predicate.name in ("dip", "sip")
            for arg in predicate.args:
                key, value = arg.key.strip().lower(), arg.value.strip()
                if key not in ("geosite", "geoip", "ext") or (key == "geoip" and value.lower() == "private"):
                    continue
                asked = ("ip" if ip else "domain", key, value.lower())
                if asked not in answers:
                    answers[asked] = _ask(geo, ip, key, value)
                problem = answers[asked]
                if problem is not None:
                    sink.error(
                        problem.code, entry.path, f"{predicate.name}({key}: {value}): {problem}", entry.loc
                    )


def _ask(geo: GeoAssets, ip: bool, key: str, value: str) -> GeoDataError | None:
    try:
        if ip:
            geo.networks(value, ext=key == "ext")
        else:
            geo.domains(value, ext=key == "ext")
    except GeoDataError as exc:
        return exc
    return None
