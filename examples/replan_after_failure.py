"""A tray fails at 3 a.m.: Qwen3-30B-A3B on two GB200 NVL72 racks used 64 of 72, then ``planner.replan``.

First one tray of rack 2 fails: a spare tray of the same rack takes its 4 ranks (same GPUs, same rank
order). Then three trays of rack 1 fail, more than its two spares: the job is planned again on what
is left, and the cost against the healthy plan is printed. Each answer is written as the CLI writes
it (``topoplan replan plan.json --failed HOSTS --out DIR``): plan.json, hostfile, Megatron and Slurm
launch files, the in-process restart rank assignment.

    python examples/replan_after_failure.py --out out/replan
"""

import json

from _common import out_dir

import planner
from planner.cli.replan import default_trainers, write_outputs
from planner.io import atomic_write_text
from topologies.loader import load_job

out = out_dir("replan", __doc__)
model = planner.load_model("qwen3-30b-a3b")
training = planner.Training(seq_len=4096, global_batch=512, precision="bf16")
healthy = planner.plan(model, load_job("gb200-nvl72", gpus=128, usable_per_domain=64), training, top=1).to_dict()
atomic_write_text(out / "plan-healthy.json", json.dumps(healthy, indent=1) + "\n")
print(f"healthy: {healthy['plans'][0]['label']} on {healthy['plans'][0]['config']['world']} GPUs")

for name, failed in (("one-tray", "gb200-r02-t07"), ("three-trays", "gb200-r01-t[02-04]")):
    res = planner.replan(healthy, failed)
    d = res.to_dict()
    write_outputs(res, out / name, default_trainers(res.document))
    print(f"{failed}: {res.case}", end="")
    for m in res.moves:
        print(f"; {m.host} -> {m.spare}: ranks {m.ranks[0]}-{m.ranks[-1]}", end="")
    print(f"; now {d['after']['layout']} on {d['after']['world']} GPUs, "
          f"TFLOP/s per GPU {d['change']['tflops_per_gpu']:+.1%}, tokens/s {d['change']['tokens_per_s']:+.1%}")
