"""Selects the evidence-cell implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load
from honk._fast.outcome import Outcome, Standing

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.cell_py import (
        PRIOR_BOUND,
        EvidenceCell,
        layer_weight,
        read_cells,
        reliability_bound,
        standing,
    )
else:
    _impl, IMPLEMENTATION = load("cell")
    EvidenceCell = _impl.EvidenceCell
    PRIOR_BOUND = _impl.PRIOR_BOUND
    layer_weight = _impl.layer_weight
    read_cells = _impl.read_cells
    reliability_bound = _impl.reliability_bound
    standing = _impl.standing

__all__ = [
    "EvidenceCell",
    "IMPLEMENTATION",
    "Outcome",
    "PRIOR_BOUND",
    "Standing",
    "layer_weight",
    "read_cells",
    "reliability_bound",
    "standing",
]
