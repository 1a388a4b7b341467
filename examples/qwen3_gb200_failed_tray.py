"""Qwen3-235B-A22B on 256 GB200 GPUs, then a compute tray fails and the job is re-planned.

A failed NVL72 tray takes 4 GPUs out of its rack's NVLink domain. The cluster's health section
excludes it; planning again gives the best layout on what is left (the EP groups must still fit in
the rack's remaining GPUs, or span racks at a price the plan shows).

    python examples/qwen3_gb200_failed_tray.py --out out/qwen3
"""

import json

from _common import out_dir, summary

import planner
import topologies
from planner.io import atomic_write_text
from topologies.cluster import cluster_from_dict

out = out_dir("qwen3-gb200", __doc__)
model = planner.load_model("qwen3-235b-a22b")
training = planner.Training(seq_len=4096, global_batch=8192, precision="mxfp8", stack="megatron-26.08")

healthy = topologies.load_cluster("gb200-nvl72", gpus=256)
before = planner.plan(model, healthy, training, top=1).to_dict()
print(f"healthy {healthy.num_gpus} GPUs, domains {healthy.domain_sizes()}: {summary(before['plans'][0])}")

# tray 5 of the first rack fails: mark it in the cluster's health section and plan again
data = healthy.model_dump(exclude_none=True)
failed = healthy.nodes[4].name
data.setdefault("health", {}).setdefault("failed_trays", []).append(failed)
degraded = cluster_from_dict(data, "healthy cluster with a failed tray")
after = planner.plan(model, degraded, training, top=1).to_dict()
print(f"tray {failed} failed: {degraded.num_gpus} GPUs, domains {degraded.domain_sizes()}: "
      f"{summary(after['plans'][0])}")
lost = 1 - after["plans"][0]["prediction"]["tokens_per_s_per_gpu"] * len(after["plans"][0]["placement"]["rank_to_gpu"]) / (
    before["plans"][0]["prediction"]["tokens_per_s_per_gpu"] * len(before["plans"][0]["placement"]["rank_to_gpu"]))
print(f"cluster throughput lost to the failed tray: {lost:.1%}")
atomic_write_text(out / "plan-healthy.json", json.dumps(before, indent=1))
atomic_write_text(out / "plan-failed-tray.json", json.dumps(after, indent=1))
