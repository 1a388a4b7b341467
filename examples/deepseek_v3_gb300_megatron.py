"""DeepSeek-V3 on four GB300 NVL72 racks (64 of 72 GPUs used per rack) to a Megatron launch.

Plans the layout with the Python API, writes the Megatron-LM arguments, the environment, the Slurm
script with the rank order that keeps each EP group inside one rack, plan.json and an HTML report.

    python examples/deepseek_v3_gb300_megatron.py --out out/dsv3
    bash out/dsv3/slurm/sbatch.sh      # on the cluster
"""

from _common import out_dir, summary

import planner
import topologies
from planner.output.emit import emit_plan
from planner.output.report import write_report

out = out_dir("dsv3-gb300", __doc__)
model = planner.load_model("deepseek-v3")
cluster = topologies.load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
training = planner.Training(seq_len=4096, global_batch=4096, precision="mxfp8", stack="megatron-26.08",
                            trainer="megatron")
result = planner.plan(model, cluster, training, top=3)
doc = result.to_dict()
for i, entry in enumerate(doc["plans"]):
    print(f"#{i + 1} {summary(entry)}")
written = emit_plan(doc, ["megatron", "slurm"], out)
write_report("plan", doc, out / "report")
print("wrote", ", ".join(str(p.relative_to(out)) for p in written), "and report/index.html")
