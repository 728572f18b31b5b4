"""Selects the rank-read implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.rank_py import (
        Candidate,
        aligned,
        candidates,
        find,
        first_cold,
        first_sound,
        forget_resolved,
        leaders,
        live,
        members_first,
        normalized,
        order,
        placed,
        positions,
        scope_add,
        scope_best,
        scope_utilities,
        survey,
    )
else:
    _impl, IMPLEMENTATION = load("rank")
    Candidate = _impl.Candidate
    candidates = _impl.candidates
    aligned = _impl.aligned
    placed = _impl.placed
    order = _impl.order
    live = _impl.live
    survey = _impl.survey
    first_cold = _impl.first_cold
    find = _impl.find
    forget_resolved = _impl.forget_resolved
    leaders = _impl.leaders
    first_sound = _impl.first_sound
    members_first = _impl.members_first
    normalized = _impl.normalized
    positions = _impl.positions
    scope_best = _impl.scope_best
    scope_add = _impl.scope_add
    scope_utilities = _impl.scope_utilities

__all__ = [
    "Candidate",
    "IMPLEMENTATION",
    "aligned",
    "candidates",
    "find",
    "first_cold",
    "first_sound",
    "forget_resolved",
    "leaders",
    "live",
    "members_first",
    "normalized",
    "order",
    "placed",
    "positions",
    "scope_add",
    "scope_best",
    "scope_utilities",
    "survey",
]
