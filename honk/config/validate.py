"""Cross-reference checks over the built parts, after includes are merged.

* nodes: a user node may not be called ``direct`` or ``block``
  (``reserved-name``); two nodes with the same derived id are one endpoint
  declared twice (``duplicate-node``); equal names are allowed but warned
  (``duplicate-name``: the first declared wins lookups).
* inbounds: names and listen addresses are unique.
* groups: at most ``MAX_TOP_LEVEL_GROUPS``; unique names that collide with no
  node or builtin; ``final`` names an outbound; ``default`` names a member;
  nested tags name groups (``unknown-subgroup`` warning otherwise).
* routing: every target and the fallback name an outbound.
"""

from __future__ import annotations

import re

from honk.config.build import GroupParts
from honk.config.spec import (
    BUILTIN_OUTBOUNDS,
    MAX_TOP_LEVEL_GROUPS,
    GroupSpec,
    InboundSpec,
    NodeFilter,
    NodeSpec,
)
from honk.config.tree import Entry, Sink


def check_nodes(nodes: list[tuple[NodeSpec, Entry]], sink: Sink) -> list[NodeSpec]:
    kept: list[NodeSpec] = []
    ids: set = set()
    names: set[str] = set()
    for node, e in nodes:
        if node.name in BUILTIN_OUTBOUNDS:
            sink.error("reserved-name", e.path, "'direct' and 'block' are built in; rename the node", e.loc)
            continue
        if node.id in ids:
            sink.error(
                "duplicate-node",
                e.path,
                "another node has the same endpoint, credentials and dial shape",
                e.loc,
            )
            continue
        if node.name in names:
            sink.warning(
                "duplicate-name", e.path, "another node has this name; lookups use the first declared", e.loc
            )
        ids.add(node.id)
        names.add(node.name)
        kept.append(node)
    return kept


def check_inbounds(inbounds: list[InboundSpec], sink: Sink) -> None:
    names: set[str] = set()
    listens: set[tuple[str, int]] = set()
    for inbound in inbounds:
        path = f"inbound.{inbound.name}"
        if inbound.name in names:
            sink.error("duplicate-inbound", path, "another inbound has this name", inbound.loc)
        if inbound.port and (inbound.host, inbound.port) in listens:
            sink.error("duplicate-listen", path, "another inbound listens on the same address", inbound.loc)
        names.add(inbound.name)
        listens.add((inbound.host, inbound.port))


def check_groups(parts: list[GroupParts], nodes: list[NodeSpec], sink: Sink) -> list[GroupSpec]:
    node_names = {n.name for n in nodes}
    if len(parts) > MAX_TOP_LEVEL_GROUPS:
        extra = parts[MAX_TOP_LEVEL_GROUPS]
        sink.error(
            "too-many-groups",
            extra.decl.path,
            f"at most {MAX_TOP_LEVEL_GROUPS} groups are allowed",
            extra.decl.loc,
        )
    seen: set[str] = set()
    kept: list[GroupParts] = []
    for p in parts:
        name = p.spec.name
        if not name:
            sink.error("invalid-value", p.decl.path, "a group needs a name", p.decl.loc)
            continue
        if name in seen:
            sink.error("duplicate-group", p.decl.path, "another group has this name", p.decl.loc)
            continue
        if name in BUILTIN_OUTBOUNDS or name in node_names:
            sink.error(
                "name-collision",
                p.decl.path,
                "group name is already used by a node or a builtin outbound",
                p.decl.loc,
            )
            continue
        seen.add(name)
        kept.append(p)
    outbounds = set(BUILTIN_OUTBOUNDS) | node_names | seen
    for p in kept:
        for tag, e in p.subgroup_entries:
            if tag not in seen:
                sink.warning("unknown-subgroup", e.path, "nested group tag names no group", e.loc)
        g = p.spec
        if g.final is not None and g.final not in outbounds and p.final_entry is not None:
            e = p.final_entry
            sink.error("unknown-final", e.path, "final names no node, group or builtin outbound", e.loc)
        if g.default is not None and p.default_entry is not None:
            if g.default not in members(g, nodes):
                e = p.default_entry
                sink.error("unknown-default", e.path, "default names no member of this group", e.loc)
    return [p.spec for p in kept]


def check_targets(targets: list[tuple[str, Entry]], outbounds: set[str], sink: Sink) -> None:
    for target, e in targets:
        if target not in outbounds:
            sink.error("unknown-outbound", e.path, "target names no node, group or builtin outbound", e.loc)


# --- membership -------------------------------------------------------------------------


def _arg_matches(key: str, value: str, name: str, builtin: bool) -> bool:
    if key == "":
        return name == value
    if builtin:
        return False  # keyword:/regex: never select direct or block
    if key == "keyword":
        return value in name
    if key == "regex":
        try:
            return re.search(value, name) is not None
        except (re.error, RecursionError, OverflowError):
            return False
    return False


def filter_matches(f: NodeFilter, name: str, *, builtin: bool = False) -> bool:
    spelled = False
    for term in f.terms:
        if term.kind == "name":
            hit = any(_arg_matches(a.key, a.value, name, builtin) for a in term.args)
            if hit and not term.negated and any(a.key == "" and a.value == name for a in term.args):
                spelled = True
        else:  # subtag: no node comes from a subscription yet
            hit = False
        if hit == term.negated:
            return False
    return spelled if builtin else True


def members(group: GroupSpec, nodes: list[NodeSpec]) -> set[str]:
    """Names a group may pick: selected nodes, nested tags and spelled builtins."""
    if not group.has_filter_lines:
        return {n.name for n in nodes}
    out = set(group.subgroups)
    for f in group.filters:
        out.update(n.name for n in nodes if filter_matches(f, n.name))
        out.update(b for b in BUILTIN_OUTBOUNDS if filter_matches(f, b, builtin=True))
    return out
