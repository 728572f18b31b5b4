"""The neutral document both readers produce and the builder consumes.

A :class:`Doc` is one configuration file after reading: the dae reader and the
TOML/JSON reader both flatten their syntax into the same lists of
:class:`Entry` objects, each carrying the key path a person recognises
(``global.check_interval``, ``group.proxy.filter[1]``, ``routing.rules[3]``)
and the line it came from.

Entry values differ by origin and say so: ``raw=True`` marks dae text exactly
as written after the declaration colon (quotes still present, lists not yet
split); ``raw=False`` marks a typed value from TOML/JSON (``str``, ``int``,
``float``, ``bool``, ``list``, ...). The value readers in
:mod:`honk.config.values` accept both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from honk.config.diagnostics import Diagnostic, Severity, SourceLoc


@dataclass(slots=True)
class Entry:
    key: str | None  # setting name, entry tag, or None (rule, untagged entry, include path)
    value: object
    path: str  # key path for diagnostics
    loc: SourceLoc
    raw: bool = False  # True: dae source text, still quoted


@dataclass(slots=True)
class GroupDecl:
    name: str
    path: str
    loc: SourceLoc
    entries: list[Entry] = field(default_factory=list)
    structured: bool = False  # from TOML/JSON: structured-only keys are allowed


@dataclass(slots=True)
class SubscriptionDecl:
    """One ``subscription`` entry: its settings (``url``, ``ua``, ``interval``,
    ``cache``, ``detour``) as entries, whether written inline (``tag: 'url'(UA)``) or as a block."""

    name: str | None  # the explicit tag; None: tagless (dae names it after the URL host)
    path: str
    loc: SourceLoc
    entries: list[Entry] = field(default_factory=list)
    structured: bool = False  # from TOML/JSON: a name is required


@dataclass(slots=True)
class Doc:
    """One file's contribution to the configuration, in source order."""

    file: str
    fmt: str  # "dae" | "toml" | "json"
    global_: list[Entry] = field(default_factory=list)
    inbounds: list[Entry] = field(default_factory=list)
    nodes: list[Entry] = field(default_factory=list)
    subscriptions: list[SubscriptionDecl] = field(default_factory=list)
    groups: list[GroupDecl] = field(default_factory=list)
    rules: list[Entry] = field(default_factory=list)
    fallbacks: list[Entry] = field(default_factory=list)
    clash_api: list[Entry] | None = None
    cache_file: list[Entry] | None = None
    # the dns section, flattened (None: no dns section). Keys: None for the section itself
    # (its header line), a setting's name, "upstream" for an upstream block (it replaces the
    # built-in upstream), "upstream.<name>" per upstream, "request"/"response" per routing
    # rule, "request.fallback"/"response.fallback", "fixed_domain_ttl.<domain>".
    dns: list[Entry] | None = None
    includes: list[Entry] = field(default_factory=list)
    assets: list[Entry] = field(default_factory=list)  # the assets section (honk.config.assets)


class Sink:
    """Collects diagnostics in emission order."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def add(self, severity: Severity, code: str, path: str, message: str, loc: SourceLoc) -> None:
        self.items.append(Diagnostic(severity, code, path, message, loc))

    def error(self, code: str, path: str, message: str, loc: SourceLoc) -> None:
        self.add(Severity.ERROR, code, path, message, loc)

    def warning(self, code: str, path: str, message: str, loc: SourceLoc) -> None:
        self.add(Severity.WARNING, code, path, message, loc)

    def info(self, code: str, path: str, message: str, loc: SourceLoc) -> None:
        self.add(Severity.INFO, code, path, message, loc)

    @property
    def has_errors(self) -> bool:
        return any(d.severity is Severity.ERROR for d in self.items)


def join_path(*parts: str | int) -> str:
    """``("group", "proxy", "filter", 1)`` -> ``group.proxy.filter[1]``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += "." + part
        else:
            out = part
    return out
