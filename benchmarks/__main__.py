"""Run every benchmark and print one table of figures and ratios.

    make bench                    # or: .venv/bin/python -m benchmarks [--quick]

* kernels: the compiled ``_fast`` kernels against their pure-Python twins;
* relay:   honk's mixed port (SOCKS5 CONNECT, direct outbound) against a direct
  loopback connection, for bulk throughput and connection rate.
"""

from __future__ import annotations

import argparse

from benchmarks import kernels, relay


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="smaller volumes, for a smoke run")
    args = parser.parse_args()
    rows: list[tuple[str, str, str, str]] = []
    rows += kernels.run(quick=args.quick)
    rows += relay.run(quick=args.quick)
    width = [max(len(r[i]) for r in rows + [("benchmark", "honk", "baseline", "ratio")]) for i in range(4)]
    header = ("benchmark", "honk", "baseline", "ratio")
    for row in [header, tuple("-" * w for w in width), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, width, strict=True)))


if __name__ == "__main__":
    main()
