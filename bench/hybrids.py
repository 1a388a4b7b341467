"""The hybrid families (issue 23): parameters, FLOPs per token against sequence length, and the best plan
on 64 H100 with its wall time.

Run: ``python bench/hybrids.py [--no-plan]``

Prints, per published config in tests/data/configs: total and active parameters; training GFLOP per token
at 4K, 32K and 128K tokens with the share of the attention-core (quadratic) work, next to the same model
with every mixer priced as full causal attention (what the hybrid saves); and, unless ``--no-plan``, the
best layout on a DGX H100 job of 64 GPUs (seq 4096, GBS 512, BF16) with its predicted TFLOP/s per GPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMES = ("qwen3-next-80b-a3b-instruct", "nemotron-h-8b-base-8k", "nemotron-h-47b-base-8k", "nemotron-h-56b-base-8k",
         "nemotron-3-nano-30b-a3b", "deepseek-v3.2-exp")


def _dense_twin(m):
    """The same model with softmax attention wherever a mixer is (GDN/Mamba layers as attention layers,
    DSA as dense MLA): what the quadratic term would be without the hybrid."""
    return m.model_copy(update={"mixers": ("attention",) * m.num_layers, "dsa": None, "gdn": None, "mamba": None})


def main() -> int:
    from planner.config import Training
    from planner.errors import InfeasibleError
    from planner.model.flops import flops_per_token, layer_costs, param_counts
    from planner.model.spec import load_model
    from planner.search.plan import plan
    from topologies.loader import load_cluster

    configs = ROOT / "tests" / "data" / "configs"
    print(f"{'model':30s} {'total':>8s} {'active':>7s}   GFLOP/token (core share) at 4K / 32K / 128K;  "
          "all-attention twin at 128K")
    for name in NAMES:
        m = load_model(configs / name / "config.json")
        p = param_counts(m)
        cells = []
        for s in (4096, 32768, 131072):
            costs = layer_costs(m, s)
            core = 3 * sum(c.attn_core for c in costs) / 1e9
            total = flops_per_token(m, s) / 1e9
            cells.append(f"{total:8.1f} ({core / total:4.0%})")
        twin = flops_per_token(_dense_twin(m), 131072) / 1e9
        print(f"{name:30s} {p.total / 1e9:7.1f}B {p.active / 1e9:6.2f}B  " + " ".join(cells) + f";  {twin:8.1f}")
    if "--no-plan" in sys.argv:
        return 0
    cluster = load_cluster("dgx-h100", gpus=64)
    print("\nbest plan on 64 H100 (seq 4096, GBS 512, bf16):")
    for name in NAMES:
        m = load_model(configs / name / "config.json")
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            best = plan(m, cluster, Training(seq_len=4096, global_batch=512), top=1).plans[0]
            what = f"{best.config.short():28s} {best.prediction.tflops_per_gpu:6.0f} TFLOP/s/GPU " \
                   f"{best.prediction.memory_gib_per_gpu:5.1f} GiB"
        except InfeasibleError as exc:
            what = "refused (exit 3): " + str(exc).split(";")[0][:90]
        print(f"  {name:30s} {what}  [{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
