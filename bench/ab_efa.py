"""Published A/B sweeps on AWS EFA (bench/data/clouds/ab_efa.csv): measured vs predicted iteration time and
how many pairs of each group the model orders as measured.

    python bench/ab_efa.py              # measured and predicted, pairs ordered
    python bench/ab_efa.py --what-if    # per cell: as shipped, without the unpaired-pass term, with 45 us per call

The ``cuda_graphs`` column: these runs are Megatron-Bridge's qwen3 recipes, which capture no CUDA graphs
(Megatron-Bridge v0.4.2 src/megatron/bridge/recipes/qwen/qwen3_moe.py: ``cuda_graph_impl = "none"``; the
awsome-distributed-ai bench script leaves it), so every layer's kernels are launched by the host.

The ``tp_comm_overlap`` column: no run overlaps its TP collectives with the GEMMs (Transformer Engine's userbuffers).
The Qwen3 recipes leave ``comm_overlap`` None (Megatron-Bridge v0.4.2 src/megatron/bridge/recipes/common.py
``_pretrain_common``: ``comm_overlap=None``; recipes/qwen/qwen3_moe.py keeps its ``CommOverlapConfig`` line commented
out), so megatron-core's ``tp_comm_overlap`` keeps its default False; the DeepSeek-V3 recipe the DeepSeek-V3 and
Kimi-K2 scripts build on says so explicitly (recipes/deepseek/deepseek_v3.py ``deepseek_v3_pretrain_config_32nodes``:
``CommOverlapConfig(tp_comm_overlap=False)``), and no bench script changes it (awsome-distributed-ai
``bench_qwen3_pretrain.py``, ``bench_dsv3_pretrain.py``, ``bench_kimi_k2_pretrain.py``). The planner's default
recipe turns it on wherever TP > 1 with sequence parallelism, as NVIDIA's perf recipes do.

Rows whose dispatcher is a patched transport (UCCL-EP, NVSHMEM over libfabric) are listed but not
predicted: stock Megatron cannot run DeepEP between EFA nodes (planner/cost/dispatch_fabric.py).
"""

from __future__ import annotations

import csv
import itertools
import sys
from pathlib import Path

from topologies.loader import load_cluster

from planner import predict
from planner.config import ParallelConfig, Training
from planner.model.spec import load_model

CSV = Path(__file__).parent / "data" / "clouds" / "ab_efa.csv"
STOCK = ("alltoall", "allgather", "flex-deepep", "flex-hybridep")


def rows() -> list[dict]:
    return list(csv.DictReader(CSV.open()))


def _flag(r: dict, column: str) -> bool | None:
    """A true/false column of the CSV; None where it is empty (the stack's default)."""
    v = (r.get(column) or "").strip().lower()
    if v not in ("", "true", "false"):
        raise SystemExit(f"{CSV}: row {r.get('group')} {r.get('tp')}/{r.get('pp')}/{r.get('ep')}: column {column!r} = "
                         f"{v!r}; give true, false or leave it empty")
    return None if v == "" else v == "true"


def predicted_step(r: dict, **kw) -> float:
    """Predicted seconds per iteration of one CSV row (``predicted``)."""
    return predicted(r, **kw).step_time_s


def predicted(r: dict, stack: str = "megatron-26.08", dispatcher: str | None = None,
              fabric: str | None = None, host_launch_us: float | None = None):
    """The prediction of one CSV row (its layout, batch and recipe). ``dispatcher``, ``fabric``
    and ``host_launch_us`` replace the row's dispatcher, the cluster's fabric kind and its hosts' per-call time
    (what-ifs: bench/efa_alltoall.py prices the patched DeepEP arms as DeepEP on a fabric that runs it)."""
    g = int(r["gpus"])
    cfg = ParallelConfig(tp=int(r["tp"]), pp=int(r["pp"]), vpp=int(r["vpp"]), ep=int(r["ep"]), etp=int(r["etp"]),
                         mbs=int(r["mbs"]), dp=g // (int(r["tp"]) * int(r["pp"])), recompute=r["recompute"],
                         dispatcher=dispatcher or r["dispatcher"])
    tr = Training(seq_len=int(r["seq_len"]), global_batch=int(r["gbs"]), precision=r["precision"], stack=stack,
                  cuda_graphs=_flag(r, "cuda_graphs") is not False,
                  recipe={"overlap_moe_expert_parallel_comm": r["a2a_overlap"] == "on",
                          "tp_comm_overlap": _flag(r, "tp_comm_overlap")})
    cluster = load_cluster(r["cluster"], gpus=g)
    if fabric:
        cluster.fabric = fabric
    if host_launch_us:
        cluster.host_launch_us = host_launch_us
    return predict(load_model(r["model"]), cluster, cfg, tr)


def without_unpaired(r: dict, **kw) -> float:
    """``predicted_step`` as if the EP overlap hid the all-to-all in every pass, warm-up and cool-down included:
    the step without ``compose.unpaired_a2a`` (``expert_a2a.unpaired_passes`` set to 0), the model before it."""
    from unittest import mock

    from planner.cost.terms import expert_a2a

    with mock.patch.object(expert_a2a, "unpaired_passes", lambda pp, vpp, m: 0.0):
        return predicted_step(r, **kw)


def pair_orders(group: list[dict], min_gap: float = 0.0) -> list[tuple[dict, dict, bool]]:
    """Every pair of the group's stock-dispatcher rows measured more than ``min_gap`` apart (relative):
    (a, b, ordered as measured)."""
    out = []
    for a, b in itertools.combinations([r for r in group if r["dispatcher"] in STOCK], 2):
        ma, mb = float(a["iter_s"]), float(b["iter_s"])
        if max(ma, mb) / min(ma, mb) - 1.0 <= min_gap:
            continue
        pa, pb = predicted_step(a), predicted_step(b)
        out.append((a, b, (pa < pb) == (ma < mb)))
    return out


def what_if(data: list[dict]) -> None:
    """``--what-if``: predicted / measured per stock cell as shipped (the EP overlap hides the all-to-all only in
    the paired passes of the combined 1F1B schedule, ``compose.unpaired_a2a``), without that term (every pass
    hidden, ``without_unpaired``), and as shipped with the p5 hosts' fitted launch cost (``host.launch_us@hopper``)
    on the p6-b300 hosts (docs/cloud.md)."""
    from planner.cost.profiles import load_profile

    p5_launch = load_profile("megatron-26.08").params["host.launch_us@hopper"].value
    print(f"{'group':<22} {'layout':<26} {'shipped':>8} {'all-paired':>10} {f'+{p5_launch:.0f}us':>6}")
    for r in data:
        if r["dispatcher"] not in STOCK:
            continue
        meas = float(r["iter_s"])
        host = p5_launch if r["cluster"] == "aws-p6-b300" else None
        lay = f"PP{r['pp']} VPP{r['vpp']} EP{r['ep']} MBS{r['mbs']} {r['a2a_overlap']}"
        print(f"{r['group']:<22} {lay:<26} {predicted_step(r) / meas:>8.2f} {without_unpaired(r) / meas:>10.2f} "
              f"{predicted_step(r, host_launch_us=host) / meas:>6.2f}")


def main() -> None:
    data = rows()
    if "--what-if" in sys.argv:
        what_if(data)
        return
    print(f"{'group':<20} {'layout':<32} {'measured s':>10} {'predicted s':>11}")
    for r in data:
        lay = f"TP{r['tp']} PP{r['pp']} EP{r['ep']} MBS{r['mbs']} ovl {r['a2a_overlap']} {r['dispatcher']}"
        pred = f"{predicted_step(r):.2f}" if r["dispatcher"] in STOCK else "-"
        print(f"{r['group']:<20} {lay:<32} {float(r['iter_s']):>10.2f} {pred:>11}")
    shares = []
    for name, grp in itertools.groupby(data, key=lambda r: r["group"]):
        pairs = pair_orders(list(grp))
        far = [p for p in pairs if max(float(p[0]["iter_s"]), float(p[1]["iter_s"]))
               / min(float(p[0]["iter_s"]), float(p[1]["iter_s"])) > 1.2]
        shares.append(sum(p[2] for p in pairs) / len(pairs))
        print(f"{name}: {sum(p[2] for p in pairs)}/{len(pairs)} pairs ordered as measured; "
              f"{sum(p[2] for p in far)}/{len(far)} of those > 20% apart")
    print(f"per-group mean: {100 * sum(shares) / len(shares):.0f}% of pairs ordered as measured")
    print("micro-batch 1 over micro-batch 4 (same layout), measured / predicted:")
    for r in data:
        if r["dispatcher"] not in STOCK or r["mbs"] != "1":
            continue
        four = [q for q in data if q["group"] == r["group"] and q["mbs"] == "4" and q["dispatcher"] == r["dispatcher"]
                and (q["tp"], q["pp"], q["ep"], q["a2a_overlap"]) == (r["tp"], r["pp"], r["ep"], r["a2a_overlap"])]
        for q in four:
            print(f"  {r['group']:<22} TP{r['tp']} PP{r['pp']} EP{r['ep']}: "
                  f"{float(r['iter_s']) / float(q['iter_s']):.2f}x / {predicted_step(r) / predicted_step(q):.2f}x")


if __name__ == "__main__":
    main()
