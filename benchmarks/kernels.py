"""The compiled ``_fast`` kernels against their pure-Python twins."""

from __future__ import annotations

import time

from honk._fast import movavg_py

UPDATES = 2_000_000


def _rate(cls, n: int) -> float:
    avg = cls()
    update = avg.update
    start = time.perf_counter()
    for i in range(n):
        update(0.001 * (i & 255))
    return n / (time.perf_counter() - start)


def run(quick: bool = False) -> list[tuple[str, str, str, str]]:
    n = UPDATES // 10 if quick else UPDATES
    try:
        from honk._fast import movavg_c
    except ImportError:
        return [("movavg.update (ops/s)", "not built", f"{_rate(movavg_py.HalvingAverage, n):,.0f}", "-")]
    compiled = _rate(movavg_c.HalvingAverage, n)
    python = _rate(movavg_py.HalvingAverage, n)
    return [("movavg.update (ops/s), vs twin", f"{compiled:,.0f}", f"{python:,.0f}", f"{compiled / python:.2f}x")]
