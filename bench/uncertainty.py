"""Residuals of every measured run by regime, and the uncertainty table the planner ships.

Run: ``python bench/uncertainty.py [--write]`` (about a minute: the leave-one-model-out refits).

Every measured run is predicted and classified (``planner.cost.uncertainty.classify``); its residual
is ``ln(predicted / measured)`` model TFLOP/s per GPU (tokens/s for Kimi-K2, whose FLOP convention
differs). Runs a shipped profile was fitted to are predicted leave-one-model-out (the profile refitted
without the run's model: what a user with a new model gets); a profile fitted to one model only
(maxtext) keeps its in-sample residuals, marked so. Never-fitted tables (bench/data/*.csv) are
predicted with the profile their release resolves to. Rows whose recipe runs eagerly are predicted
in that regime (bench/accuracy.py EAGER_RECIPES).

Every run is also predicted with every shipped profile of its trainer (``by_profile``): per stack
profile, the table records the GPU generations of the runs it was fitted on (``fitted_archs``) and, per
other generation and core regime, the widest residual of its predictions there (``generations``: the
band of a prediction off the fitted generations, planner/cost/uncertainty.py).

Prints the residuals per pool (stack profile, then trainer family) and core regime, the half-width
each gets and the runs behind it; ``--write`` writes ``planner/data/uncertainty.yaml``.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))   # after the packages: bench/solver.py must not shadow solver/
CALIBRATION = ROOT / "planner" / "data" / "profiles" / "calibration.csv"
FITTED = [CALIBRATION, ROOT / "planner" / "data" / "profiles" / "torchtitan-h100-2024-12.csv",
          ROOT / "planner" / "data" / "profiles" / "maxtext-h100-2025.csv"]
# never-fitted measured runs: every CSV in bench/data in the schema of calibration.csv
NOT_FITTED_DIR = ROOT / "bench" / "data"
OUT = ROOT / "planner" / "data" / "uncertainty.yaml"

QUANTILE = 0.8                    # of |ln(pred/meas)|
FLOOR = 0.05                      # no band narrower than +-5%: in-sample residuals flatter the model
MIN_RUNS = 5                      # runs a core regime needs before its own figure is used (a q80 of fewer is noise)
DEFAULT_MIN = round(math.log(1.5), 3)   # the band of a regime no run covers: at least x/÷ 1.5 ...
EXTRAPOLATION_STEP = 0.10         # added per uncovered FSDP / CP / precision feature


def residuals(progress=print) -> list[dict]:
    """One record per measured run: id, pool (profile), family, regime features, log error, how."""
    from accuracy import EAGER_RECIPES, OUT_OF_SAMPLE
    from planner.calibration.calibrate import calibrate_rows
    from planner.cost.profiles import available, load_profile, resolve_name
    from planner.cost.uncertainty import classify, family_of
    from planner.calibration.validate import predict_case, read_rows, row_case

    out = []

    def same_family(trainer):
        return [n for n in available() if load_profile(n).trainer == trainer]

    def add(row, source, how, profile=None):
        row = dict(row, cuda_graphs="false") if row["id"] in EAGER_RECIPES else row
        stack = resolve_name((row.get("stack") or "megatron-26.08").strip())
        prof = profile if profile is not None else load_profile(stack)
        case = row_case(row, row.get("stack"), source, profile=prof)
        p = predict_case(case, prof)
        reg = classify(case.model, case.cluster, p.config, case.training, placement=p.placement)
        if row.get("_compare") == "tokens":
            err = math.log(p.tokens_per_s_per_gpu / float(row["tokens_per_s_per_gpu"]))
        else:
            err = math.log(p.tflops_per_gpu / float(row["model_tflops_per_gpu"]))
        gens = {}   # the residual of every shipped profile of the family: the generation check, in tokens/s
        # where the row has them (another profile may count model FLOPs with another formula: megatron-26.08's
        # current one against the legacy one of the tables up to 26.04, 15% apart for GPT-OSS)
        tokens = (row.get("tokens_per_s_per_gpu") or "").strip()
        for other in same_family(prof.trainer):
            o = load_profile(other)
            q = predict_case(row_case(row, other, source, profile=o), o)
            gens[other] = round(math.log((q.tokens_per_s_per_gpu / float(tokens)) if tokens else
                                         (q.tflops_per_gpu / float(row["model_tflops_per_gpu"]))), 4)
        out.append({"id": row["id"], "pool": stack, "arch": case.cluster.gpu_spec.arch, "by_profile": gens, "family": family_of(stack, prof.trainer), "core": reg.core,
                    "fsdp": reg.fsdp, "cp": reg.cp, "precision": reg.precision, "log_error": round(err, 4),
                    "how": how, "source": Path(source).name, "model": case.model.name, "gpu": row["gpu"],
                    "config": p.config.short()})

    for path in FITTED:
        rows = read_rows(path)
        for stack in sorted({(r.get("stack") or "").strip() for r in rows}):
            mine = [r for r in rows if (r.get("stack") or "").strip() == stack]
            models = sorted({r["model"].strip() for r in mine})
            for model in models:
                held = [r for r in mine if r["model"].strip() == model]
                if len(models) > 1:
                    prof, _ = calibrate_rows(rows, stack, source=str(path), exclude_model=model)
                    how = "leave-one-model-out"
                else:
                    prof, how = None, "in-sample"
                for r in held:
                    add(r, str(path), how, prof)
                progress(f"  {stack:15s} {model:18s} {how}: {len(held)} runs")
    def run(r):   # the same id and measurement in two files is one run (ids alone repeat across tables)
        return tuple((r.get(k) or "").strip() for k in ("id", "model", "gpu", "num_gpus", "model_tflops_per_gpu"))

    fitted = {run(r) for path in FITTED for r in read_rows(path)}
    for path in sorted(NOT_FITTED_DIR.glob("*.csv")):
        for r in read_rows(path):
            # a run a profile is fitted on is not a never-fitted one (ttx1/ttx2 of torchtitan-more.csv)
            if (r.get("model_tflops_per_gpu") or "").strip() and run(r) not in fitted:
                add(r, str(path), "not fitted")
    for r in OUT_OF_SAMPLE:
        add(dict(r, _compare="tokens"), "bench/accuracy.py", "not fitted")
    return out


def summarise(runs: list[dict]) -> dict:
    """The table: per pool (profile and family) and core regime, the half-width and its runs."""
    from planner.calibration.bands import half_width

    pools: dict = {}
    for r in runs:
        for name in dict.fromkeys((r["pool"], r["family"])):
            pools.setdefault(name, []).append(r)
    doc_pools = {}
    widest = 0.0
    for name, rs in sorted(pools.items()):
        regimes = {}
        for core in sorted({r["core"] for r in rs}):
            errs = [r["log_error"] for r in rs if r["core"] == core]
            h = half_width(errs, QUANTILE, FLOOR)
            regimes[core] = {"half_width": round(h, 3), "runs": len(errs),
                             "median_log_error": round(statistics.median(errs), 3)}
            if len(errs) >= MIN_RUNS:
                widest = max(widest, h)
        doc_pools[name] = {"regimes": regimes, "runs": [
            {k: r[k] for k in ("id", "core", "fsdp", "cp", "precision", "arch", "log_error", "how", "source")}
            for r in rs]}
        if name in {p for r in runs for p in r["by_profile"]}:   # a stack profile: its generations
            doc_pools[name].update(generations(name, runs))

    return {"quantile": QUANTILE, "floor": FLOOR, "min_runs": MIN_RUNS,
            "default_half_width": round(max(DEFAULT_MIN, widest), 3),
            "extrapolation_step": EXTRAPOLATION_STEP, "pools": doc_pools}


def generations(stack: str, runs: list[dict]) -> dict:
    """``fitted_archs``: the GPU generations of the runs ``stack`` was fitted on; ``generations``: per
    other generation and core regime, the widest |ln(pred/meas)| of ``stack``'s predictions of the
    family's measured runs there (few runs: the widest, not a quantile) and their count."""
    fitted = sorted({r["arch"] for r in runs if r["pool"] == stack and r["how"] != "not fitted"})
    gens: dict = {}
    for r in runs:
        if stack in r["by_profile"] and r["arch"] not in fitted:
            cell = gens.setdefault(r["arch"], {}).setdefault(r["core"], {"half_width": 0.0, "runs": 0})
            cell["half_width"] = round(max(cell["half_width"], abs(r["by_profile"][stack]), FLOOR), 3)
            cell["runs"] += 1
    return {"fitted_archs": fitted, "generations": {a: dict(sorted(c.items())) for a, c in sorted(gens.items())}}


def to_yaml(doc: dict) -> str:
    """The table as YAML, one run per line."""
    import json

    lines = ["# Uncertainty bands by stack pool and core regime (planner/cost/uncertainty.py, docs/uncertainty.md).",
             "# Written by `python bench/uncertainty.py --write`; rerun it after refitting a profile.",
             f"# half_width = max(floor, quantile {doc['quantile']} of |ln(predicted/measured)|) over the runs of the",
             "# regime; the band of a prediction T is [T exp(-h), T exp(h)].",
             f"quantile: {doc['quantile']}", f"floor: {doc['floor']}", f"min_runs: {doc['min_runs']}",
             f"default_half_width: {doc['default_half_width']}   # max(ln 1.5, the widest regime with min_runs runs)",
             f"extrapolation_step: {doc['extrapolation_step']}", "pools:"]
    for name, pool in doc["pools"].items():
        lines += [f"  {name}:", "    regimes:"]
        for core, cell in pool["regimes"].items():
            lines.append(f"      {core}: {json.dumps(cell)}")
        if "fitted_archs" in pool:
            lines.append(f"    fitted_archs: {json.dumps(pool['fitted_archs'])}")
            lines.append("    generations:")
            for arch, cells in pool["generations"].items():
                lines.append(f"      {arch}:")
                for core, cell in cells.items():
                    lines.append(f"        {core}: {json.dumps(cell)}")
        lines.append("    runs:")
        for r in pool["runs"]:
            lines.append(f"      - {json.dumps(r)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    print("residuals ln(predicted/measured) of every measured run:")
    runs = residuals()
    print(f"{'id':16s} {'pool':15s} {'model':16s} {'gpu':6s} {'regime':42s} {'err%':>7s}  how")
    for r in runs:
        reg = " ".join([r["core"]] + (["fsdp"] if r["fsdp"] else []) + (["cp"] if r["cp"] else []) + [r["precision"]])
        print(f"{r['id']:16s} {r['pool']:15s} {r['model']:16s} {r['gpu']:6s} {reg:42s} "
              f"{100 * (math.exp(r['log_error']) - 1):+7.1f}  {r['how']}")
    doc = summarise(runs)
    print()
    print(f"half-width per pool and core regime (q{int(100 * QUANTILE)} of |ln error|, floor {FLOOR}; "
          f"used from {MIN_RUNS} runs; default {doc['default_half_width']}):")
    for name, pool in doc["pools"].items():
        for core, cell in pool["regimes"].items():
            h = cell["half_width"]
            used = "" if cell["runs"] >= MIN_RUNS else "  (too few runs: falls back)"
            print(f"  {name:15s} {core:28s} h={h:.3f} (-{100 * (1 - math.exp(-h)):4.1f}% / +{100 * (math.exp(h) - 1):5.1f}%)"
                  f"  {cell['runs']:3d} runs, median error {100 * (math.exp(cell['median_log_error']) - 1):+.1f}%{used}")
    # calibration check: how many runs lie inside the band the table gives their regime (in-sample
    # for the figure itself; about the quantile by construction where a regime has its own figure)
    from planner.cost.uncertainty import Regime, band_for

    inside = 0
    for r in runs:
        parts = r["core"].split()
        reg = Regime(parts[0], parts[1], parts[2] if len(parts) > 2 else None, r["fsdp"], r["cp"], r["precision"],
                     r["arch"])
        inside += abs(r["log_error"]) <= band_for(reg, r["pool"], None, doc).half_width
    print(f"runs inside the band their regime gets: {inside} of {len(runs)} ({100 * inside / len(runs):.0f}%)")
    if "--write" in argv:
        from planner.io import atomic_write_text

        atomic_write_text(OUT, to_yaml(doc))
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
