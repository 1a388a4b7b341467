"""The Python API from a launcher script: decide the layout at job start, then launch with it.

A launcher knows the cluster it was given (here: the Slurm allocation's size) and the model. It
checks the layout it was asked for with ``predict``, asks ``plan`` for a better one, places it on the
hosts the job was granted (``place``) and turns the winner into the arguments this rank's trainer needs.

    SLURM_NNODES=16 python examples/launcher_api.py --out out/launcher
"""

import json
import os

from _common import out_dir, summary

import planner
import topologies
from planner.output.emit import emit_plan
from topologies.hostlist import expand

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

# at job start: the plan on the hosts Slurm granted (their names are not the plan's); on HGX every host
# is its own NVLink domain, so each granted host is paired with itself (docs/launch.md)
granted = expand(os.environ.get("SLURM_JOB_NODELIST", f"gpu[{101:03d}-{100 + nodes:03d}]"))
placed = planner.place(doc, [(h, h) for h in granted])
rank = int(os.environ.get("RANK", "0"))
print(f"rank {rank} runs on {placed.hosts[rank]} GPU {placed.local[rank]} (the plan named "
      f"{best['placement']['hosts'][rank]})")
files = emit_plan(doc, ["megatron"], out)
print(json.dumps({"config": best["config"], "files": [str(f) for f in files]}, indent=1))
