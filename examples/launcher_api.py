"""The Python API from a launcher script: decide the layout at job start, then launch with it.

A launcher knows the cluster it was given (here: the Slurm allocation's size) and the model. It
checks the layout it was asked for with ``predict``, asks ``plan`` for a better one, and turns the
winner into the arguments this rank's trainer needs, without files in between.

    SLURM_NNODES=16 python examples/launcher_api.py --out out/launcher
"""

import json
import os

from _common import out_dir, summary

import planner
import topologies
from planner.output.emit import emit_plan

out = out_dir("launcher", __doc__)
nodes = int(os.environ.get("SLURM_NNODES", "16"))
model = planner.load_model("llama3-70b")
cluster = topologies.load_cluster("dgx-h100", gpus=8 * nodes)
training = planner.Training(seq_len=8192, global_batch=256, precision="fp8", stack="megatron-26.08")

# what the user asked for
asked = planner.ParallelConfig(tp=8, pp=4, mbs=1)
p = planner.predict(model, cluster, asked, training)
print(f"asked {asked.short()}: {p.tflops_per_gpu:,.0f} TFLOP/s per GPU, fits={p.fits}")

# what the planner recommends
doc = planner.plan(model, cluster, training, top=1).to_dict()
best = doc["plans"][0]
print(f"planned {summary(best)}")
gain = best["prediction"]["tflops_per_gpu"] / p.tflops_per_gpu - 1 if p.fits else float("inf")
print(f"predicted gain over the asked layout: {gain:+.1%}")

# this rank's view: its host and local GPU come from the plan's rank order
rank = int(os.environ.get("RANK", "0"))
placement = best["placement"]
print(f"rank {rank} runs on {placement['hosts'][rank]} GPU {placement['local_ranks'][rank]}")
files = emit_plan(doc, ["megatron"], out)
print(json.dumps({"config": best["config"], "files": [str(f) for f in files]}, indent=1))
