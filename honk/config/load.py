"""Configuration loading: text or file -> validated :class:`Spec`.

``load_file`` picks the format by extension (``.dae``, ``.toml``, ``.json``),
follows includes, and either returns a Spec (warnings and infos in
``spec.diagnostics``) or raises :class:`ConfigError` carrying every diagnostic,
errors first. ``load_text`` does the same for a string; includes resolve
against ``base_dir`` and are an error without one.

Includes (``include { ... }`` in dae, top-level ``include = [...]`` in
TOML/JSON): each pattern is a path or glob relative to the entry file's
directory; matches load in lexical order per pattern, and only files with the
entry's format extension are read. The entry file's own sections merge first,
then each included file followed by its own includes. Collections append;
later scalar settings override earlier ones. Loading one file twice (a cycle
or a repeat) is ``include-cycle``; a match outside the entry directory
(after resolving symlinks) is ``include-outside``.

A relative ``global.data_dir`` is resolved against the entry file's directory
(``base_dir`` for ``load_text``, else the working directory) and stored
absolute.
"""

from __future__ import annotations

import glob
import os

from honk.config import dae, structured
from honk.config import values as V
from honk.config.assets import build_assets
from honk.config.build import (
    build_clash_api,
    build_global,
    build_groups,
    build_inbounds,
    build_nodes,
    build_routing,
    check_cache_file,
    merge,
    split_fallback_must,
)
from honk.config.diagnostics import ConfigError, Severity, SourceLoc
from honk.config.dns import build_dns
from honk.config.expr import MUST_RULES
from honk.config.geodata import check_geodata
from honk.config.spec import BUILTIN_OUTBOUNDS, DIRECT_OUTBOUND, RoutingSpec, Spec
from honk.config.tree import Doc, Sink
from honk.config.validate import (
    check_groups,
    check_inbounds,
    check_nodes,
    check_subscriptions,
    check_targets,
    detour_targets,
)

__all__ = ["load_file", "load_text", "FORMATS"]

FORMATS = {".dae": "dae", ".toml": "toml", ".json": "json"}
_EXTENSION = {fmt: ext for ext, fmt in FORMATS.items()}


def load_file(path: str | os.PathLike[str]) -> Spec:
    source = os.fspath(path)
    sink = Sink()
    fmt = FORMATS.get(os.path.splitext(source)[1].lower())
    if fmt is None:
        sink.error(
            "unknown-format", "document", "configuration files end in .dae, .toml or .json", SourceLoc(source)
        )
        raise ConfigError(sink.items)
    text = _read_text(source, sink, SourceLoc(source), "document")
    if text is None:
        raise ConfigError(sink.items)
    base_dir = os.path.dirname(os.path.abspath(source))
    return _load(text, fmt, source, base_dir, os.path.realpath(source), sink)


def load_text(text: str, fmt: str, *, source: str = "<string>", base_dir: str | None = None) -> Spec:
    sink = Sink()
    fmt = fmt.lower().lstrip(".")
    if fmt not in _EXTENSION:
        sink.error("unknown-format", "document", "format must be dae, toml or json", SourceLoc(source))
        raise ConfigError(sink.items)
    return _load(text, fmt, source, base_dir, None, sink)


def _read_text(path: str, sink: Sink, loc: SourceLoc, key_path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        sink.error("unreadable", key_path, "file cannot be read", loc)
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        sink.error("encoding", key_path, "file is not valid UTF-8", loc)
        return None


def _read_doc(text: str, fmt: str, source: str, sink: Sink, *, entry: bool) -> Doc | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        sink.error("encoding", "document", "text is not valid Unicode", SourceLoc(source))
        return None
    if fmt == "dae":
        doc, has_block = dae.read(text, source, sink)
        if entry and not has_block:
            sink.error(
                "empty-document", "document", "a configuration needs at least one section", SourceLoc(source)
            )
        return doc
    return structured.read(text, fmt, source, sink)


def _load(text: str, fmt: str, source: str, base_dir: str | None, entry_real: str | None, sink: Sink) -> Spec:
    docs: list[Doc] = []
    first = _read_doc(text, fmt, source, sink, entry=True)
    if first is not None:
        docs.append(first)
        seen = {entry_real} if entry_real else set()
        _expand(first, fmt, base_dir, seen, docs, sink)
    spec = _build(merge(docs) if docs else Doc(source, fmt), base_dir or os.getcwd(), source, sink)
    if sink.has_errors:
        raise ConfigError(sink.items)
    return spec


def _expand(doc: Doc, fmt: str, base_dir: str | None, seen: set[str], docs: list[Doc], sink: Sink) -> None:
    for e in doc.includes:
        pattern = V.get_str(e, sink)
        if not pattern:
            continue
        if base_dir is None:
            sink.error(
                "include-without-base", e.path, "includes need a base directory to resolve against", e.loc
            )
            continue
        root = os.path.realpath(base_dir)
        full = pattern if os.path.isabs(pattern) else os.path.join(base_dir, pattern)
        try:
            matches = sorted(glob.glob(full))
        except (OSError, ValueError):
            matches = []
        if not matches:
            sink.warning("include-not-found", e.path, "include pattern matches no file", e.loc)
            continue
        for match in matches:
            if not match.endswith(_EXTENSION[fmt]) or not os.path.isfile(match):
                continue
            real = os.path.realpath(match)
            if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
                sink.error("include-outside", e.path, "included file is outside the entry directory", e.loc)
                continue
            if real in seen:
                sink.error("include-cycle", e.path, "file is already loaded (include cycle or repeat)", e.loc)
                continue
            seen.add(real)
            text = _read_text(match, sink, e.loc, e.path)
            if text is None:
                continue
            child = _read_doc(text, fmt, match, sink, entry=False)
            if child is None:
                continue
            docs.append(child)
            _expand(child, fmt, base_dir, seen, docs, sink)


def _build(doc: Doc, base_dir: str, source: str, sink: Sink) -> Spec:
    global_ = build_global(doc.global_, base_dir, sink)
    inbounds = build_inbounds(doc.inbounds, sink)
    check_inbounds(inbounds, sink)
    nodes = check_nodes(build_nodes(doc.nodes, sink), sink)
    subscriptions = check_subscriptions(doc.subscriptions, sink, base_dir)
    groups = check_groups(
        build_groups(doc.groups, global_.check_tolerance, sink),
        nodes,
        sink,
        subscriptions=bool(subscriptions),
    )
    rules, fallback, fallback_entry = build_routing(doc.rules, doc.fallbacks, sink)
    fallback, fallback_must, fallback_mark = split_fallback_must(fallback, fallback_entry, sink)
    check_geodata(rules, global_.data_dir, sink)
    outbounds = set(BUILTIN_OUTBOUNDS) | {n.name for n in nodes} | {g.name for g in groups}
    targets = [(r.outbound, e) for r, e in rules if r.outbound != MUST_RULES]
    for r, e in rules:
        # dae's `-> direct(mark: 0x800)` marks the direct dial's socket; on another outbound the
        # mark would reach only the flows its pick sends direct: refused, never half honoured
        if r.mark is not None and r.outbound != DIRECT_OUTBOUND:
            sink.error(
                "unsupported-mark",
                e.path,
                f"a per-rule mark (mark: {r.mark:#x}) is honoured on direct only, not on {r.outbound!r}",
                e.loc,
            )
    if fallback_entry is not None:
        targets.append((fallback, fallback_entry))
        if fallback_mark is not None and fallback != DIRECT_OUTBOUND:
            sink.error(
                "unsupported-mark",
                fallback_entry.path,
                f"a fallback mark (mark: {fallback_mark:#x}) is honoured on direct only, not on {fallback!r}",
                fallback_entry.loc,
            )
    dns, dns_targets = build_dns(doc.dns, sink, global_.data_dir)
    check_targets(targets + detour_targets(doc.subscriptions) + dns_targets, outbounds, sink)
    clash_api = build_clash_api(doc.clash_api, sink)
    assets = build_assets(doc.assets, outbounds, sink)
    check_cache_file(doc.cache_file, sink)
    return Spec(
        global_=global_,
        inbounds=tuple(inbounds),
        nodes=tuple(nodes),
        groups=tuple(groups),
        routing=RoutingSpec(tuple(r for r, _ in rules), fallback, fallback_must, fallback_mark),
        clash_api=clash_api,
        subscriptions=tuple(subscriptions),
        dns=dns,
        assets=assets,
        source=source,
        diagnostics=tuple(d for d in sink.items if d.severity is not Severity.ERROR),
    )


def summary(spec: Spec) -> str:
    """One line of what a loaded configuration holds (``honk check``, ``POST /v1/config/check``)."""
    warnings = sum(1 for d in spec.diagnostics if d.severity.value == "warning")
    return (
        f"{len(spec.inbounds)} inbound(s), {len(spec.nodes)} node(s), {len(spec.groups)} group(s), "
        f"{len(spec.routing.rules)} rule(s), fallback {spec.routing.fallback}; {warnings} warning(s)"
    )
