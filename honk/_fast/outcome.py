"""What a settled attempt contributes to an evidence cell, and what a rank reads of a cell.

Plain Python shared by both builds of the cell kernel (``honk._fast.cell``), so the one enum
and the one tuple type are the same objects whichever build is loaded.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Outcome(enum.Enum):
    """What one settled attempt (or one warm-up sample) contributes to a cell."""

    SETUP_OK = "setup_ok"  # a setup that succeeded and settles nothing else (warm-up)
    SUCCESS = "success"  # a settled success that saw no response
    USEFUL = "useful"  # a settled success that saw a response: a useful completion (GH-K-27)
    FAILURE = "failure"  # a business failure after setup
    SETUP_FAILURE = "setup_failure"  # the setup itself failed; weighs more in the Beta bound

    @property
    def is_failure(self) -> bool:
        return self is _FAILURE or self is _SETUP_FAILURE


# bound once: an Enum.MEMBER read costs a metaclass hook in Python 3.11
_FAILURE, _SETUP_FAILURE = Outcome.FAILURE, Outcome.SETUP_FAILURE


class Standing(NamedTuple):
    """What a rank reads of one cell at one time."""

    bound: float  # the Beta reliability lower bound (GH-K-26)
    weight: float  # how much of the blend this layer takes over from its parents (GH-K-04)
    useful: float  # decayed useful completions (qualification, GH-K-27)


__all__ = ["Outcome", "Standing"]
