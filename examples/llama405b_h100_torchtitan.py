"""Llama 3.1 405B on 1,024 H100 GPUs (128 HGX nodes) to a TorchTitan launch.

The plan is solved under TorchTitan's own rules (ParallelDims), then written as the TorchTitan 0.3
command line, the 0.2-style TOML job file and the Slurm hostfile.

    python examples/llama405b_h100_torchtitan.py --out out/llama405b
"""

from _common import out_dir, summary

import planner
import topologies
from planner.output.emit import emit_plan

out = out_dir("llama405b-h100", __doc__)
model = planner.load_model("llama3.1-405b")
cluster = topologies.load_cluster("dgx-h100", gpus=1024)
training = planner.Training(seq_len=8192, global_batch=2048, precision="bf16", stack="torchtitan",
                            trainer="torchtitan")
result = planner.plan(model, cluster, training, top=3, trainer="torchtitan")
doc = result.to_dict()
print(summary(doc["plans"][0]))
written = emit_plan(doc, ["torchtitan", "slurm"], out)
print("wrote", ", ".join(str(p.relative_to(out)) for p in written))
print((out / "torchtitan" / "command.txt").read_text())
