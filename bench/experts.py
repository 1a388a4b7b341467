"""Side by side: EPLB hierarchical, EPLB global and topoplan's placement on seeded synthetic loads.

    python bench/experts.py                 # all cases, 58 layers (minutes on 2 cores)
    python bench/experts.py --layers 8      # quicker look

Cases: EP64 over 8 HGX H100 nodes (dgx-h100, 64 GPUs), EP64 inside one NVL72 rack (gb300-nvl72, 64
GPUs), EP256 over four NVL72 racks (64 GPUs used per rack); one spare slot per GPU; DeepSeek-V3
routing (256 experts, 8 groups, top-4 groups, top-8). Loads: Zipf s=0.8 and lognormal sigma=0.6.
EPLB is measured under its own assumption (a replica gets an even share of its expert's tokens);
topoplan under its "home" dispatch (own-domain replica first, else the expert's home domain).
Locality is measured on the same sampled tokens for every policy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.eplb import rebalance_experts  # noqa: E402
from planner.search.experts import (cross_domain_bytes, ep_rank_domains, evaluate_placement, place,  # noqa: E402
                             sample_routing, synthetic_loads)
from topologies.loader import load_cluster  # noqa: E402

CASES = [("EP64 8x HGX", "dgx-h100", 64, None), ("EP64 1x NVL72", "gb300-nvl72", 64, None),
         ("EP256 4x NVL72", "gb300-nvl72", 256, 64)]
HIDDEN = 7168


def _row(case, load, policy, metrics, solve_s, tokens_per_step):
    b = [m["balance"] for m in metrics]
    rem = [m["remote_domains_per_token"] for m in metrics]
    return (case, load, policy, np.mean(b), max(b), np.mean([m["domains_per_token"] for m in metrics]),
            np.mean(rem), cross_domain_bytes(rem, tokens_per_step, HIDDEN) / 1e9, solve_s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=58)
    ap.add_argument("--time-limit", type=float, default=0.1, help="CP-SAT seconds per layer (the CLI default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--case", action="append", default=None,
                    help="only cases whose name contains this (repeatable), e.g. EP256")
    ap.add_argument("--load", action="append", choices=("zipf", "lognormal"), default=None)
    args = ap.parse_args(argv)
    rows = []
    for kind in args.load or ("zipf", "lognormal"):
        loads = synthetic_loads(kind, args.layers, 256, seed=args.seed)
        routing = [sample_routing(loads[i], 8, 4, 8, seed=args.seed + i) for i in range(args.layers)]
        for case, cluster, ep, per_domain in CASES:
            if args.case and not any(c in case for c in args.case):
                continue
            cl = load_cluster(cluster, gpus=ep, usable_per_domain=per_domain) if per_domain else load_cluster(cluster, gpus=ep)
            rd = ep_rank_domains(cl, ep)
            D = int(rd.max()) + 1
            K = 256 // ep + 1
            tps = 4096 * ep
            for pol in ("hierarchical", "global"):
                t = time.perf_counter()
                p2l, _, _ = rebalance_experts(loads, ep * K, 8, D, ep, pol)
                dt = time.perf_counter() - t
                rows.append(_row(case, kind, f"EPLB-{pol}", evaluate_placement(p2l, rd, K, loads, routing, "even"), dt, tps))
            t = time.perf_counter()
            pl = place(loads, rd, K, n_group=8, topk_group=4, top_k=8, time_limit=args.time_limit,
                       seed=args.seed, routing=routing, workers=args.workers)
            wall = time.perf_counter() - t
            rows.append(_row(case, kind, "topoplan", pl.metrics, wall, tps))
            for r in rows[-3:]:
                print(" | ".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in r), flush=True)
    print()
    print("| case | load | policy | balance mean | balance worst | domains/token | remote domains/token | "
          "cross-domain GB/step | solve s (wall, all layers) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.2f} | {r[6]:.2f} | {r[7]:.0f} | {r[8]:.1f} |")


if __name__ == "__main__":
    main()
