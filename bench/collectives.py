"""The collective model against every measured row of hardware.md section 2, and its call cost.

Run: python bench/collectives.py           (prints the comparison table and calls per second)
     python bench/collectives.py --json    (machine-readable)
"""

from __future__ import annotations

import argparse
import json
import time

from topologies.collectives import GroupShape, fabric_for
from topologies.loader import load_cluster
from topologies.measured import LIMIT, comparisons


def _size(b: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b / 2**20:.0f} MiB"


def call_rate(n_calls: int = 200_000) -> dict:
    """Fabric calls per second on a 16,384-GPU preset (the step-time model calls them in loops)."""
    t0 = time.perf_counter()
    c = load_cluster("dgx-h100", gpus=16384)
    f = fabric_for(c)
    build = time.perf_counter() - t0
    shapes = [GroupShape.local(8), GroupShape(64, 8, 8, 0), GroupShape(1024, 8, 128, 1)]
    t0 = time.perf_counter()
    acc = 0.0
    for i in range(n_calls):
        s = shapes[i % 3]
        acc += f.all_reduce(s, 1e6 + i) + f.all_to_all(s, 1e6, impl="deepep")
    dt = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n_calls):     # the same queries again: served from the per-Fabric memo
        s = shapes[i % 3]
        acc += f.all_reduce(s, 1e6 + i) + f.all_to_all(s, 1e6, impl="deepep")
    dt_memo = time.perf_counter() - t0
    return {"fabric_build_s": build, "calls_per_s": 2 * n_calls / dt, "memo_calls_per_s": 2 * n_calls / dt_memo,
            "checksum": acc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args()
    rows = comparisons()
    rate = call_rate(args.calls)
    if args.json:
        print(json.dumps({"rows": [dict(kind=c.kind, row=c.row, size=c.size, measured=c.measured, model=c.model,
                                        error=c.error, checked=c.checked, note=c.note) for c in rows],
                          **rate}, indent=2))
        return
    print("busbw / bandwidth in GB/s; deepep-ll rows are latencies in microseconds")
    print(f"{'collective':18} {'row':22} {'size':>9} {'measured':>9} {'model':>9} {'error':>8}  checked")
    for c in rows:
        mark = "yes" if c.checked else f"no: {c.note}"
        print(f"{c.kind:18} {c.row:22} {_size(c.size):>9} {c.measured:9.2f} {c.model:9.2f} {c.error:+8.1%}  {mark}")
    checked = [abs(c.error) for c in rows if c.checked]
    print(f"\nchecked cells: {len(checked)}; max |error| {max(checked):.1%} (limit {LIMIT:.0%}); "
          f"mean |error| {sum(checked) / len(checked):.1%}")
    print(f"Fabric for 16,384 GPUs built in {rate['fabric_build_s']:.2f} s; "
          f"{rate['calls_per_s'] / 1e6:.2f} M calls/s first time, {rate['memo_calls_per_s'] / 1e6:.2f} M calls/s "
          "repeated (memo)")


if __name__ == "__main__":
    main()
