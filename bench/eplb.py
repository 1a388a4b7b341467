"""EPLB baseline for the benchmarks: our own implementation lives in planner/search/eplb.py (so that
`topoplan place-experts` can report it side by side); this module re-exports it for bench/ and tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.search.eplb import balanced_packing, logical_maps, rebalance_experts, replicate  # noqa: E402,F401
