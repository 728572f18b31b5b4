"""Selects the Beta-bound implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load
from honk._fast.beta_py import DEFAULT_FAILURE_WEIGHT, DEFAULT_PRIOR, QUANTILE_TOLERANCE

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.beta_py import (
        beta_lower_bound,
        beta_quantile,
        beta_upper_bound,
        regularized_incomplete_beta,
    )
else:
    _impl, IMPLEMENTATION = load("beta")
    beta_lower_bound = _impl.beta_lower_bound
    beta_quantile = _impl.beta_quantile
    beta_upper_bound = _impl.beta_upper_bound
    regularized_incomplete_beta = _impl.regularized_incomplete_beta

__all__ = [
    "beta_lower_bound",
    "beta_quantile",
    "beta_upper_bound",
    "regularized_incomplete_beta",
    "DEFAULT_FAILURE_WEIGHT",
    "DEFAULT_PRIOR",
    "QUANTILE_TOLERANCE",
    "IMPLEMENTATION",
]
