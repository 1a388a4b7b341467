"""Accuracy of the step-time model on calibration.csv: per-row table, MAPE per stack, leave-one-model-out.

Run: ``python bench/accuracy.py [CSV] [--no-lomo]``

1. Every row predicted with the shipped profile of its stack (planner/data/profiles/<stack>.yaml).
2. MAPE per stack and overall, worst row.
3. Leave-one-model-out: for every stack and every model in it, the profile is re-fitted
   (``planner.calibration.calibrate.calibrate_rows``) on the stack's other models only and the left-out model's rows
   are predicted with it - what a user with a new model gets.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# NVIDIA's published Megatron-Bridge runs the megatron-* profiles are fitted to (planner/data/profiles/README.md)
DEFAULT_CSV = ROOT / "planner" / "data" / "profiles" / "calibration.csv"


def main(argv: list[str]) -> int:
    from planner.calibration.calibrate import calibrate_rows
    from planner.calibration.validate import read_rows, validate_rows

    args = [a for a in argv if not a.startswith("--")]
    csv_path = Path(args[0]) if args else DEFAULT_CSV
    rows = read_rows(csv_path)
    t0 = time.perf_counter()
    res = validate_rows(rows, source=str(csv_path))
    dt = time.perf_counter() - t0
    print(f"{'id':7s} {'stack':15s} {'model':16s} {'GPUs':>10s} {'prec':6s} {'layout':40s} {'pred':>6s} {'meas':>6s} {'err%':>7s}")
    for r in res["rows"]:
        print(f"{r['id']:7s} {r['stack']:15s} {r['model']:16s} {str(r['num_gpus']) + ' ' + r['gpu']:>10s} "
              f"{r['precision']:6s} {r['config'][:40]:40s} {r['predicted_tflops_per_gpu']:6.0f} "
              f"{r['measured_tflops_per_gpu']:6.0f} {r['error_pct']:+7.1f}")
    stacks = sorted({r["stack"] for r in res["rows"]})
    print()
    for st in stacks:
        errs = [abs(r["error_pct"]) for r in res["rows"] if r["stack"] == st]
        print(f"MAPE {st:15s} {statistics.mean(errs):5.2f}%  worst {max(errs):5.1f}%  ({len(errs)} rows)")
    allerr = [abs(r["error_pct"]) for r in res["rows"]]
    worst = max(res["rows"], key=lambda r: abs(r["error_pct"]))
    print(f"MAPE {'all':15s} {statistics.mean(allerr):5.2f}%  worst {worst['id']} {worst['model']} "
          f"{worst['error_pct']:+.1f}%")
    head = [r for r in res["rows"] if r["id"] == "mb276"]
    if head:
        h = head[0]
        print(f"headline mb276 DeepSeek-V3 256 GB300 MXFP8 TP1 PP2 VPP8 EP32: predicted "
              f"{h['predicted_tflops_per_gpu']:.0f} vs measured {h['measured_tflops_per_gpu']:.0f} "
              f"({h['error_pct']:+.1f}%)")
    print(f"prediction time: {1000 * dt / len(rows):.1f} ms per row (cold caches, recompute search included)")
    from planner.cost.predict import predict
    from planner.calibration.validate import resolve_case, row_case

    cases = [resolve_case(row_case(r, source=str(csv_path))) for r in rows]
    t0 = time.perf_counter()
    for c in cases:
        predict(c.model, c.cluster, c.config, c.training)
    warm = (time.perf_counter() - t0) / len(cases)
    print(f"predict(): {1000 * warm:.2f} ms per call with warm per-(model, cluster, layout) caches")
    for stack, fname, who in (("torchtitan", "torchtitan-h100-2024-12.csv", "the TorchTitan team's H100 rows"),
                              ("maxtext", "maxtext-h100-2025.csv", "NVIDIA's MaxText H100 rows")):
        path = ROOT / "planner" / "data" / "profiles" / fname
        if not args and path.exists():
            res_s = validate_rows(read_rows(path), source=str(path))
            errs = ", ".join(f"{r['id']} {r['error_pct']:+.1f}%" for r in res_s["rows"])
            print(f"MAPE {stack:15s} {res_s['mape_pct']:5.2f}%  on {who} ({errs})")
    if not args:
        with_recipe_regimes(rows, str(csv_path))
        out_of_sample()
        published_tables()
        hgx_layout_order()
    if "--no-lomo" in argv:
        return 0
    print()
    print("leave-one-model-out (profile refitted without the model on the CSV as it is; the held-out rows "
          "predicted in their recipe's regime, EAGER_RECIPES):")
    lomo = []
    for st in stacks:
        mine = [r for r in rows if r["stack"] == st]
        for model in sorted({r["model"] for r in mine}):
            prof, _ = calibrate_rows(rows, st, source=str(csv_path), exclude_model=model)
            held = [dict(r, cuda_graphs="false") if r["id"] in EAGER_RECIPES and not args else r
                    for r in mine if r["model"] == model]
            out = validate_rows(held, stack=st, profile=prof, source=str(csv_path))
            for r in out["rows"]:
                lomo.append((st, model, r["id"], r["error_pct"]))
            errs = ", ".join(f"{r['id']} {r['error_pct']:+.1f}%" for r in out["rows"])
            print(f"  {st:15s} without {model:16s} {errs}")
    for st in stacks:
        e = [abs(x[3]) for x in lomo if x[0] == st]
        print(f"LOMO MAPE {st:15s} {statistics.mean(e):5.2f}%  worst {max(e):5.1f}%")
    e = [abs(x[3]) for x in lomo]
    print(f"LOMO MAPE {'all':15s} {statistics.mean(e):5.2f}%  worst {max(e):5.1f}%")
    if not args:
        leave_one_table_out(rows, stacks, str(csv_path))
        hopper_bands()
    return 0


def hopper_bands() -> None:
    """The published H100 Megatron rows (bench/data, calibration.csv) predicted with the default stack,
    whose Hopper parameters are fitted to these rows (bench/hopper.py; leave-one-table-out there): each
    against its band (issue 21 item 3; tests/test_generations.py)."""
    from planner.cost.profiles import DEFAULT_STACK, load_profile
    from planner.calibration.validate import predict_case, read_rows, row_case

    prof = load_profile(DEFAULT_STACK)
    print()
    print(f"published H100 runs predicted with the default stack {DEFAULT_STACK} (its @hopper parameters fitted to these rows, "
          "bench/hopper.py), "
          "tokens/s per GPU (the tables up to 26.04 count model FLOPs with the legacy formula, the stack with the current one):")
    inside = n = 0
    for path in sorted((ROOT / "bench" / "data").glob("*.csv")) + [DEFAULT_CSV]:
        for r in read_rows(path):
            if r["gpu"].strip() != "H100" or not (r.get("stack") or "").startswith("megatron"):
                continue
            p = predict_case(row_case(r, DEFAULT_STACK, str(path), profile=prof), prof)
            meas, pred = float(r["tokens_per_s_per_gpu"]), p.tokens_per_s_per_gpu
            low, high = (pred / p.tflops_per_gpu * x for x in (p.tflops_per_gpu_low, p.tflops_per_gpu_high))
            ok = low <= meas <= high
            inside, n = inside + ok, n + 1
            print(f"  {path.stem[:26]:26s} {r['id']:14s} {r['model']:16s} {r['num_gpus']:>5s} pred {pred:6.0f} "
                  f"meas {meas:6.0f} ({100 * (pred / meas - 1):+6.1f}%) band {low:6.0f}-{high:6.0f} "
                  f"{'inside' if ok else 'OUTSIDE'}")
    print(f"  {inside} of {n} inside their band")


def leave_one_table_out(rows: list[dict], stacks: list[str], source: str) -> None:
    """Each container's table of calibration.csv predicted by its stack's profile fitted on the other
    containers' rows only (the stack keeps its conventions: FLOP formula, dispatcher; the older
    tables of bench/data are out of sample already, see published_tables)."""
    from planner.calibration.calibrate import calibrate_rows
    from planner.calibration.validate import validate_rows

    print()
    print("leave-one-table-out (the stack's profile fitted on the other containers' rows of calibration.csv, "
          "its own table predicted):")
    for st in stacks:
        others = [dict(r, stack=st) for r in rows if r["stack"] != st]
        prof, _ = calibrate_rows(others, st, source=source)
        held = [r for r in rows if r["stack"] == st]
        out = validate_rows(held, stack=st, profile=prof, source=source)["rows"]
        e = [abs(r["error_pct"]) for r in out]
        worst = max(out, key=lambda r: abs(r["error_pct"]))
        print(f"  {st:15s} fitted on {len(others)} rows of {', '.join(sorted({r['stack'] for r in rows} - {st}))}: "
              f"MAPE {statistics.mean(e):5.2f}% over {len(out)} rows, worst {worst['id']} {worst['error_pct']:+.1f}%")


# Measured runs that are not in calibration.csv (never fitted): Kimi-K2 on 256 GB300 from the Megatron-Bridge
# 26.06 performance table (1,099 TFLOP/s and 5,372 tokens/s per GPU: Megatron-Bridge docs/performance-summary-archive.md, 26.06 GB300 Kimi-K2 MXFP8
# row; tests/data/reference/flops_per_token.md);
# layout from Megatron-Bridge scripts/performance/configs/kimi/kimi_workload_base_configs.py
# (KIMI_K2_PRETRAIN_CONFIG_GB300: GBS 4096, MBS 2, PP4 VPP4 EP64, recompute mla_up_proj, HybridEP,
# moe_a2a_overlap=False, cuda_graph_scope=[]: an eager recipe).
OUT_OF_SAMPLE = [
    dict(id="kimi-gb300", stack="megatron-26.08", model="kimi-k2", gpu="GB300", num_gpus="256", precision="mxfp8",
         seq_len="4096", gbs="4096", mbs="2", tp="1", pp="4", vpp="4", cp="1", ep="64", etp="", fsdp="",
         recompute="mla_up_proj", model_tflops_per_gpu="1099", tokens_per_s_per_gpu="5372", cuda_graphs="false"),
]
# Rows of calibration.csv whose published recipe runs eagerly: planner/data/published_recipes.yaml records
# each run's recipe settings with the Megatron-Bridge file and commit (validate and calibrate apply them).
def _eager_recipes() -> dict:
    import yaml

    doc = yaml.safe_load((ROOT / "planner" / "data" / "published_recipes.yaml").read_text())
    return {rid: e["source"] for rid, e in doc["runs"].items() if e.get("cuda_graphs") is False}


EAGER_RECIPES = _eager_recipes()


def out_of_sample() -> None:
    """Out-of-sample rows and the eager recipes: predicted as the CSV has them (graph-captured, the
    stack's usual regime) and in the regime their recipe runs (cuda_graphs=false), Kimi-K2 compared
    in tokens/s so that the FLOP convention drops out."""
    from planner.cost.profiles import load_profile
    from planner.calibration.validate import predict_case, read_rows, row_case

    print()
    print("out of sample (not fitted):")
    for r in OUT_OF_SAMPLE:
        meas = float(r["tokens_per_s_per_gpu"])
        parts = []
        for graphs in ("true", "false"):
            prof = load_profile(r["stack"])
            p = predict_case(row_case(dict(r, cuda_graphs=graphs), r["stack"], profile=prof), prof)
            parts.append(f"cuda_graphs={graphs} {p.tokens_per_s_per_gpu:.0f} tokens/s "
                         f"({100 * (p.tokens_per_s_per_gpu / meas - 1):+.1f}%, {p.tflops_per_gpu:.0f} TFLOP/s)")
        print(f"  {r['id']:11s} {r['model']} {r['num_gpus']} {r['gpu']} measured {meas:.0f} tokens/s "
              f"({r['model_tflops_per_gpu']} TFLOP/s): " + "; ".join(parts))
    print("rows of calibration.csv whose recipe runs eagerly:")
    for row in read_rows(DEFAULT_CSV):
        if row["id"] not in EAGER_RECIPES:
            continue
        prof = load_profile(row["stack"])
        p = predict_case(row_case(dict(row, cuda_graphs="false"), row["stack"], profile=prof), prof)
        meas = float(row["model_tflops_per_gpu"])
        print(f"  {row['id']} with cuda_graphs=false: {p.tflops_per_gpu:.0f} vs {meas:.0f} TFLOP/s "
              f"({100 * (p.tflops_per_gpu / meas - 1):+.1f}%)  [{EAGER_RECIPES[row['id']]}]")


# Older published tables, never fitted (bench/data/, each row with its source): the 26.02 and 25.11
# Megatron-Bridge containers, predicted with the profile their release resolves to (megatron-26.04),
# each row in its recipe's regime where the table records it (cuda_graphs, cuda_graph_scope,
# dispatcher, overlaps: traced in Megatron-Bridge v0.3.0 / v0.2.1, the `recipe` column); "traced"
# groups count only those rows (25.11 rows whose layout matches no preset leave the regime empty).
# ETP is not in those tables (empty: Megatron's default, or 1 when the expert grid needs it).
TABLES = ("megatron-bridge-26.02.csv", "megatron-bridge-25.11.csv")
NVL72 = ("GB200", "GB300")


def published_tables() -> None:
    """Out-of-sample MAPE on older Megatron-Bridge tables, split by system (NVL72 racks or HGX
    nodes) and model kind, with the worst rows."""
    from planner.model.spec import load_model
    from planner.calibration.validate import read_rows, validate_rows

    print()
    print("older published tables (not fitted; predicted with the profile each release resolves to):")
    for name in TABLES:
        path = ROOT / "bench" / "data" / name
        rows = read_rows(path)
        res = validate_rows(rows, source=str(path))
        by_id = {r["id"]: r for r in rows}
        groups: dict = {}
        for r in res["rows"]:
            row = by_id[r["id"]]
            system = "NVL72" if row["gpu"].strip().upper() in NVL72 else "HGX"
            kind = "MoE" if load_model(row["model"].strip()).is_moe else "dense"
            groups.setdefault(f"{system} {kind}", []).append(abs(r["error_pct"]))
            if (row.get("cuda_graphs") or "").strip():   # the recipe's regime traced (recipe column)
                groups.setdefault(f"{system} {kind} traced", []).append(abs(r["error_pct"]))
        parts = ", ".join(f"{k} {statistics.mean(v):.1f}% ({len(v)} rows)" for k, v in sorted(groups.items())
                          if not k.endswith("traced") or len(v) < len(groups[k[:-len(' traced')]]))
        worst = sorted(res["rows"], key=lambda r: -abs(r["error_pct"]))[:4]
        print(f"  {name}: MAPE {res['mape_pct']:.1f}% over {len(res['rows'])} rows; {parts}; worst "
              + ", ".join(f"{r['id']} {r['error_pct']:+.0f}%" for r in worst))


# Issue 12: NVIDIA moved DeepSeek-V3 on 256 B200 (HGX nodes on InfiniBand) from EP8 inside the node to
# EP32 across 4 nodes between the 26.04 and 26.04.01 containers; never fitted (each row with its recipe).
HGX_ORDER = "megatron-bridge-26.04-hgx-dsv3.csv"


def hgx_layout_order() -> None:
    """The two B200 DeepSeek-V3 layouts: predicted, measured, exposed all-to-all, and whether the
    model orders them as measured."""
    from planner.calibration.validate import read_rows, validate_rows

    path = ROOT / "bench" / "data" / HGX_ORDER
    res = validate_rows(read_rows(path), source=str(path))["rows"]
    print()
    print("DeepSeek-V3 on 256 B200, EP8 (26.04) against EP32 across nodes (26.04.01), never fitted:")
    for r in res:
        print(f"  {r['id']:15s} {r['config'][:40]:40s} predicted {r['predicted_tflops_per_gpu']:5.0f} measured "
              f"{r['measured_tflops_per_gpu']:5.0f} ({r['error_pct']:+.1f}%), exposed all-to-all "
              f"{r['breakdown']['ep_a2a']:.1f} of {r['step_time_s']:.1f} s")
    a, b = res
    same = (a["predicted_tflops_per_gpu"] < b["predicted_tflops_per_gpu"]) == \
        (a["measured_tflops_per_gpu"] < b["measured_tflops_per_gpu"])
    print(f"  ordered as measured: {'yes' if same else 'no'}")


def with_recipe_regimes(rows: list[dict], source: str) -> None:
    """MAPE of calibration.csv with each row in the regime its recipe runs (EAGER_RECIPES)."""
    from planner.calibration.validate import validate_rows

    res = validate_rows([dict(r, cuda_graphs="false") if r["id"] in EAGER_RECIPES else r for r in rows],
                        source=source)
    print()
    print("with the recipes' regimes (rows of EAGER_RECIPES predicted with cuda_graphs=false):")
    for st in sorted({r["stack"] for r in res["rows"]}):
        e = [abs(r["error_pct"]) for r in res["rows"] if r["stack"] == st]
        print(f"  MAPE {st:15s} {statistics.mean(e):5.2f}%  worst {max(e):5.1f}%")
    e = [abs(r["error_pct"]) for r in res["rows"]]
    print(f"  MAPE {'all':15s} {statistics.mean(e):5.2f}%  worst {max(e):5.1f}%  rows beyond 25%: "
          f"{sum(x > 25 for x in e)}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
