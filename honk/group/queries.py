"""Read-only questions about a group's current selection, all answered with silent peeks
(no cursor, pin or winner moves; a Score retry alone applies its rank, GH-K-77): the setup
retry round, the cold UDP race, the UDP warm set, delay-test listings and chains.
"""

from __future__ import annotations

from collections.abc import Callable

from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.filter import health_family_of
from honk.group.identity import leaf_node_id
from honk.group.policy import Fallback, Score, Selector, URLTest
from honk.group.resolution import Resolver
from honk.group.structure import Group, Selection
from honk.group.view import NO_FLOW, Flow, distinct_selections
from honk.outbound.base import Outbound

RETRY_CANDIDATES = 3  # "one retry round over the latency-ordered top three candidates"


def retry_candidates(
    resolver: Resolver, group: str, network: Network, exclude: Outbound, flow: Flow
) -> list[Selection]:
    """For a URLTest setup failure: the top eligible members by rank, other than the leaf
    that failed, resolved to their leaves (at most :data:`RETRY_CANDIDATES`); for a Fallback
    one, its next eligible members in declaration order the same way. For a Score
    setup failure: one different permitted leaf, ranked (and applied) with the failed
    NodeId excluded first (GH-K-77); [] when no other live member remains."""
    g = resolver.structure.groups.get(group)
    if g is not None and isinstance(g.policy, Score):
        return _score_retry(resolver, g, network, exclude, flow)
    if g is None or not isinstance(g.policy, URLTest | Fallback):
        return []
    view = resolver.view(g, network)
    out: list[Selection] = []
    for member in g.policy.ranked(view, RETRY_CANDIDATES + 1):
        selection = view.selection(member)
        if selection is not None and selection.leaf is not exclude and len(out) < RETRY_CANDIDATES:
            out.append(selection)
    return out


def _score_retry(
    resolver: Resolver, group: Group, network: Network, exclude: Outbound, flow: Flow
) -> list[Selection]:
    excluded = frozenset((leaf_node_id(exclude),))
    view = resolver.view(group, network, flow=flow)
    winner = group.policy.rank(view, True, exclude=excluded).winner  # type: ignore[attr-defined]
    selection = view.selection(winner.name) if winner is not None else None
    if selection is None or selection.leaf is exclude:
        return []
    return [selection]


def cold_udp_candidates(resolver: Resolver, name: str) -> list[Selection]:
    """The leaves a cold UDP plan of route target ``name`` prepares in a race (GH-G-01): when
    ``name`` is a URLTest with no UDP pin and none of its eligible members has a usable UDP
    measurement, its eligible members by the policy's ranking (TCP's, which its UDP pick
    mirrors while UDP is unmeasured), resolved to distinct proxy leaves that carry UDP.
    [] for every other plan, and when fewer than two such leaves remain: it prepares the
    one leaf its selection gives. The caller passes only a route's own target (top level)."""
    g = resolver.structure.groups.get(name)
    if g is None or not isinstance(g.policy, URLTest) or Network.UDP in g.policy.fixed():
        return []
    view = resolver.view(g, Network.UDP)
    if any(c.eligible and c.udp_metric is not None for c in view.all()):
        return []  # measured: the URLTest's own UDP pick, one leaf
    out = distinct_selections(
        view,
        g.policy.ranked(view, len(g.policy.members)),
        len(g.policy.members),
        lambda leaf: leaf.protocol not in ("direct", "block") and leaf.capabilities.udp,
    )
    return out if len(out) > 1 else []


def udp_warm_leaves(
    resolver: Resolver, name: str, family: Family, limit: int, accept: Callable[[Outbound], bool]
) -> list[Outbound]:
    """Group ``name``'s top ``limit`` distinct leaves whose health family is ``family`` and
    that ``accept`` takes, in the order the group would serve UDP now (the UDP warm set per
    address family, GH-I-06; a leaf is judged and counted in its own health family only,
    GH-D-07), read with silent peeks: a Selector's UDP choice (alone: a Selector
    substitutes nothing), a URLTest's rank (its UDP pin first), a Score group's rank
    order, any other policy's eligible members in configuration order. A sub-group member
    counts as the leaf it picks."""
    g = resolver.structure.groups.get(name)
    if g is None or limit <= 0:
        return []
    view = resolver.view(g, Network.UDP)
    policy = g.policy
    if isinstance(policy, Selector):
        chosen = policy.chosen(Network.UDP)
        order = [chosen] if chosen is not None else []
    elif isinstance(policy, URLTest):
        pinned = policy.fixed().get(Network.UDP)
        order = ([pinned] if pinned is not None else []) + policy.ranked(view, len(policy.members))
    elif isinstance(policy, Score):
        order = [member.name for member in policy.rank(view, False).order]
    else:
        order = [c.member for c in view.all() if c.eligible]
    in_family = lambda leaf: health_family_of(leaf) == family and accept(leaf)  # noqa: E731
    return [selection.leaf for selection in distinct_selections(view, order, limit, in_family)]


def delay_test_members(resolver: Resolver, group: str, network: Network) -> list[tuple[str, Outbound]]:
    """One (member tag, current leaf) pair per member that resolves, unchosen ones included."""
    structure = resolver.structure
    out = []
    owner = structure.get(group)
    for member in owner.membership.members:
        if structure.is_leaf(owner, member):
            out.append((member, structure.outbounds[member]))
            continue
        selection = resolver.walk(member, network, (group,), 1, True, NO_FLOW).selection
        if selection is not None:
            out.append((member, selection.leaf))
    return out


def selection_chain(resolver: Resolver, group: str, network: Network) -> tuple[str, ...]:
    """The current chain from ``group`` to its leaf (a peek), or () when nothing resolves."""
    selection = resolver.walk(group, network, (), 0, True, NO_FLOW).selection
    return selection.chain if selection is not None else ()
