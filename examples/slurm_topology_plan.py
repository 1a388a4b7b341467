"""Import a Slurm topology.conf (topology/block, one block per GB200 NVL72 rack) and plan on it.

The same commands a user types, run through the CLI entry point:

    topoplan topology import slurm topology.conf --gpu gb200 --gpus-per-node 4 -o cluster.yaml
    topoplan topology show cluster.yaml
    topoplan plan --model qwen3-30b-a3b --cluster cluster.yaml --precision mxfp8 --gbs 1024 --save-plan plan.json

    python examples/slurm_topology_plan.py --out out/slurm
"""

from _common import out_dir

from planner.cli import main

out = out_dir("slurm-topology", __doc__)
conf = out / "topology.conf"
# two racks of 18 trays x 4 GPUs: Slurm sees 18-node blocks (BlockSizes=18)
conf.write_text("BlockName=rack1 Nodes=gb200-a[01-18]\nBlockName=rack2 Nodes=gb200-b[01-18]\nBlockSizes=18\n")
steps = [
    ["topology", "import", "slurm", str(conf), "--gpu", "gb200", "--gpus-per-node", "4",
     "-o", str(out / "cluster.yaml")],
    ["topology", "show", str(out / "cluster.yaml")],
    ["plan", "--model", "qwen3-30b-a3b", "--cluster", str(out / "cluster.yaml"), "--precision", "mxfp8",
     "--gbs", "1024", "--save-plan", str(out / "plan.json")],
]
for argv in steps:
    print("$ topoplan " + " ".join(argv))
    code = main(argv)
    if code:
        raise SystemExit(code)
