"""Wall time of ``planner.search.plan`` to a proven optimum, and the DeepSeek-V3 / 256 GB300 quality check.

    python bench/solver.py              # every case below
    python bench/solver.py dsv3-256     # one case (names below)
    python bench/solver.py --method cp-sat dsv3-256   # the CP-SAT bounded engine (default: enumerate)

Side by side with an earlier checkout (wall and CPU seconds of ``plan()`` in fresh processes, with
start-up and the other figures of issue 22): ``python bench/speed.py --baseline DIR`` (docs/speed.md).

For each case it prints: GPUs, layouts in the declared space, assignments evaluated, build and
search seconds, total wall seconds, status, the best layout and its predicted TFLOP/s per GPU.
The quality case also prices NVIDIA's published layout (TP1 PP2 VPP8 EP32, MBS1, no recompute)
under the same model and placement and prints both.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# This script is named solver.py; drop its own folder from the path so ``import solver`` finds
# the package, not this file.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from planner.config import ParallelConfig, Training  # noqa: E402
from planner.model.spec import load_model  # noqa: E402
from planner.cost.placement import make_placement  # noqa: E402
from planner.search.plan import plan  # noqa: E402
from planner.cost.predict import predict  # noqa: E402
from topologies.loader import load_cluster  # noqa: E402

CASES = {
    # name: (model, cluster preset, gpus, seq, gbs, precision, target seconds)
    "dsv3-256": ("deepseek-v3", "gb300-nvl72", 256, 4096, 4096, "mxfp8", 2),
    "dsv3-1024": ("deepseek-v3", "gb300-nvl72", 1024, 4096, 16384, "mxfp8", 5),
    "dsv3-16384": ("deepseek-v3", "gb300-nvl72", 16384, 4096, 65536, "mxfp8", 20),
    "dsv3-65536-h100": ("deepseek-v3", "dgx-h100", 65536, 4096, 131072, "fp8", 60),   # the preset's largest fabric
    "llama405b-16384-h100": ("llama3.1-405b", "dgx-h100", 16384, 8192, 2048, "bf16", 20),
}


def run(name: str, method: str = "enumerate") -> dict:
    model_name, cl, gpus, seq, gbs, prec, target = CASES[name]
    model = load_model(model_name)
    t0 = time.perf_counter()
    cluster = load_cluster(cl, gpus=gpus)
    t_load = time.perf_counter() - t0
    training = Training(seq_len=seq, global_batch=gbs, precision=prec, stack="megatron-26.08")
    include = None
    if name == "dsv3-256":  # NVIDIA's published layout must be inside the declared space
        include = {"pp": [2], "vpp": [8], "ep": [32], "tp": [1]}
    t1 = time.perf_counter()
    res = plan(model, cluster, training, top=1, include=include, method=method)
    wall = time.perf_counter() - t1
    s = res.solver
    best = res.plans[0]
    row = dict(case=name, gpus=gpus, space=s["layouts_in_space"], rows=s["constraints"], build_s=s["build_s"],
               search_s=s["solve_s"], wall_s=wall, load_s=t_load, status=s["status"], target_s=target,
               best=best.label, world=best.world, gpd=best.placement.gpus_per_domain,
               dispatcher=best.config.dispatcher, tflops=best.prediction.tflops_per_gpu,
               tokens_per_s=best.prediction.tokens_per_s, memory_cuts=s["memory_cuts"],
               model_err=s["program_vs_predict_max_rel_err"], method=s["method"],
               evaluated=s["evaluated_exactly"], cpsat_s=s["cpsat_s"])
    print(f"{name:22s} {gpus:7d} GPUs  [{row['method']}]  space {row['space']:.3g}  "
          f"evaluated exactly {row['evaluated']:,}  cp-sat {row['cpsat_s']:.1f}s  "
          f"build {row['build_s']:.1f}s  search {row['search_s']:.1f}s  wall {wall:.1f}s (target {target}s)  "
          f"{row['status']}  best {row['best']} {row['dispatcher']} on {row['world']} GPUs: "
          f"{row['tflops']:.0f} TFLOP/s/GPU, {row['tokens_per_s']:,.0f} tokens/s", flush=True)
    if name == "dsv3-256":
        nv = ParallelConfig(tp=1, pp=2, vpp=8, ep=32, dp=128, mbs=1, recompute="none", dispatcher="flex-hybridep")
        for gpd in (None,):
            p = predict(model, cluster, nv, training, placement=make_placement(cluster, nv, 256, gpus_per_domain=gpd))
            print(f"  NVIDIA TP1 PP2 VPP8 EP32 MBS1 (flex-hybridep, gpd={gpd}): {p.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                  f"{p.tokens_per_s:,.0f} tokens/s, fits={p.fits} ({p.memory_gib_per_gpu:.0f} GiB); "
                  f"plan's best is {best.prediction.tokens_per_s / p.tokens_per_s:.3f}x")
            bd = {k: round(v, 3) for k, v in p.breakdown.items() if v}
            print(f"    NVIDIA breakdown (s): {bd}")
        bd = {k: round(v, 3) for k, v in best.prediction.breakdown.items() if v}
        print(f"    plan breakdown (s):   {bd}")
    return row


def main(argv: list[str]) -> None:
    import os

    method = "enumerate"
    if argv[:1] == ["--method"]:
        method, argv = argv[1], argv[2:]
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True)
    names = argv or list(CASES)
    for n in names:
        if n not in CASES:
            raise SystemExit(f"unknown case {n!r}; use one of {', '.join(CASES)}")
        run(n, method)


if __name__ == "__main__":
    main(sys.argv[1:])
