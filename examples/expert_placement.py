"""Expert placement from a load file: per-layer token counts per expert, as a router records them.

Writes a skewed load file (Zipf over experts, a different ranking per layer), places Qwen3-30B-A3B's
128 experts of each of its 48 MoE layers on EP16 over two HGX H100 nodes with one spare slot per
GPU, and writes the placement (EPLB's physical_to_logical vocabulary, ``-o``) and an HTML report of
the JSON document the command prints. The command line it runs:

    topoplan place-experts --model qwen3-30b-a3b --cluster dgx-h100 --gpus 16 --ep 16 \\
        --slots-per-gpu 9 --loads loads.json --time-limit 0.2 --json -o placement

    python examples/expert_placement.py --out out/experts
"""

import contextlib
import io
import json

import numpy as np
from _common import out_dir

from planner.cli import main
from planner.output.report import write_report

out = out_dir("expert-placement", __doc__)
rng = np.random.default_rng(7)
layers, experts = 48, 128
zipf = 1.0 / np.arange(1, experts + 1) ** 0.8
loads = np.stack([rng.permutation(zipf) for _ in range(layers)]) * 4096 * 8  # tokens x top-k per step
(out / "loads.json").write_text(json.dumps({"loads": np.round(loads).astype(int).tolist()}))
argv = ["place-experts", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--ep", "16",
        "--slots-per-gpu", "9", "--loads", str(out / "loads.json"), "--time-limit", "0.2", "--json",
        "-o", str(out / "placement")]
print("$ topoplan " + " ".join(argv))
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    code = main(argv)
if code:
    raise SystemExit(code)
doc = json.loads(buf.getvalue())
s = doc.get("summary", {})
print(f"balance {s.get('balance', float('nan')):.3f} (worst layer {s.get('worst_balance', float('nan')):.3f}), "
      f"remote NVLink domains per token {s.get('remote_domains_per_token', float('nan')):.2f}")
write_report("place-experts", doc, out / "report")
print(f"report: {out / 'report' / 'index.html'}")
