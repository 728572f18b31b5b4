"""Selects the rank-read implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.rank_py import (
        Candidate,
        candidates,
        find,
        first_cold,
        forget_resolved,
        live,
        members_first,
        normalized,
        order,
        positions,
        scope_add,
        scope_best,
        survey,
    )
else:
    _impl, IMPLEMENTATION = load("rank")
    Candidate = _impl.Candidate
    candidates = _impl.candidates
    order = _impl.order
    live = _impl.live
    survey = _impl.survey
    first_cold = _impl.first_cold
    find = _impl.find
    forget_resolved = _impl.forget_resolved
    members_first = _impl.members_first
    normalized = _impl.normalized
    positions = _impl.positions
    scope_best = _impl.scope_best
    scope_add = _impl.scope_add

__all__ = ["Candidate", "IMPLEMENTATION", "candidates", "find", "first_cold", "forget_resolved", "live", "members_first",
           "normalized", "order", "positions", "scope_add", "scope_best", "survey"]
