"""Selects the Beta-bound implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import NO_EXTENSIONS
from honk._fast.beta_py import DEFAULT_FAILURE_WEIGHT, DEFAULT_PRIOR, QUANTILE_TOLERANCE

if TYPE_CHECKING or NO_EXTENSIONS:
    from honk._fast.beta_py import (
        beta_lower_bound,
        beta_quantile,
        beta_upper_bound,
        regularized_incomplete_beta,
    )

    IMPLEMENTATION = "python"
else:
    try:
        from honk._fast.beta_c import (
            beta_lower_bound,
            beta_quantile,
            beta_upper_bound,
            regularized_incomplete_beta,
        )

        IMPLEMENTATION = "compiled"
    except ImportError:  # a source checkout without a build
        from honk._fast.beta_py import (
            beta_lower_bound,
            beta_quantile,
            beta_upper_bound,
            regularized_incomplete_beta,
        )

        IMPLEMENTATION = "python"

__all__ = [
    "beta_lower_bound",
    "beta_upper_bound",
    "beta_quantile",
    "regularized_incomplete_beta",
    "DEFAULT_PRIOR",
    "DEFAULT_FAILURE_WEIGHT",
    "QUANTILE_TOLERANCE",
    "IMPLEMENTATION",
]
