"""The closed loop on your own cluster: plan, trial runs, logs back, refit, plan again.

A team runs a Megatron stack topoplan has never seen ("my-megatron": no shipped profile describes
it). It has the rank logs of six earlier runs on its clusters and wants a plan for Qwen3-30B-A3B on
one DGX B300 that it can trust. No GPU runs here: the logs in examples/logs/ are SYNTHESIZED (each
says so in its first line and its name) from six published runs (calibration.csv rows mb174, mb182,
mb188, mb196, mb199, mb202: Megatron-Bridge's 26.04 table), with megatron-core 0.19.2's exact log
format and each run's published step time. The other twelve rows of that stack are the runs the
team has not shown topoplan; they judge the refitted profile.

1. plan the job with the default profile and write trial files for its two best layouts and the
   layout the team ran before (``--compare``), 20 iterations each (``topoplan trial``);
2. the logs come back: the earlier run of the compare layout lands in its trial's ``logs/``
   (``topoplan trial-report`` shows predicted against measured);
3. refit: ``calibrate`` reads the six logs (examples/logs/runs.csv: id, stack, model, gpu, num_gpus,
   log) and fits my-megatron starting from the newest shipped Megatron profile (calibrate's default
   for a stack without a profile of its own); the twelve unseen runs are predicted with it;
4. plan again with the fitted profile (``--stack fitted.yaml``) and report the trials refitted.

    python examples/closed_loop.py --out out/closed_loop
"""

import csv
import json
import shutil
from pathlib import Path

from _common import out_dir, summary

import planner
import topologies
from planner.calibration.calibrate import calibrate_rows
from planner.cost.profiles import CALIBRATION_CSV, dump_profile, load_profile
from planner.calibration.validate import read_rows, validate_rows
from planner.io import atomic_write_text
from planner.output.trial import report, write_trials

out = out_dir("closed_loop", __doc__)
HERE = Path(__file__).resolve().parent
LOGS = HERE / "logs"
CALIBRATION = CALIBRATION_CSV   # NVIDIA's published runs, shipped with the profiles
STACK = "my-megatron"
COMPARE = planner.ParallelConfig(tp=1, pp=1, ep=8, mbs=8)   # the layout of run mb199 (published)

# 1. plan and trial files (the default profile: what topoplan knows before the team's runs)
model = planner.load_model("qwen3-30b-a3b")
cluster = topologies.load_cluster("dgx-b300", gpus=8)
training = planner.Training(seq_len=4096, global_batch=512, precision="mxfp8")
before = planner.plan(model, cluster, training, top=2).to_dict()
(out / "plan.json").write_text(json.dumps(before, indent=1))
print(f"plan (shipped profile): {summary(before['plans'][0])}")
trials_dir = out / "trials"
trials = write_trials(before, trials_dir, top=2, iters=20, compare=COMPARE)
for t in trials:
    print(f"trial {t['id']}: {t['label']}, predicted {t['predicted']['tflops_per_gpu']:,.0f} TFLOP/s per GPU")

# 2. logs back: the team's earlier run of the compare layout is that trial's log
cmp_trial = next(t for t in trials if t["compare"])
shutil.copy(LOGS / "mb199.synthesized.log", trials_dir / cmp_trial["id"] / "logs" / "mb199.synthesized.log")
rep = report(trials_dir)
for t in rep["trials"]:
    meas = (f"measured {t['measured_tflops_per_gpu']:,.0f} ({t['error_pct']:+.1f}%, {t['iters_used']} iterations)"
            if "measured_tflops_per_gpu" in t else "no log yet")
    print(f"  {t['label']:24s} predicted {t['predicted_tflops_per_gpu']:7,.0f}  {meas}")

# 3. refit from the logs: a third of the stack's runs; the other two thirds judge it
runs = read_rows(LOGS / "runs.csv")                       # each row's log gives layout, batch, step time
with (out / "runs-from-logs.csv").open("w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in runs for k in r)))
    w.writeheader()
    w.writerows(runs)
fitted, info = calibrate_rows(runs, STACK, source="examples/logs/runs.csv")
fitted_yaml = out / f"{STACK}.yaml"
atomic_write_text(fitted_yaml, dump_profile(fitted))
mine = load_profile(str(fitted_yaml))
seen = {r["id"] for r in runs}
from planner.model.flops import flops_per_token  # noqa: E402

unseen = []
for r in read_rows(CALIBRATION):
    if r["stack"] == "megatron-26.04" and r["id"] not in seen:
        # measured TFLOP/s in the fitted profile's FLOP convention, from the measured tokens/s
        fpt = flops_per_token(planner.load_model(r["model"]), int(r["seq_len"]), tp=int(r["tp"] or 1),
                              formula=mine.flops_formula)
        unseen.append({**r, "stack": STACK, "dispatcher": r.get("dispatcher") or load_profile(r["stack"]).dispatcher,
                       "model_tflops_per_gpu": f"{float(r['tokens_per_s_per_gpu']) * fpt / 1e12:.2f}"})
own = validate_rows(runs, stack=str(fitted_yaml), profile=mine)
held = validate_rows(unseen, stack=str(fitted_yaml), profile=mine)
print(f"fitted {STACK} on {info['rows']} logs (MAPE {own['mape_pct']:.1f}%) -> {fitted_yaml}")
print(f"unseen runs of the stack: {len(unseen)}, MAPE {held['mape_pct']:.1f}% (worst {held['max_abs_error_pct']:.1f}%)")

# 4. plan again with the fitted profile; the trials refitted
after = planner.plan(model, cluster, training.model_copy(update={"stack": STACK}), top=2, profile=mine).to_dict()
(out / "plan-fitted.json").write_text(json.dumps(after, indent=1))
print(f"plan ({STACK}): {summary(after['plans'][0])}")
rep = report(trials_dir, mine)
(out / "trial-report.json").write_text(json.dumps(rep, indent=1))
for t in rep["trials"]:
    if "refitted_tflops_per_gpu" in t:
        print(f"  {t['label']:24s} measured {t['measured_tflops_per_gpu']:7,.0f}  planned {t['error_pct']:+.1f}%  "
              f"refitted {t['refitted_tflops_per_gpu']:,.0f} ({t['refitted_error_pct']:+.1f}%)")
