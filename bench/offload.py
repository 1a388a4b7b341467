"""Megatron's optimizer CPU offload: the 600B-1T MoE models on 64 H100 (issue 23).

Run: ``python bench/offload.py [--gpus 64] [--gbs 1024]``

Per model (DeepSeek-V3, DeepSeek-V3.2-Exp from its published config.json, Kimi-K2, Kimi-K2.5's config, and
Kimi-K2 also on 64 H200 and 128 H100, Llama 3 70B on 8 H100 as the small case): the best plan on a DGX job
(seq 4096, BF16), the offload
fraction plan chose, the predicted TFLOP/s per GPU and step, the host's optimizer step (``cpu_optimizer``)
and its share of the step, HBM per GPU and the host memory per node; or the one-line refusal. Figures are
predictions of an extrapolated regime (no measured run with the offload), with the wall time of each plan.
Then, for models that fit without it, the best plan with each fraction forced: whether the offload would pay.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = (("deepseek-v3", "dgx-h100", 64), ("tests/data/configs/deepseek-v3.2-exp/config.json", "dgx-h100", 64),
         ("kimi-k2", "dgx-h100", 64), ("tests/data/configs/kimi-k2.5/config.json", "dgx-h100", 64),
         ("kimi-k2", "dgx-h200", 64), ("kimi-k2", "dgx-h100", 128), ("llama3-70b", "dgx-h100", 8))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=None, help="GPUs for the large models (default 64)")
    ap.add_argument("--gbs", type=int, default=1024)
    a = ap.parse_args()
    from planner.config import Training
    from planner.cost.memory import memory_per_gpu
    from planner.errors import TopoplanError
    from planner.model.spec import load_model
    from planner.search.plan import plan
    from topologies.loader import load_cluster

    print(f"{'model':22s} {'GPU':>9s} {'offload':>7s} {'layout':42s} {'TFLOP/s':>7s} {'step s':>7s} "
          f"{'cpu_opt s':>9s} {'share':>6s} {'HBM GiB':>7s} {'host GiB/node':>13s} {'wall s':>6s}")
    for name, preset, n in CASES:
        n = (a.gpus or n) if n == 64 else n
        m = load_model(str(ROOT / name) if name.startswith("tests/") else name)
        cl = load_cluster(preset, gpus=n)
        where = f"{n}x{cl.gpu_spec.name.upper()}"
        tr = Training(seq_len=4096, global_batch=a.gbs if n >= 64 else 64, precision="bf16")
        t0 = time.perf_counter()
        try:
            res = plan(m, cl, tr, top=1)
        except TopoplanError as exc:
            print(f"{m.name:22s} {where:>9s}  refused ({time.perf_counter() - t0:.1f} s): {exc}")
            continue
        wall = time.perf_counter() - t0
        e = res.plans[0]
        p = e.prediction
        f = res.training.recipe.optimizer_offload_fraction or 0.0
        mem = memory_per_gpu(m, e.config, res.training.model_copy(update={"global_batch": e.gbs}), e.world,
                             cl.gpu_spec)
        cpu = p.breakdown.get("cpu_optimizer", 0.0)
        print(f"{m.name:22s} {where:>9s} {f:7.2f} {e.label:42s} {p.tflops_per_gpu:7.0f} {p.step_time_s:7.2f} "
              f"{cpu:9.2f} {cpu / p.step_time_s:6.1%} {p.memory_gib_per_gpu:7.1f} {mem.host_gib_per_node:13.0f} "
              f"{wall:6.1f}")
    _pays()
    return 0


PAYS = (("deepseek-v3", "gb300-nvl72", 256, "mxfp8", 4096), ("llama3-70b", "dgx-h100", 64, "bf16", 512),
        ("qwen3-235b-a22b", "gb200-nvl72", 256, "mxfp8", 8192))


def _pays() -> None:
    """Would the offload pay where it is not needed? The best plan without it against the best plan with each
    fraction forced (the freed HBM may drop recompute or raise the micro-batch; the host step costs)."""
    from planner.config import Training
    from planner.errors import TopoplanError
    from planner.model.spec import load_model
    from planner.search.plan import plan
    from topologies.loader import load_job

    print("\ndoes it pay? best plan without the offload vs the best with each fraction forced (tokens/s)")
    for name, preset, n, prec, gbs in PAYS:
        m, job = load_model(name), load_job(preset, gpus=n)
        row = []
        for f in (0.0, 0.5, 1.0):
            tr = Training(seq_len=4096, global_batch=gbs, precision=prec, recipe={"optimizer_offload_fraction": f})
            try:
                e = plan(m, job, tr, top=1).plans[0]
                row.append(f"{f:g}: {e.prediction.tokens_per_s:,.0f} ({e.label}, cpu_optimizer "
                           f"{e.prediction.breakdown['cpu_optimizer']:.2f} of {e.prediction.step_time_s:.2f} s)")
            except TopoplanError as exc:
                row.append(f"{f:g}: refused ({str(exc)[:60]})")
        print(f"{name} on {n} {job.cluster.gpu_spec.name.upper()}:\n  " + "\n  ".join(row))


if __name__ == "__main__":
    raise SystemExit(main())
