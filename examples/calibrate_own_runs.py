"""Fit your own stack profile to runs you measured, check it, and predict with it.

A team on a GB200 NVL72 cluster has benchmarked a handful of recipes with its own container (here:
the GB200 rows of Megatron-Bridge's 26.02 performance table, docs/performance-summary-archive.md).
The shipped profiles describe NVIDIA's releases; this fits one to the team's numbers and uses it:

1. write the runs as a CSV in the schema of calibration.csv (``cuda_graphs`` is optional);
2. ``calibrate_rows`` fits the profile (priors and bounds, least squares on log error) and the
   profile goes to a YAML file that ``topoplan predict|plan|validate --stack FILE`` accept;
3. ``validate_rows`` shows the rows against the shipped profile and against the fitted one;
4. ``plan`` lays out a job the team has not run, with its own profile and with the shipped one.

    python examples/calibrate_own_runs.py --out out/calibrate
"""

import csv

from _common import out_dir, summary

import planner
import topologies
from planner.calibration.calibrate import calibrate_rows
from planner.io import atomic_write_text
from planner.cost.profiles import dump_profile, load_profile
from planner.calibration.validate import validate_rows

out = out_dir("calibrate", __doc__)
SOURCE = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, 26.02 NeMo container, DGX-GB200"
FIELDS = ["id", "stack", "model", "gpu", "num_gpus", "precision", "seq_len", "gbs", "mbs", "tp", "pp", "vpp", "cp",
          "ep", "etp", "fsdp", "recompute", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "source"]
RUNS = [  # id, model, precision, seq, gbs, mbs, tp, pp, vpp, ep, fsdp, tokens/s/GPU, TFLOP/s/GPU
    ("l70-mx", "llama3-70b", "mxfp8", 8192, 256, 1, 2, 4, 5, 1, 0, 3613, 1623),
    ("l70-fp8", "llama3-70b", "fp8", 8192, 256, 2, 1, 1, 1, 1, 64, 4040, 1815),
    ("l405-fp8", "llama3.1-405b", "fp8", 8192, 1536, 1, 4, 16, 4, 1, 0, 793, 2004),
    ("dsv3", "deepseek-v3", "mxfp8", 4096, 4096, 1, 1, 4, 4, 64, 0, 3955, 1028),
    ("oss", "gpt-oss-120b", "bf16", 4096, 1280, 4, 1, 1, 1, 64, 0, 15784, 428),
    ("q30", "qwen3-30b-a3b", "mxfp8", 4096, 512, 4, 1, 1, 1, 8, 0, 26084, 600),
    ("q235", "qwen3-235b-a22b", "mxfp8", 4096, 8192, 1, 1, 8, 1, 32, 0, 5448, 806),
]
GPUS = {"llama3-70b": 64, "llama3.1-405b": 256, "deepseek-v3": 256, "gpt-oss-120b": 64, "qwen3-30b-a3b": 8,
        "qwen3-235b-a22b": 256}
STACK = "my-gb200"

rows = []
for rid, model, prec, seq, gbs, mbs, tp, pp, vpp, ep, fsdp, tok, tfl in RUNS:
    rows.append(dict(id=rid, stack=STACK, model=model, gpu="GB200", num_gpus=GPUS[model], precision=prec, seq_len=seq,
                     gbs=gbs, mbs=mbs, tp=tp, pp=pp, vpp=vpp, cp=1, ep=ep, etp="", fsdp=fsdp, recompute="",
                     tokens_per_s_per_gpu=tok, model_tflops_per_gpu=tfl, source=SOURCE))
runs_csv = out / "runs.csv"
with runs_csv.open("w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
rows = [{k: str(v) for k, v in r.items()} for r in rows]

# 2. fit the profile (the 26.02 release's FLOP convention is megatron-26.04's: start from that profile)
fitted, info = calibrate_rows([dict(r, stack="megatron-26.04") for r in rows], "megatron-26.04", source=str(runs_csv))
fitted = fitted.model_copy(update={"name": STACK, "description": f"fitted to {len(rows)} GB200 runs ({SOURCE})"})
profile_yaml = out / f"{STACK}.yaml"
atomic_write_text(profile_yaml, dump_profile(fitted))
mine = load_profile(str(profile_yaml))   # what `--stack out/calibrate/my-gb200.yaml` loads
print(f"fitted {len(rows)} runs -> {profile_yaml}")

# 3. the rows against the shipped profile and against the fitted one
shipped = validate_rows([dict(r, stack="megatron-26.04") for r in rows], source=str(runs_csv))
own = validate_rows(rows, stack=str(profile_yaml), profile=mine, source=str(runs_csv))
for a, b in zip(shipped["rows"], own["rows"]):
    print(f"  {a['id']:9s} measured {a['measured_tflops_per_gpu']:6.0f}  shipped {a['error_pct']:+6.1f}%  "
          f"fitted {b['error_pct']:+6.1f}%")
print(f"MAPE: shipped megatron-26.04 {shipped['mape_pct']:.1f}%, fitted {own['mape_pct']:.1f}%")

# 4. plan a model size the team has not run, with its own profile and with the shipped one
model = planner.load_model("qwen3-235b-a22b")
cluster = topologies.load_cluster("gb200-nvl72", gpus=128)
tr = planner.Training(seq_len=4096, global_batch=4096, precision="mxfp8", stack=STACK)
for name, prof in ((STACK, mine), ("megatron-26.04", load_profile("megatron-26.04"))):
    doc = planner.plan(model, cluster, tr, top=1, profile=prof).to_dict()
    print(f"Qwen3-235B on 128 GB200 with {name}: {summary(doc['plans'][0])}")
