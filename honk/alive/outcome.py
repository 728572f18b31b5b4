"""What every probe reports, shared by the probe modules and the health state.

A probe either returns a :class:`ProbeSample` or raises :class:`ProbeError`.
The error's ``phase`` says how far the probe got (``dial``, ``tls``, ``request``, ...)
and its ``reason`` is a short static word; neither carries response text or a URL,
which may hold a token.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from honk.core.errors import HonkError


class Domain(enum.Enum):
    """The three health domains of a node."""

    TCP = "tcp"  # TCP reachability through the node
    DNS_UDP = "dns_udp"  # the UDP DNS probe through the node's packet path
    DATA_UDP = "data_udp"  # the UDP data path (real packet flows, the QUIC handshake probe)


class Family(enum.IntEnum):
    """The address family used to reach the node's server (the health family)."""

    V4 = 4
    V6 = 6

    __hash__ = int.__hash__  # equal to its int, so hashed as one, in C (Enum's hash is Python-level)


class ProbeError(HonkError):
    """A probe failed. ``phase``: where; ``reason``: a short static word."""

    def __init__(self, phase: str, reason: str) -> None:
        super().__init__(f"probe failed in {phase}: {reason}")
        self.phase = phase
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """A successful measurement.

    ``rtt``: seconds of the warm round the probe reports (for HTTP the second
    request's round trip). ``fallback``: the second round failed in a way the
    design accepts and ``rtt`` is the validated first round's; such a sample
    feeds liveness and the API's history but is never Score evidence for the
    configured method. ``status``: the final HTTP status of the round whose RTT is
    reported (None for probes without HTTP); not part of equality, so a sample
    still compares by what it measured.
    """

    rtt: float
    fallback: bool = False
    status: int | None = field(default=None, compare=False)
