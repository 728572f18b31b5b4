"""What happens to live flows when what they run on leaves service.

One type serves both of the reconciler's policies: ``drain`` (flows of an outbound
version that was replaced or removed) and ``user_removal`` (sessions of a user who is
no longer admitted). ``keep`` leaves them alone, ``close`` ends them at once,
``close_after`` ends them once ``grace`` seconds of the injected clock have passed.
"""

from __future__ import annotations

from dataclasses import dataclass

KEEP_KIND, CLOSE_KIND, CLOSE_AFTER_KIND = "keep", "close", "close_after"


@dataclass(frozen=True, slots=True)
class ClosePolicy:
    kind: str = KEEP_KIND
    grace: float = 0.0  # seconds; only for close_after

    def __str__(self) -> str:
        return f"close_after({self.grace:g}s)" if self.kind == CLOSE_AFTER_KIND else self.kind

    @property
    def label(self) -> str:
        """The metric label: keep, close or close_after."""
        return self.kind


KEEP = ClosePolicy(KEEP_KIND)
CLOSE = ClosePolicy(CLOSE_KIND)


def close_after(grace: float) -> ClosePolicy:
    return ClosePolicy(CLOSE_AFTER_KIND, float(grace))


DEFAULT_DRAIN = KEEP  # "policies.drain, which defaults to Keep"
DEFAULT_USER_REMOVAL = CLOSE  # "policies.user_removal (default Close)"


def parse_policy(text: str, parse_seconds) -> ClosePolicy:  # noqa: ANN001 - str -> float | None
    """``keep``, ``close`` or a duration (close after it). ValueError names what is wrong."""
    word = text.strip().lower()
    if word == KEEP_KIND:
        return KEEP
    if word == CLOSE_KIND:
        return CLOSE
    seconds = parse_seconds(word)
    if seconds is None or seconds <= 0:
        raise ValueError("must be keep, close, or a positive duration to close after")
    return close_after(seconds)
