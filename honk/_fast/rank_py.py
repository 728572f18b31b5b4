"""Score's per-member read of one rank, and the reliability-first order (GH-K-04, 06, 29, 46).

A rank of a Score group reads every live member on every flow: its blended cells, its open
failure episodes, its utility. That loop and the order are the kernel; the decisions made on
the ordered candidates stay in ``honk.group.score.ranker``.

Order (GH-K-06, no randomness): the members whose reliability lower bound is within ``band``
of the best form the front, ordered by fresh utility (None last: missing performance is never a
gain, GH-K-31), then reliability, then configuration order. The rest follow in bands of the same
width below the front, each band ordered the same way: a wider gap is real evidence, but two
members behind the front whose bounds differ by a rounding error (each one success, decayed from
a slightly different time) are as reliable as each other, and must compete on utility, not on
the seventh decimal. The configuration index makes every key unique.

This file is plain Python and also the Cython source of ``rank_c`` (types in ``rank_c.pxd``);
keep the two in step.
"""

try:
    import cython
except ModuleNotFoundError:  # an install without Cython: the twin's stand-in
    from honk._fast import _cython as cython

if not cython.compiled:  # the compiled build cimports the compiled cell kernel (rank_c.pxd)
    from honk._fast.cell_py import blend, qualified  # read a cell of either build

EXACT_LAYER = 2  # the exact layer's index in a read's (global, family, exact) cells
_MAX_BANDS = 1 << 30  # the order's band index saturates here (reliability spans [0, 1])


class Candidate:
    """One live member as a rank sees it (built per member per rank)."""

    def __init__(
        self,
        member: object,
        index: int,
        reliability: float,
        utility: object,
        qualified: bool,
        unresolved: bool = False,
        recent_failure: bool = False,
        node_failure: bool = False,
        episodes: object = (),
        last_failure: object = None,
        cleared: bool = False,
    ) -> None:
        self.member = member
        self.index = index  # configuration order
        self.reliability = reliability
        self.utility = utility  # None: no fresh performance; set once (the two below copy it)
        self.rated = utility is not None  # typed copies for the compiled order's comparisons
        self.utility_value = 0.0 if utility is None else utility
        self.qualified = qualified
        self.unresolved = unresolved  # an open failure episode in one of its layers
        self.recent_failure = recent_failure  # ... whose newest failure is within the recent window
        self.node_failure = node_failure  # ... in an aggregate layer: node-scoped, every target sees it
        self.episodes = episodes  # the open episodes: (layer, cohort state)
        self.last_failure = last_failure  # the newest failure time the evidence knows among them
        self.backoff = None  # the exploration backoff as of this rank (the ranker sets it)
        self.cleared = cleared  # every open episode accepted an RX after its fence

    def __repr__(self) -> str:
        return f"Candidate(index={self.index}, reliability={self.reliability:.3f}, utility={self.utility})"


def _candidate(member, index, reliability, utility, qualified):  # typed in rank_c.pxd
    """A candidate without an open episode (the compiled build skips the argument parsing)."""
    if not cython.compiled:
        return Candidate(member, index, reliability, utility, qualified)
    c = Candidate.__new__(Candidate)
    c.member = member
    c.index = index
    c.reliability = reliability
    c.utility = utility
    c.rated = utility is not None
    c.utility_value = 0.0 if utility is None else utility
    c.qualified = qualified
    c.episodes = ()
    return c


def live(members: object, exclude: object) -> tuple:
    """``(alive, nodes, dead)``: the live members of ``members`` as ``(configuration index,
    member)``, their nodes in that order, and how many considered members were dead. A member is
    ``(name, node, alive)``; one whose node is in ``exclude`` is not considered at all."""
    alive = []
    nodes = []
    dead = 0
    index = 0
    excluding = bool(exclude)
    for member in members:
        if not excluding or member[1] not in exclude:
            if member[2]:
                alive.append((index, member))
                nodes.append(member[1])
            else:
                dead += 1
        index += 1
    return alive, nodes, dead


def aligned(nodes: list, row: dict) -> object:
    """``row``'s entry for each of ``nodes`` (None where it has none), in their order; None when
    ``row`` is empty. A rank keeps this for the aggregate rows, which change far less often
    than it reads them."""
    if not row:
        return None
    out = []
    for node in nodes:
        out.append(row.get(node))
    return out


def placed(row: dict, position: dict, aliases: list, count) -> object:  # count: typed in rank_c.pxd
    """What :func:`aligned` gives for the ``count`` nodes whose first indices are ``position``
    (``aliases``: each later listing of a node, as ``(index, first index)``), walking ``row``
    (a target's few entries) instead of the nodes; None when no node of ``row`` is listed."""
    out = None
    for node, entry in row.items():
        i = position.get(node)
        if i is not None:
            if out is None:
                out = [None] * count
            out[i] = entry
    if out is not None:
        for i, j in aliases:
            out[i] = out[j]
    return out


def candidates(
    alive: list,
    utilities: object,
    globs,
    families,
    exacts,
    glob_opens,
    family_opens,  # lists or None:
    exact_opens,
    now: float,
    recent_window: float,
) -> list:  # typed in rank_c.pxd
    """A :class:`Candidate` per ``(configuration index, member)`` of ``alive``, in its order.

    ``utilities`` are in ``alive``'s order, and so is each layer's list (:func:`aligned`,
    :func:`placed`; None: no member has an entry there): the member's cell of that layer, and
    its open failure episode state there (:meth:`Cohorts.open_states`). A failure within
    ``recent_window`` of ``now`` is recent (GH-K-46)."""
    out = []
    position = 0
    any_open = glob_opens is not None or family_opens is not None or exact_opens is not None
    for index, member in alive:
        utility = utilities[position]
        glob = globs[position] if globs is not None else None
        family = families[position] if families is not None else None
        exact = exacts[position] if exacts is not None else None
        c = _candidate(
            member, index, blend(glob, family, exact, now), utility, qualified(glob, family, exact, now)
        )
        if any_open:
            _open_episodes(
                c,
                glob_opens[position] if glob_opens is not None else None,
                family_opens[position] if family_opens is not None else None,
                exact_opens[position] if exact_opens is not None else None,
                glob,
                family,
                exact,
                now,
                recent_window,
            )
        position += 1
        out.append(c)
    return out


def _open_episodes(
    c: Candidate,
    glob_episode: object,
    family_episode: object,
    exact_episode: object,
    glob: object,
    family: object,
    exact: object,
    now: float,
    recent_window: float,
) -> None:
    """Mark ``c`` with its open episodes, one per layer or None, and their cells' failures."""
    if glob_episode is None and family_episode is None and exact_episode is None:
        return  # no cell of this node has an open episode
    episodes = []
    last = None
    recent = False
    cleared = True
    # the layers one by one (no tuple of layers built per member)
    for layer in range(EXACT_LAYER + 1):
        if layer == 0:
            episode, cell = glob_episode, glob
        elif layer == 1:
            episode, cell = family_episode, family
        else:
            episode, cell = exact_episode, exact
        if episode is None:
            continue
        episodes.append((layer, episode))
        if not episode.rx_since_fence:
            cleared = False
        if cell is not None and cell.last_failure is not None:
            failed = cell.last_failure
            if last is None or failed > last:
                last = failed
            if now - failed < recent_window:
                recent = True
    c.unresolved = True
    c.recent_failure = recent
    c.node_failure = glob_episode is not None or family_episode is not None  # an aggregate layer
    c.episodes = episodes
    c.last_failure = last
    c.cleared = cleared  # every open episode accepted an RX after its fence


def survey(candidates: list) -> tuple:
    """``(eligible, unresolved)`` of ``candidates``, each in their order. A recent node-scoped
    failure keeps a member out (GH-K-46); when that would leave none, every candidate is
    eligible. ``unresolved``: the candidates with an open failure episode."""
    eligible = []
    unresolved = []
    for c in candidates:
        if c.unresolved:
            unresolved.append(c)
            if c.recent_failure and c.node_failure:
                continue
        eligible.append(c)
    if not eligible:
        return list(candidates), unresolved
    return eligible, unresolved


def first_cold(eligible: list, tried: object) -> object:
    """The first of ``eligible`` that is unqualified, has no open episode and whose node is not
    in ``tried``; None when there is none."""
    for c in eligible:
        if not c.qualified and not c.unresolved and c.member[1] not in tried:
            return c
    return None


def find(candidates: list, node: object) -> object:
    """The candidate whose member's node is ``node`` (the same object, else an equal one), or None."""
    for c in candidates:
        if c.member[1] is node:
            return c
    for c in candidates:
        if c.member[1] == node:
            return c
    return None


def forget_resolved(held: dict, ranked: object, unresolved: list) -> None:
    """Remove from ``held`` (by node) every node of ``ranked`` (the ranked nodes, a set) that is
    not the node of one of ``unresolved`` (the candidates with an open episode): a rank's
    resolved candidates end their streaks, members it did not rank keep theirs. Walks ``held``
    (a few nodes), not the ranked members."""
    if not held:
        return
    open_nodes = set()
    for c in unresolved:
        open_nodes.add(c.member[1])
    for node in list(held):
        if node in ranked and node not in open_nodes:
            del held[node]


def members_first(order: list, winner: Candidate) -> tuple:
    """The members of ``order``, ``winner``'s first."""
    out = [winner.member]
    for c in order:
        if c is not winner:
            out.append(c.member)
    return tuple(out)


def positions(nodes: list) -> tuple:
    """``(position, aliases)``: each node's first index in ``nodes``, and ``(index, first index)``
    for every later listing of a node already listed (two member names, one node)."""
    position = {}
    aliases = []
    i = 0
    for node in nodes:
        j = position.setdefault(node, i)
        if j != i:
            aliases.append((i, j))
        i += 1
    return position, aliases


def scope_best(nodes: list, values: list, position: dict, higher: bool) -> tuple:
    """``(count, best)`` of one performance scope's readings (``nodes[k]`` read ``values[k]``)
    over the nodes that are in ``position``: how many, and the best value (the highest when
    ``higher``, else the lowest; 0.0 when none)."""
    count = 0
    best = 0.0
    k = 0
    for node in nodes:
        if node in position:
            value = values[k]
            if count == 0 or (value > best if higher else value < best):
                best = value
            count += 1
        k += 1
    return count, best


def scope_add(
    nodes: list,
    values: list,
    confidences: list,
    position: dict,
    higher: bool,
    best: float,
    weight: float,
    latency_floor: float,
    gains: list,
) -> None:
    """Add one comparable scope's weighted relative readings to ``gains`` (by position; None:
    nothing yet). Relative: value / best when ``higher``, else best / value with both raised to
    ``latency_floor``."""
    k = 0
    for node in nodes:
        i = position.get(node)
        if i is not None:
            value = values[k]
            if higher:
                relative = value / best
            else:
                relative = max(best, latency_floor) / max(value, latency_floor)
            gain = weight * confidences[k] * relative
            known = gains[i]
            gains[i] = gain if known is None else known + gain
        k += 1


def scope_utilities(
    scopes: list,
    position: dict,
    aliases: list,
    base_gains: list,
    base_weight: float,
    latency_floor: float,
    comparable_min,
) -> object:  # comparable_min: typed in rank_c.pxd
    """Each candidate's utility from ``base_gains`` (weighing ``base_weight`` in all) and the
    comparable ``scopes``, each ``(scope, higher, nodes, values, confidences, weight)``: a scope
    counts when at least ``comparable_min`` candidates read it and, when higher is better, its
    best moved; then :func:`scope_add` with its weight, ``aliases`` copied, :func:`normalized`.
    None when no scope counts (the base's own utilities answer)."""
    gains = None
    total = base_weight
    for entry in scopes:
        higher = entry[1]
        nodes = entry[2]
        values = entry[3]
        count, best = scope_best(nodes, values, position, higher)
        if count < comparable_min or (higher and best <= 0.0):
            continue  # compares nothing, or nothing moved anywhere: the scope ranks nobody
        if gains is None:
            gains = list(base_gains)
        weight = entry[5]
        total += weight
        scope_add(nodes, values, entry[4], position, higher, best, weight, latency_floor, gains)
    if gains is None:
        return None
    for i, j in aliases:  # a node listed twice (two names, one node) reads once; its alias copies the gain
        gains[i] = gains[j]
    return normalized(gains, total)


def normalized(gains: list, total: float) -> list:
    """Each of ``gains`` divided by ``total``, None kept (a candidate with no comparable scope)."""
    out = []
    for gain in gains:
        out.append(None if gain is None else gain / total)
    return out


def _band_of(reliability: float, floor: float, band: float) -> int:
    """0 for the front (at or above ``floor``), then 1, 2, ... for each ``band`` below it."""
    if reliability >= floor:
        return 0
    if band <= 0.0:  # no band: everyone behind the front is one band, ordered by utility
        return 1
    steps = (floor - reliability) / band
    if steps >= _MAX_BANDS:  # a vanishing band: past this, no integer holds the count
        return _MAX_BANDS
    return 1 + int(steps)


def _precedes(a: Candidate, b: Candidate, floor: float, band: float) -> bool:
    """Whether ``a`` ranks before ``b`` (see the module docstring); the same order as
    :func:`_sort_key`."""
    a_band = _band_of(a.reliability, floor, band)
    b_band = _band_of(b.reliability, floor, band)
    if a_band != b_band:  # the more reliable band first
        return a_band < b_band
    if a.rated != b.rated:  # missing performance is never a gain
        return a.rated
    if a.rated and a.utility_value != b.utility_value:
        return a.utility_value > b.utility_value
    if a.reliability != b.reliability:
        return a.reliability > b.reliability
    return a.index < b.index


def _sort_key(c: Candidate, floor: float, band: float) -> tuple:
    """The order as a key (the pure-Python build sorts with it)."""
    u = 0.0 if c.utility is None else c.utility
    return (_band_of(c.reliability, floor, band), c.utility is None, -u, -c.reliability, c.index)


def _floor(candidates: list, band: float) -> float:
    """The reliability a candidate needs to be in the front band: the best one's less ``band``."""
    best = candidates[0].reliability
    for i in range(1, len(candidates)):
        c = candidates[i]
        if c.reliability > best:
            best = c.reliability
    return best - band


def leaders(candidates: list, band: float) -> tuple:
    """``(first, second)`` of ``order(candidates, band)`` in one pass, without ordering the
    rest (None for a place nobody takes): what an ordinary rank compares."""
    first = None
    second = None
    if not candidates:
        return first, second
    floor = _floor(candidates, band)
    for c in candidates:
        if first is None or _precedes(c, first, floor, band):
            second = first
            first = c
        elif second is None or _precedes(c, second, floor, band):
            second = c
    return first, second


def first_sound(candidates: list, band: float, skip: object) -> object:
    """The first of ``order(candidates, band)`` without an open episode, ``skip`` passed over;
    None when there is none."""
    best = None
    if not candidates:
        return best
    floor = _floor(candidates, band)
    for c in candidates:
        if c is not skip and not c.unresolved and (best is None or _precedes(c, best, floor, band)):
            best = c
    return best


def order(candidates: list, band: float) -> list:
    """``candidates`` in rank order: reliability bands first, utility within a band,
    then configuration order."""
    count = len(candidates)
    if count == 0:
        return []
    floor = _floor(candidates, band)
    if not cython.compiled:  # keys are unique (the index), so the pairs never compare candidates
        return [c for _, c in sorted([(_sort_key(c, floor, band), c) for c in candidates])]
    out = []
    for i in range(count):  # binary insertion in C: few comparisons, and a list insert is a memmove
        c = candidates[i]
        lo = 0
        hi = i
        while lo < hi:
            mid = (lo + hi) >> 1
            if _precedes(c, out[mid], floor, band):
                hi = mid
            else:
                lo = mid + 1
        out.insert(lo, c)
    return out
