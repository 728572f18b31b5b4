"""A fixed-capacity ring of timestamped latency samples with running sums.

Two histories in the design use it:

* the URLTest latency collection, an O(1) capacity-10 ring whose entries carry
  their measurement wall-clock time so Clash history shows real times;
* probe history, 100 entries per node, domain and address family.

Each entry is ``(at, value, synthetic)``. A synthetic entry is the 10-second
placeholder appended after two consecutive real dial failures: it is kept in
order with the real samples but is excluded from :meth:`LatencyRing.real_average`
and is never returned by :meth:`LatencyRing.last_real_sample`, so a dashboard
never shows a bogus 10000 ms and the placeholder is never persisted.

Every operation is O(1) except :meth:`~LatencyRing.snapshot` and
:meth:`~LatencyRing.restore` (O(capacity)). The running sums are recomputed from
the retained entries once per lap of the ring (amortised O(1)), so rounding
drift from adding and subtracting floats cannot build up over a long run.

This file is plain Python and also the Cython source of ``ring_c`` (types in
``ring_c.pxd``); keep the two in step.
"""

import math
from array import array

URLTEST_LATENCY_CAPACITY = 10  # latencies.rs: "O(1), cap-10 ring"
PROBE_HISTORY_CAPACITY = 100  # "Probe history retains 100 entries per node, domain, and address family"
SYNTHETIC_PLACEHOLDER = 10.0  # seconds; "a display-excluded synthetic 10-second placeholder"


class LatencyRing:
    """The newest ``capacity`` samples, oldest evicted first.

    Times and values are plain floats (honk uses seconds); the ring never reads
    a clock, the caller passes each sample's measurement time ``at``.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._at = array("d", bytes(8 * capacity))
        self._values = array("d", bytes(8 * capacity))
        self._synthetic = array("b", bytes(capacity))
        self._head = 0  # slot the next push writes
        self._len = 0
        self._sum = 0.0
        self._real_sum = 0.0
        self._real_len = 0
        self._last_real = -1  # slot of the newest real entry, -1 if none is retained

    @property
    def capacity(self) -> int:
        """How many entries the ring retains."""
        return self._capacity

    def __len__(self) -> int:
        return self._len

    def push(self, at: float, value: float, synthetic: bool = False) -> None:
        """Append one sample measured at ``at``, evicting the oldest when full.

        ``value`` must be finite (``ValueError`` otherwise): one infinity would
        poison the running sums.
        """
        if not math.isfinite(value):
            raise ValueError(f"latency must be finite, got {value}")
        slot = self._head
        if self._len == self._capacity:
            # Evict the oldest entry, which lives in the slot about to be reused.
            old = self._values[slot]
            self._sum -= old
            if not self._synthetic[slot]:
                self._real_sum -= old
                self._real_len -= 1
            if slot == self._last_real:
                # The newest real entry was also the oldest entry: none is left.
                self._last_real = -1
        else:
            self._len += 1
        self._at[slot] = at
        self._values[slot] = value
        self._sum += value
        if synthetic:
            self._synthetic[slot] = 1
        else:
            self._synthetic[slot] = 0
            self._real_sum += value
            self._real_len += 1
            self._last_real = slot
        slot += 1
        if slot == self._capacity:
            slot = 0
            if self._len == self._capacity:
                self._resum()
        self._head = slot

    def last(self):
        """The newest entry as ``(at, value, synthetic)``, or ``None`` when empty."""
        if self._len == 0:
            return None
        slot = self._head - 1
        if slot < 0:
            slot = self._capacity - 1
        return (self._at[slot], self._values[slot], self._synthetic[slot] != 0)

    def last_real_sample(self):
        """The newest non-synthetic entry as ``(at, value)``, or ``None`` if none is retained."""
        slot = self._last_real
        if slot < 0:
            return None
        return (self._at[slot], self._values[slot])

    def average(self):
        """Mean of every retained value, synthetic ones included; ``None`` when empty."""
        if self._len == 0:
            return None
        return self._sum / self._len

    def real_average(self):
        """Mean of the retained real (non-synthetic) values; ``None`` if there are none."""
        if self._real_len == 0:
            return None
        return self._real_sum / self._real_len

    @property
    def real_count(self) -> int:
        """How many retained entries are real samples."""
        return self._real_len

    def snapshot(self) -> list:
        """Every retained entry as ``(at, value, synthetic)``, oldest first.

        For the API history and for persistence; :meth:`restore` takes it back.
        """
        out = []
        slot = self._head - self._len
        if slot < 0:
            slot += self._capacity
        for _ in range(self._len):
            out.append((self._at[slot], self._values[slot], self._synthetic[slot] != 0))
            slot += 1
            if slot == self._capacity:
                slot = 0
        return out

    def restore(self, items) -> None:
        """Replace the contents with ``items`` (``(at, value, synthetic)`` triples, oldest first).

        Only the newest ``capacity`` items are kept, as if they had been pushed
        one by one. A bad item raises ``ValueError`` and leaves the ring empty.
        """
        self.clear()
        entries = list(items)
        start = len(entries) - self._capacity
        if start < 0:
            start = 0
        try:
            for i in range(start, len(entries)):
                at, value, synthetic = entries[i]
                self.push(at, value, bool(synthetic))
        except (TypeError, ValueError):
            self.clear()
            raise

    def clear(self) -> None:
        """Forget every entry."""
        self._head = 0
        self._len = 0
        self._sum = 0.0
        self._real_sum = 0.0
        self._real_len = 0
        self._last_real = -1

    def _resum(self) -> None:
        """Recompute the running sums from the retained entries (the ring is full)."""
        total = 0.0
        real = 0.0
        for slot in range(self._capacity):
            total += self._values[slot]
            if not self._synthetic[slot]:
                real += self._values[slot]
        self._sum = total
        self._real_sum = real
