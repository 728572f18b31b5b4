"""Selects the rank-read implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.rank_py import Candidate, candidates, order
else:
    _impl, IMPLEMENTATION = load("rank")
    Candidate = _impl.Candidate
    candidates = _impl.candidates
    order = _impl.order

__all__ = ["Candidate", "IMPLEMENTATION", "candidates", "order"]
