"""Resolution: from an asked name down to one leaf, through nested groups.

* A group asks its policy for a member through a :class:`View`; a member that is a group
  contributes exactly one candidate, its own pick for the same network; leaves are judged by
  :mod:`honk.group.filter`, each in its own health family (the family its server is reached
  on, GH-D-07, GH-K-01): the flow's target family never enters a judgement, so nothing here
  is keyed by a family. A Selector resolves only its chosen member, never a sibling.
* A group without an eligible pick continues with its own ``final``; without one, a group
  whose only leaf (through the current Selector choices) is TCP-dead still serves that leaf
  for TCP, as a last resort with a warning at most every 60 s; otherwise the failure
  propagates to the parent, which does the same. Nothing falls back to ``direct``.
* The walk is bounded: the root is depth 0 and a group deeper than
  :data:`~honk.group.structure.MAX_NESTING_DEPTH` contributes no candidate; a group met again
  in one walk (a cycle through finals) contributes none either.
* A peek changes nothing a policy remembers. Its result is cached per group and path until
  health or any policy state changes, unless the walk says it is not :attr:`Walked.cacheable`:
  a last resort was served below (its warning is due again later) or a Score group decided
  (its pick depends on the flow's target and on evidence). Serving is the peek's path, then
  each group on it commits its hop; an uncacheable walk is decided again with commit.
* The flow's context (:class:`Flow`: Score target, destination) is passed down explicitly.
* A served hop that replaces a remembered one (a URLTest winner, a Fallback pin) is reported
  as a :class:`~honk.group.events.SelectionMoved` in the manager's outbox.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from honk.core.clock import Clock
from honk.core.errors import NoRoute
from honk.core.net import Network
from honk.group.events import Outbox
from honk.group.filter import HealthFilter
from honk.group.identity import leaf_node_id
from honk.group.policy import Candidate, Epoch, Fallback, Score, Selector, URLTest
from honk.group.score.keys import NodeId
from honk.group.structure import MAX_NESTING_DEPTH, Group, Selection, Structure
from honk.group.view import NO_FLOW, Flow, View
from honk.outbound.base import Outbound

log = logging.getLogger(__name__)

LAST_RESORT_WARNING_INTERVAL = 60.0  # seconds; "rate-limited to once per 60 s per group"


@dataclass(frozen=True, slots=True)
class Walked:
    """A walk's selection (None: nothing resolved) and whether it may be cached: no last resort
    was served and no Score group decided anywhere below."""

    selection: Selection | None
    cacheable: bool = True


class Resolver:
    """Walks, judges and caches for one manager; its policies' state changes only here and in
    the manager's writes, on the event loop's thread."""

    def __init__(
        self, structure: Structure, health: HealthFilter, clock: Clock | None, epoch: Epoch, outbox: Outbox
    ) -> None:
        self.structure = structure
        self.health = health
        self.clock = clock
        self.epoch = epoch  # bumped by any policy state change
        self.outbox = outbox
        self._leaf_ids: dict[str, NodeId] = {}  # leaf name -> NodeId (the outbounds never change)
        self._reaches_score: dict[str, bool] = {}  # group -> a Score group is at or below it
        self._judged: dict[tuple, tuple] = {}  # leaf members: (its node's version, Candidate)

    def view(
        self, group: Group, network: Network, chain: tuple[str, ...] | None = None, flow: Flow = NO_FLOW
    ) -> View:
        """A peeking view of a top-level ``group`` (the chain defaults to the group alone)."""
        return View(self, group, network, chain or (group.spec.name,), 0, True, flow)

    def resolve(self, name: str, network: Network, peek: bool, flow: Flow) -> Selection:
        """Resolve a route target to one leaf; :class:`NoRoute` when none results."""
        structure = self.structure
        if name not in structure.groups and name not in structure.outbounds:
            raise NoRoute(f"{name!r} is neither a group nor an outbound")
        selection = self.walk(name, network, (), 0, peek, flow).selection
        if selection is None:
            raise NoRoute(f"{name}: no eligible {network.value} member and no usable final")
        return selection

    def walk(
        self, name: str, network: Network, chain: tuple[str, ...], depth: int, peek: bool, flow: Flow
    ) -> Walked:
        group = self.structure.groups.get(name)
        if group is None:
            leaf = self.structure.outbounds.get(name)
            return Walked(None if leaf is None else Selection(leaf, (*chain, name)))
        if name in chain or depth > MAX_NESTING_DEPTH:
            log.debug("group %s: skipped (%s)", name, "revisited" if name in chain else "too deep")
            return Walked(None)
        if not peek and self._score_below(name):
            # one applied rank per Score group: a path through one is never cached, so serving
            # by peeking first would only rank it again
            return self._decide(group, name, network, chain, depth, False, flow)
        if not peek:
            # Serving = the peek's path, then each group on it commits its hop (a URLTest its
            # winner, a LoadBalance its cursor, a Fallback its pin): the same result as deciding
            # again, without ranking every level twice. A last resort is decided again, to warn,
            # and so is a path through a Score group (its rank is applied with the target).
            peeked = self.walk(name, network, chain, depth, True, flow)
            if not peeked.cacheable:
                return self._decide(group, name, network, chain, depth, False, flow)
            if peeked.selection is not None:
                self._commit(peeked.selection.chain[len(chain) :], network, chain, depth, flow)
            return peeked
        key = (network, chain)
        stamp = self.stamp()
        hit = group.cache.get(key)
        if hit is not None and hit[0] == stamp:
            if hit[1] is None:
                return Walked(None)
            leaf, suffix = hit[1]
            return Walked(Selection(leaf, chain + suffix))
        walked = self._decide(group, name, network, chain, depth, True, flow)
        if walked.cacheable:
            result = walked.selection
            group.cache[key] = (stamp, None if result is None else (result.leaf, result.chain[len(chain) :]))
        return walked

    def _decide(
        self,
        group: Group,
        name: str,
        network: Network,
        chain: tuple[str, ...],
        depth: int,
        peek: bool,
        flow: Flow,
    ) -> Walked:
        chain = (*chain, name)
        policy = group.policy
        view = View(self, group, network, chain, depth, peek, flow)
        # a Score rank is applied inside its pick (it needs the flow's target); any other pick is
        # applied by commit, which says whether it replaced what the group served before
        member = policy.pick(view, commit=not peek and isinstance(policy, Score))
        if not peek and member is not None and policy.commit(network, member):
            self._moved(group, network)
        cacheable = not isinstance(policy, Score)  # its pick depends on the target and on evidence
        if member is not None:
            if isinstance(policy, Selector) or peek or self.structure.is_leaf(group, member):
                selection = view.selection(member)
            else:
                applied = self.walk(member, network, chain, depth + 1, False, flow)  # apply the pick
                selection, cacheable = applied.selection, cacheable and applied.cacheable
            if selection is not None:
                return Walked(selection, cacheable and view.cacheable)
        cacheable = cacheable and view.cacheable
        final = group.spec.final
        if final is not None:
            walked = self.walk(final, network, chain, depth + 1, peek, flow)
            return Walked(walked.selection, cacheable and walked.cacheable)
        if network is Network.TCP:
            selection = self._last_resort(group, chain, depth, peek)
            return Walked(selection, cacheable and selection is None)  # a last resort is never cached
        return Walked(None, cacheable)

    def _moved(self, group: Group, network: Network) -> None:
        self.outbox.moved(group.spec.name, network, group.spec.interrupt_connections)

    def _last_resort(self, group: Group, chain: tuple[str, ...], depth: int, peek: bool) -> Selection | None:
        """The sole-leaf TCP last resort: a group whose only leaf, through the current Selector
        choices, is TCP-dead still serves it (health unchanged), never a sibling or ``direct``."""
        leaves: dict[str, tuple[str, ...]] = {}
        self._chosen_leaves(group.spec.name, chain[:-1], leaves, depth)
        if len(leaves) != 1:
            return None
        ((leaf_name, path),) = leaves.items()
        if not peek and self.clock is not None:
            now = self.clock.now()
            if group.warned_at is None or now - group.warned_at >= LAST_RESORT_WARNING_INTERVAL:
                group.warned_at = now
                log.warning(
                    "group %s: its only node %s is down; serving it as the last resort",
                    group.spec.name,
                    leaf_name,
                )
        return Selection(self.structure.outbounds[leaf_name], path)

    def _chosen_leaves(
        self, name: str, chain: tuple[str, ...], out: dict[str, tuple[str, ...]], depth: int
    ) -> None:
        """Leaves below ``name`` reachable through the current Selector choices (every member
        of other policies), with the path to each."""
        structure = self.structure
        group = structure.groups.get(name)
        chain = (*chain, name)
        if group is None:
            if name in structure.outbounds:
                out.setdefault(name, chain)
            return
        if name in chain[:-1] or depth > MAX_NESTING_DEPTH or len(out) > 1:
            return
        if isinstance(group.policy, Selector):
            chosen = group.policy.chosen(Network.TCP)
            members: tuple[str, ...] = (chosen,) if chosen is not None else ()
        else:
            members = group.membership.members
        for member in members:
            if structure.is_leaf(group, member):
                out.setdefault(member, (*chain, member))
            else:
                self._chosen_leaves(member, chain, out, depth + 1)

    def _score_below(self, name: str) -> bool:
        """Whether ``name`` is a Score group or reaches one through its members or final."""
        known = self._reaches_score.get(name)
        if known is None:
            groups = self.structure.groups
            self._reaches_score[name] = False  # a cycle through finals reaches nothing new
            group = groups[name]
            known = isinstance(group.policy, Score) or any(
                self._score_below(m)
                for m in (*group.policy.members, *([group.spec.final] if group.spec.final else ()))
                if m in groups and not (m in group.leaves and m != group.spec.final)
            )
            self._reaches_score[name] = known
        return known

    def _commit(
        self, path: tuple[str, ...], network: Network, chain: tuple[str, ...], depth: int, flow: Flow
    ) -> None:
        """Each group on ``path`` remembers the hop it served. A final edge commits nothing; a
        final that is also a member was the policy's pick only if that member is eligible."""
        for step, (here, hop) in enumerate(zip(path, path[1:], strict=False)):
            group = self.structure.groups.get(here)
            if group is None or hop not in group.positions:
                continue
            if hop == group.spec.final:
                prefix = (*chain, *path[: step + 1])
                view = View(self, group, network, prefix, depth + step, True, flow)
                if not view.evaluate(hop).eligible:
                    continue  # reached through the final edge
            if group.policy.commit(network, hop):
                self._moved(group, network)

    def stamp(self) -> tuple[int, int, int]:
        """What a cached result is valid under: policy state and health unchanged."""
        return (self.epoch.value, *self.health.version())

    def leaf_id(self, name: str) -> NodeId | None:
        known = self._leaf_ids.get(name)
        if known is None and name in self.structure.outbounds:
            known = self._leaf_ids[name] = leaf_node_id(self.structure.outbounds[name])
        return known

    def leaf_candidate(self, group: Group, member: str, network: Network) -> Candidate:
        """A leaf member as ``group`` sees it, remembered until that node's health changes (policy
        state does not change it, so a LoadBalance cursor moving judges no leaf again)."""
        leaf = self.structure.outbounds[member]
        version = self.health.leaf_version(leaf)
        key = (group.spec.name, member, network)
        known = self._judged.get(key)
        if known is None or known[0] != version:
            known = self._judged[key] = (
                version,
                self.candidate(group, member, group.positions[member], leaf, network),
            )
        return known[1]

    def candidate(self, group: Group, member: str, index: int, leaf: Outbound, network: Network) -> Candidate:
        """``member`` (resolved to ``leaf``) as ``group`` sees it: judged and ranked in the leaf's
        own health family (GH-D-07, GH-K-01)."""
        health, name = self.health, group.spec.name
        eligible = health.eligible(leaf, network, name, member)
        if eligible and isinstance(group.policy, URLTest):  # only URLTest ranks
            rank_by = group.policy.rank_by
            # dae's add_latency: the member's sorting latency is its measured one plus the offset
            # of its filter line, unclamped (AliveDialerSet: rawLatency + dialerToLatencyOffset)
            offset = group.membership.latency_offset(member)
            metric = health.tcp_metric(leaf, name, member, rank_by)
            udp_metric = health.udp_metric(leaf, rank_by) if network is Network.UDP else None
            return Candidate(
                member,
                index,
                True,
                metric=metric + offset if metric is not None else None,
                udp_metric=udp_metric + offset if udp_metric is not None else None,
                demoted=health.demoted(leaf),
            )
        if eligible and isinstance(group.policy, Fallback):  # a Fallback leaves a struck pin
            return Candidate(member, index, True, demoted=health.demoted(leaf))
        return Candidate(member, index, eligible)
