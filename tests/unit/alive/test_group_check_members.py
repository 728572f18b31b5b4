"""What the group check_url probes read of a group's members (GH-F-23): the current (member,
leaf) pairs, read with a peek, so probing moves no policy state (issue 32: every probe cycle
used to record a Score pick, move a URLTest winner and advance a LoadBalance cursor)."""

from __future__ import annotations

from honk.config.load import load_text
from honk.connection.plane import build_plane
from honk.control.health import HealthService
from honk.core.clock import FakeClock
from honk.core.net import Network

CONFIG = """
node {
    a: 'socks5://127.0.0.1:1081'
    b: 'socks5://127.0.0.1:1082'
    c: 'socks5://127.0.0.1:1083'
}
group {
    rr {
        filter: name(a, b, c)
        policy: round_robin
    }
    checked {
        filter: group(rr)
        policy: fallback
        check_url: 'http://127.0.0.1:9/generate_204'
    }
}
routing {
    fallback: checked
}
"""


def test_reading_a_groups_members_for_its_check_url_moves_no_load_balance_cursor():
    plane = build_plane(load_text(CONFIG, "dae"), FakeClock(), generation=1)
    members = HealthService._member_leaves(plane, "checked")
    for _ in range(5):
        assert [member for member, _ in members()] == ["rr"]  # the sub-group, as its current leaf
    served = [plane.groups.resolve("rr", Network.TCP).leaf.name for _ in range(3)]
    assert served == ["a", "b", "c"]  # the cursor starts where it was: no probe read moved it
