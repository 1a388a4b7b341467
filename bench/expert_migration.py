"""Seconds per layer of the move-capped migration (solver.experts.bounded_migration) against the
full scan it replaced (every trial priced from scratch; kept in tests/test_expert_migration.py),
on a DeepSeek-V3-sized layer: 256 experts, EP64 x 5 slots, 8 NVLink domains, at most 8 moves.

    python bench/expert_migration.py [--layers 5]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)                       # not bench/, whose solver.py would shadow the package
sys.path.insert(1, str(ROOT / "tests"))
from test_expert_migration import _placement, migration_ref  # noqa: E402

from solver.experts import bounded_migration  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=5)
args = ap.parse_args()
P, K, D, E, cap = 64, 5, 8, 256, 8
rank_domain = np.repeat(np.arange(D), P // D).astype(np.int64)
new_s = ref_s = 0.0
same = 0
for seed in range(args.layers):
    rng = np.random.default_rng(seed)
    load = rng.gamma(0.7, 1.0, E)
    load /= load.sum()
    prev, target = _placement(rng, E, P, K), _placement(rng, E, P, K)
    home = rng.integers(0, D, E)
    t = time.process_time()
    a = bounded_migration(prev, target, rank_domain, K, load, "home", home, cap)
    new_s += time.process_time() - t
    t = time.process_time()
    b = migration_ref(prev, target, rank_domain, K, load, "home", home, cap)
    ref_s += time.process_time() - t
    same += bool(np.array_equal(a, b))
print(f"bounded_migration, {args.layers} layers of {E} experts on EP{P} x {K} slots, {D} domains, cap {cap}:")
print(f"  incremental {new_s / args.layers:.2f} s/layer (CPU), full scan {ref_s / args.layers:.2f} s/layer, "
      f"{ref_s / max(new_s, 1e-9):.1f}x; same placement on {same} of {args.layers} layers")
