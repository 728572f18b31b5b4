"""Every number of the health design, in one place (areas E and F of ``docs/design/groups-health.md``).

Each constant quotes the design's wording. Where the design left a choice open,
the comment says which reading honk takes.
"""

from __future__ import annotations

from honk.alive.outcome import Domain

# "A state dies after": periodic probe Tcp 3 / DnsUdp 3 / DataUdp 3; real traffic Tcp 10 / DnsUdp 3 / DataUdp 50.
# Counts are consecutive per source: a success of the same source resets that source's count.
PROBE_DEATH_THRESHOLD = {Domain.TCP: 3, Domain.DNS_UDP: 3, Domain.DATA_UDP: 3}
TRAFFIC_DEATH_THRESHOLD = {Domain.TCP: 10, Domain.DNS_UDP: 3, Domain.DATA_UDP: 50}

REGISTRATION_GRACE = 60.0  # seconds; "a newly registered node has a 60-second grace period"
RECOVERY_SUCCESSES = 2  # "a dead state normally needs two consecutive probe successes to recover"

# "exponential cooldown from 5 s up to a cap of 300 s": it starts when a state dies and
# doubles per failed recovery probe (5, 10, 20, ... 300); recovery and a network change reset it.
PROBE_COOLDOWN_MIN = 5.0  # seconds
PROBE_COOLDOWN_MAX = 300.0  # seconds
PROBE_COOLDOWN_FACTOR = 2.0  # the doubling reading of "exponential"
RECOVERY_TICK_MAX = 5.0  # seconds; the recovery scheduler runs every min(5 s, check_interval)

PROBE_HISTORY = 100  # "probe history retains 100 entries per node, domain and address family"
DELAY_TEST_URLS = 8  # URLs whose delay-test history a node keeps for the Clash `extra` map (honk's bound)
# "Two consecutive real dial failures append one synthetic 10-second placeholder ... plus one failure
# strike": each time the streak of consecutive failures reaches 2, 4, 6 ... one strike and one placeholder.
DIAL_FAILURES_PER_STRIKE = 2
MIN_STRIKE_CLEARING_SUCCESSES = 2  # "strikes clear only after max(strikes, 2) consecutive real successes"
# The real-traffic EMA degradation detector (TCP only): "three consecutive dials slower than
# max(min(2 x EMA, EMA + 500 ms), 250 ms) append one failure strike and fire an emergency probe".
DETECTOR_SLOW_DIALS = 3
DETECTOR_EMA_FACTOR = 2.0
DETECTOR_EMA_MARGIN = 0.500  # seconds
DETECTOR_FLOOR = 0.250  # seconds; "the 250 ms floor keeps normal load jitter ... from tripping the detector"
# Self-heal: the emergency probe's success followed by one more consecutive probe success clears
# the detector's strikes (the design leaves the count open; this is the decision).
DETECTOR_HEAL_PROBE_SUCCESSES = 2

# The flow-failure share (honk's reading of "a node that fails a large share of flows", issue 32):
# each real TCP flow through a node leaves one outcome -- answered, or failed by the node (a counted
# dial failure, a refusal of a target another member then reached, a reset or silence before any
# response byte). Among the node's last FLOW_OUTCOME_WINDOW outcomes of the last FLOW_OUTCOME_SPAN
# seconds, FLOW_FAILURE_SHARE failed (at least FLOW_FAILURE_MIN of them) puts one strike on the node and
# fires an emergency probe, as the EMA detector does; the window then starts over. Consecutive counts
# cannot see a node that fails every other flow: each success restarts them.
FLOW_OUTCOME_WINDOW = 20
FLOW_OUTCOME_SPAN = 60.0  # seconds an outcome stays in the window
FLOW_FAILURE_SHARE = 0.3  # "leave a node failing >= 30 % of flows"
FLOW_FAILURE_MIN = 4  # failures before the share can trip: one unlucky pair is the streak's business

# Strike probation (honk's reading; issue 32): "strikes clear only after max(strikes, 2) consecutive
# real successes", but a URLTest or Fallback sends a demoted member no real flow while another one
# serves, so its strikes would never clear and a 10-second blip would lose the best node for good.
# A strike demotes for a probation instead, on the seed's own cooldown numbers: 5 s, doubling each
# time the node is struck again after its probation ran out, up to 300 s, and back to 5 s after
# 300 quiet seconds. The strikes stay pending until real successes clear them; while they are
# pending and the probation is over, the node competes on its measurements again.
STRIKE_PROBATION_MIN = PROBE_COOLDOWN_MIN
STRIKE_PROBATION_MAX = PROBE_COOLDOWN_MAX
STRIKE_PROBATION_FACTOR = PROBE_COOLDOWN_FACTOR

GROUP_CHECK_DEATH_THRESHOLD = 3  # per-group check_url: "dies after three consecutive failures"
GROUP_DELAY_CONCURRENCY = 10  # "group delay tests run at most 10 member measurements concurrently"

DELAY_PERSIST_INTERVAL = 60.0  # seconds; "the last real TCP delay sample ... written every 60 s"

# Not a design number: how many probes run at once across all nodes. It bounds the
# sockets and CPU a probe cycle of thousands of nodes may take; the rest wait in order.
PROBE_CONCURRENCY = 32
