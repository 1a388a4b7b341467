"""Shared bits of the examples: the output directory argument and a one-line summary of a plan."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# run from a source checkout without installing: make the repository importable
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def out_dir(default: str, doc: str) -> Path:
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--out", type=Path, default=Path("out") / default, help="where the files go")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args.out


def summary(entry: dict) -> str:
    from planner.output.explain import config_label

    p = entry["prediction"]
    return (f"{config_label(entry['config'])}: {p['tflops_per_gpu']:,.0f} TFLOP/s per GPU, "
            f"{p['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, step {p['step_time_s']:.2f} s, "
            f"{p['memory_gib_per_gpu']:.0f} GiB per GPU")
