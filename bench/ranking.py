"""Does the model order layouts as measured? Same-hardware A/B pairs from the published runs.

Run: ``python bench/ranking.py [--gap PCT]`` (a few seconds).

A pair is two measured runs of the same model on the same GPUs (type and count) with the same
software (the stack and, where the source names it, the container release), differing in layout
or recipe settings (TP/PP/VPP/CP/EP, micro-batch, recompute, FSDP, precision, global batch).
Sources: planner/data/profiles/calibration.csv, every table in bench/data/ and the TorchTitan and
MaxText rows in planner/data/profiles/. Each run is predicted with the shipped profile of its stack
(the runs a profile was fitted to are in-sample), in its recipe's regime (bench/accuracy.py
EAGER_RECIPES).

Prints every pair (measured and predicted ratio of model TFLOP/s per GPU), how many the model
orders as measured (all pairs, and pairs measured more than ``--gap`` percent apart, default 3%:
closer pairs are within run-to-run noise), and for each miss the step-time term responsible: the
breakdown term whose seconds per token differ most between the two predictions. Identical
configurations measured twice (repeats) are listed apart: their spread is the noise floor.
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))   # after the packages: bench/solver.py must not shadow solver/
SOURCES = [ROOT / "planner" / "data" / "profiles" / "calibration.csv", *sorted((ROOT / "bench" / "data").glob("*.csv")),
           ROOT / "planner" / "data" / "profiles" / "torchtitan-h100-2024-12.csv",
           ROOT / "planner" / "data" / "profiles" / "maxtext-h100-2025.csv"]
INPUTS = ("precision", "seq_len", "gbs", "mbs", "tp", "pp", "vpp", "cp", "ep", "etp", "fsdp", "recompute", "dispatcher",
          "cuda_graphs", "torch_compile")


def software(row: dict) -> str:
    """The stack and, where the source names it, the container release ("NeMo 26.06 container")."""
    m = re.search(r"(\d\d\.\d\d(?:\.\d+)?)[^()]*container|container[^()]*?(\d\d\.\d\d)", row.get("source") or "")
    rel = (m.group(1) or m.group(2)) if m else ""
    return f"{(row.get('stack') or '').strip()} {rel}".strip()


# a measured run: the same id and measurement in two files is one run (ids alone repeat across tables)
RUN_KEY = ("id", "model", "gpu", "num_gpus", "tokens_per_s_per_gpu", "model_tflops_per_gpu")
_DEFAULTS = {"tp": "1", "pp": "1", "vpp": "1", "cp": "1", "ep": "1", "mbs": "1", "cuda_graphs": "true"}


def _norm(row: dict, key: str) -> str:
    """A row's input as the planner reads it: empty = the default, FSDP on/off, recompute without comments."""
    from planner.calibration.validate import _recompute

    v = (row.get(key) or "").strip().lower()
    if key == "fsdp":
        return "on" if v and int(float(v)) >= 1 else "off"
    if key == "recompute":
        return _recompute(v)
    return v or _DEFAULTS.get(key, "")


def predicted_runs():
    """[(row, prediction, source name)] for every measured row of every source."""
    from accuracy import EAGER_RECIPES
    from planner.cost.profiles import load_profile, resolve_name
    from planner.calibration.validate import predict_case, read_rows, row_case

    out, seen = [], set()
    for path in SOURCES:
        if not path.exists():
            continue
        for row in read_rows(path):
            if not (row.get("model_tflops_per_gpu") or "").strip():
                continue
            run = tuple((row.get(k) or "").strip() for k in RUN_KEY)
            if run in seen:   # one run, two files (ttx1/ttx2: torchtitan-more.csv and the fitted profile rows)
                continue
            seen.add(run)
            row = dict(row, cuda_graphs="false") if row["id"] in EAGER_RECIPES else row
            prof = load_profile(resolve_name((row.get("stack") or "megatron-26.08").strip()))
            case = row_case(row, row.get("stack"), str(path), profile=prof)
            out.append((row, predict_case(case, prof), path.name))
    return out


def pairs(runs):
    """(A/B pairs, repeats): runs grouped by model, GPU type and count, and software."""
    groups: dict = {}
    for r in runs:
        row = r[0]
        key = (row["model"].strip(), row["gpu"].strip().upper(), int(row["num_gpus"]), software(row))
        groups.setdefault(key, []).append(r)
    ab, rep = [], []
    for key, rs in groups.items():
        for a, b in itertools.combinations(rs, 2):
            same = all(_norm(a[0], k) == _norm(b[0], k) for k in INPUTS)
            (rep if same else ab).append((key, a, b))
    return ab, rep


def responsible_term(pa, pb, row_a, row_b) -> tuple[str, float]:
    """The breakdown term whose predicted seconds per token differ most between the two runs."""
    ta = int(row_a["gbs"]) * int(row_a["seq_len"])
    tb = int(row_b["gbs"]) * int(row_b["seq_len"])
    diffs = {k: pa.breakdown.get(k, 0.0) / ta - pb.breakdown.get(k, 0.0) / tb
             for k in set(pa.breakdown) | set(pb.breakdown)}
    k = max(diffs, key=lambda x: abs(diffs[x]))
    return k, diffs[k]


def differs(a: dict, b: dict) -> str:
    """What the two runs change: ``precision fp8->nvfp4, tp 4->2``."""
    out = []
    for k in INPUTS:
        if _norm(a, k) != _norm(b, k):
            out.append(f"{k} {_norm(a, k) or '-'}->{_norm(b, k) or '-'}")
    return ", ".join(out)


def main(argv: list[str]) -> int:
    gap = 3.0
    if "--gap" in argv:
        gap = float(argv[argv.index("--gap") + 1])
    runs = predicted_runs()
    ab, rep = pairs(runs)
    print(f"{len(runs)} measured runs; {len(ab)} same-hardware A/B pairs; {len(rep)} repeats")
    print(f"{'pair':32s} {'model':16s} {'GPUs':>10s} {'software':20s} {'meas B/A':>9s} {'pred B/A':>9s}  ok  differs")
    hits = hits_big = big = 0
    misses = []
    for key, (ra, pa, _), (rb, pb, _) in sorted(ab, key=lambda x: x[0]):
        ma, mb = float(ra["model_tflops_per_gpu"]), float(rb["model_tflops_per_gpu"])
        qa, qb = pa.tflops_per_gpu, pb.tflops_per_gpu
        ok = (mb > ma) == (qb > qa)
        is_big = abs(mb / ma - 1) * 100 > gap
        hits += ok
        big += is_big
        hits_big += ok and is_big
        mark = "yes" if ok else ("NO " if is_big else "no~")
        print(f"{ra['id'] + ' vs ' + rb['id']:32s} {key[0]:16s} {str(key[2]) + ' ' + key[1]:>10s} {key[3]:20s} "
              f"{mb / ma:9.3f} {qb / qa:9.3f}  {mark} {differs(ra, rb)}")
        if not ok:
            misses.append((ra, rb, pa, pb, is_big))
    print()
    print(f"ordered as measured: {hits} of {len(ab)} pairs ({100 * hits / max(1, len(ab)):.0f}%); "
          f"{hits_big} of {big} pairs measured more than {gap:g}% apart ({100 * hits_big / max(1, big):.0f}%)")
    if misses:
        print("misses (the breakdown term whose predicted seconds per token differ most between the two):")
        for ra, rb, pa, pb, is_big in misses:
            term, d = responsible_term(pa, pb, ra, rb)
            if abs(pa.step_time_s / (int(ra["gbs"]) * int(ra["seq_len"]))
                   - pb.step_time_s / (int(rb["gbs"]) * int(rb["seq_len"]))) < 1e-15:
                print(f"  {ra['id']} vs {rb['id']}: measured "
                      f"{float(rb['model_tflops_per_gpu']) / float(ra['model_tflops_per_gpu']):.3f}, predicted 1.000: "
                      f"the model does not price this change ({differs(ra, rb)}) for stack {ra['stack']}")
                continue
            print(f"  {ra['id']} vs {rb['id']}{'' if is_big else ' (within the noise gap)'}: measured "
                  f"{float(rb['model_tflops_per_gpu']) / float(ra['model_tflops_per_gpu']):.3f}, predicted "
                  f"{pb.tflops_per_gpu / pa.tflops_per_gpu:.3f}; term {term}: {1e6 * d:+.2f} us per token "
                  f"({ra['id']} minus {rb['id']})")
    if rep:
        print("repeats (identical inputs measured twice):")
        for key, (ra, pa, _), (rb, pb, _) in rep:
            print(f"  {ra['id']} vs {rb['id']} {key[0]} {key[2]} {key[1]} {key[3]}: measured "
                  f"{float(rb['model_tflops_per_gpu']) / float(ra['model_tflops_per_gpu']):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
