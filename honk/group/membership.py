"""Which names belong to a group: filter resolution (upstream groups.md).

Rules, in the order they apply:
  * A group with no filter line at all (no node filters, no nested groups,
    ``has_filter_lines`` false) receives every declared node.
  * Otherwise each node-filter line is an AND of its terms; lines are OR-ed.
    ``name(...)`` arguments are alternatives: bare (or ``full:``) is an exact
    match, ``keyword:`` a substring, ``regex:`` ``re.search``; all
    case-sensitive. ``subtag(...)`` applies the same argument forms to the tag
    of the subscription a node came from (``NodeSpec.subscription``); a node
    declared in the configuration has none, so ``subtag(...)`` never selects it
    and ``!subtag(...)`` always holds for it. ``!`` negates one term.
  * The built-in ``direct`` and ``block`` are outbounds, not pool members: a
    line admits one only when a non-negated ``name(...)`` term spells it
    exactly and the line's other terms hold for it. Keyword, regex and the
    all-nodes default never select them.
  * Node members keep node declaration order (builtins after the nodes);
    duplicate names bind the first declaration. Nested group tags follow, in
    their declared order; unknown tags contribute nothing. A node member stays
    the node even when a group has its name (a group may share a node's name,
    as upstream honk's config.dae does); a nested tag naming a node the group
    already selects is dropped.

Nothing here does I/O.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from honk.config.spec import BUILTIN_OUTBOUNDS, FilterTerm, GroupSpec, MatchArg, NodeFilter, NodeSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Membership:
    """A group's members: node (leaf) names then nested group names, in order."""

    nodes: tuple[str, ...]
    subgroups: tuple[str, ...]
    # (node, seconds): the ``[add_latency: ...]`` of the first filter line selecting the node,
    # for the nodes whose offset is not zero
    latency_offsets: tuple[tuple[str, float], ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        return self.nodes + self.subgroups

    def latency_offset(self, member: str) -> float:
        """Seconds a URLTest adds to ``member``'s ranking latency (0 for most)."""
        for name, offset in self.latency_offsets:
            if name == member:
                return offset
        return 0.0


# (name, is_builtin) -> bool
_ArgTest = Callable[[str, bool], bool]


def _compile_arg(group: str, kind: str, arg: MatchArg) -> _ArgTest:
    """A test of one argument against a name (for ``subtag``: against a subscription tag)."""
    key = arg.key.strip().lower()
    value = arg.value.strip()
    if key in ("", "full"):
        return lambda name, builtin: name == value
    if key == "keyword":
        return lambda name, builtin: not builtin and value in name
    if key == "regex":
        try:
            pattern = re.compile(arg.value)
        except re.error as exc:
            log.warning(
                "group %s: name(regex: ...) is not a valid regular expression (%s); it matches nothing",
                group,
                exc,
            )
            return lambda name, builtin: False
        return lambda name, builtin: not builtin and pattern.search(name) is not None
    log.warning(
        "group %s: %s(...) argument kind %r is not understood; it matches nothing", group, kind, arg.key
    )
    return lambda name, builtin: False


@dataclass(frozen=True, slots=True)
class _CompiledTerm:
    tests: tuple[_ArgTest, ...]
    negated: bool
    exact_names: frozenset[str]  # names a non-negated name() term spells exactly
    on_subscription: bool  # subtag(...): the tests read the node's subscription tag

    def holds(self, name: str, builtin: bool, subscription: str) -> bool:
        if self.on_subscription:
            # builtins and configured nodes come from no subscription
            hit = bool(subscription) and not builtin and any(t(subscription, False) for t in self.tests)
        else:
            hit = any(test(name, builtin) for test in self.tests)
        return hit is not self.negated


def _compile_term(group: str, term: FilterTerm) -> _CompiledTerm:
    tests = tuple(_compile_arg(group, term.kind, arg) for arg in term.args)
    exact: frozenset[str] = frozenset()
    if term.kind == "name" and not term.negated:
        exact = frozenset(a.value.strip() for a in term.args if a.key.strip().lower() in ("", "full"))
    return _CompiledTerm(tests, term.negated, exact, term.kind == "subtag")


def _line_admits(terms: tuple[_CompiledTerm, ...], name: str, builtin: bool, subscription: str) -> bool:
    if builtin and not any(name in t.exact_names for t in terms):
        return False
    return all(t.holds(name, builtin, subscription) for t in terms)


def compile_filters(group: str, filters: tuple[NodeFilter, ...]) -> Callable[..., bool]:
    """A predicate ``(name, is_builtin, subscription='') -> bool`` for OR-ed filter lines;
    ``subscription`` is the tag of the subscription the node came from."""
    lines = tuple(tuple(_compile_term(group, t) for t in line.terms) for line in filters)
    # an empty line (no terms) selects nothing, like an empty filter upstream
    lines = tuple(line for line in lines if line)

    def admits(name: str, builtin: bool, subscription: str = "") -> bool:
        return any(_line_admits(line, name, builtin, subscription) for line in lines)

    return admits


def resolve_membership(
    group: GroupSpec, nodes: Sequence[NodeSpec], group_names: Collection[str]
) -> Membership:
    """Compute ``group``'s members from the declared ``nodes``.

    ``group_names`` are the tags of every declared group; a nested tag not
    among them contributes nothing (logged).
    """
    # a duplicate name binds its first declaration, and so does that node's subscription tag
    origin: dict[str, str] = {}
    for n in nodes:
        if n.name not in BUILTIN_OUTBOUNDS:
            origin.setdefault(n.name, n.subscription)
    node_names = list(origin)
    subgroups: list[str] = []
    for tag in dict.fromkeys(group.subgroups):
        if tag == group.name:
            log.warning("group %s: nested group names itself; ignored", group.name)
        elif tag in group_names:
            subgroups.append(tag)
        else:
            log.warning("group %s: nested group %r does not exist; it contributes nothing", group.name, tag)

    if not group.filters and not group.subgroups and not group.has_filter_lines:
        return Membership(tuple(node_names), ())

    admits = compile_filters(group.name, group.filters)
    picked = [name for name in node_names if admits(name, False, origin[name])]
    picked += [name for name in BUILTIN_OUTBOUNDS if admits(name, True)]
    # a member name is one member: a nested group named like a node this group already selects
    # would be a second member under the same name (the node, selected by name(...), stays)
    shadowed = [tag for tag in subgroups if tag in picked]
    if shadowed:
        log.warning(
            "group %s: nested group %s has the name of a node it selects; the node is kept",
            group.name,
            ", ".join(shadowed),
        )
        subgroups = [tag for tag in subgroups if tag not in picked]
    return Membership(tuple(picked), tuple(subgroups), _latency_offsets(group, picked, origin))


def _latency_offsets(
    group: GroupSpec, picked: list[str], origin: dict[str, str]
) -> tuple[tuple[str, float], ...]:
    """Each picked node's offset from the first filter line that selects it, as dae's
    FilterAndAnnotate annotates a node with the first filter it hits."""
    if not any(line.add_latency for line in group.filters):
        return ()
    lines = [(compile_filters(group.name, (line,)), line.add_latency) for line in group.filters]
    out: list[tuple[str, float]] = []
    for name in picked:
        builtin = name in BUILTIN_OUTBOUNDS
        for admits, offset in lines:
            if admits(name, builtin, "" if builtin else origin.get(name, "")):
                if offset:
                    out.append((name, offset))
                break
    return tuple(out)
