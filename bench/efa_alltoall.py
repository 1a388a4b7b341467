"""Fit EFA's all-to-all figures of topologies/data/fabrics.yaml (``a2a_net_eff``, ``a2a_peer_pipe_us``) to the
published nccl-tests alltoall_perf rows in bench/data/clouds/efa_alltoall.csv, and print measured vs model.

    python bench/efa_alltoall.py

Rows ``use=fit``: p5.48xlarge (H100, 400 Gb/s EFA per GPU) 2-32 nodes x 32 MiB-2 GiB and 4/8 nodes at 64 MiB,
p6-b300.48xlarge (B300, 800 Gb/s) 2-32 nodes at 64 MiB. Rows ``use=peak``: the sweep's largest busbw, size not
given: printed as a check against the fit at 8 GiB (the sweep's end). Columns: the fit; the shipped figures
(EFA sets no all-to-all figures: the all-reduce's, 0.74 of line rate and pipe_net_us per chunk); held out: fitted
on the other instance's rows only (leave-one-instance-out) and on the other source's rows only
(leave-one-source-out). Then the EFA A/B cells (bench/ab_efa.py) predicted with the shipped figures and with the
fit: the fit is not shipped because it takes every cell further from its measured time (docs/cloud.md).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

import sys

from topologies.collectives import Fabric, shape_of
from topologies.loader import load_cluster

ROWS = Path(__file__).parent / "data" / "clouds" / "efa_alltoall.csv"
KEYS = ("a2a_net_eff", "a2a_peer_pipe_us")
PRESETS = {"p5.48xlarge": "aws-p5", "p6-b300.48xlarge": "aws-p6-b300"}
sys.path.insert(0, str(Path(__file__).parent))


def rows(use: str = "fit") -> list[dict]:
    """The CSV rows of one use, each with ``t_us`` (measured time: S / algbw, algbw = busbw n/(n-1))."""
    out = []
    for r in csv.DictReader(ROWS.open()):
        if r["use"] != use:
            continue
        n = int(r["ranks"])
        r = dict(r, n=n, S=float(r["bytes"] or 8 * 2**30), source_key=r["source"].split("@")[0])
        r["t_us"] = r["S"] / (float(r["busbw_gbs"]) * n / (n - 1) * 1e9) * 1e6
        out.append(r)
    return out


def model(params: dict | None, instance: str, n: int, S: float) -> float:
    """Microseconds of one all-to-all of S bytes per rank over n ranks (8 per node) on the instance's preset:
    ``params`` replace the EFA kind's all-to-all figures ({} = none: the all-reduce's figures; None = yaml)."""
    c = load_cluster(PRESETS[instance], gpus=n)
    fab = Fabric(c)
    if params is not None:
        fab.kind = dataclasses.replace(fab.kind, a2a=dict(params))
    return fab.all_to_all(shape_of(c, range(n)), S) * 1e6


def fit(data: list[dict]) -> dict:
    def resid(x):
        p = dict(zip(KEYS, x))
        return [math.log(model(p, r["instance"], r["n"], r["S"]) / r["t_us"]) for r in data]

    sol = least_squares(resid, x0=np.array([0.8, 1.0]), bounds=([0.3, 0.0], [1.0, 100.0]))
    return {"a2a_net_eff": round(float(sol.x[0]), 3), "a2a_peer_pipe_us": round(float(sol.x[1]), 3)}


def log_errors(params: dict | None, data: list[dict]) -> list[float]:
    return [math.log(model(params, r["instance"], r["n"], r["S"]) / r["t_us"]) for r in data]


def summary(errs: list[float]) -> str:
    e = np.abs(np.exp(np.array(errs)) - 1.0)
    return f"mean |error| {100 * e.mean():.0f}%, worst {100 * e.max():.0f}%"


def print_sweep(p: dict, data: list[dict]) -> None:
    """Measured vs model per row, and the summary in sample and held out."""
    print(f"{'instance':>17} {'ranks':>5} {'MiB':>6} {'measured us':>11} {'fit':>8} {'shipped':>8}")
    for r in data:
        print(f"{r['instance']:>17} {r['n']:>5} {r['S'] / 2**20:>6.0f} {r['t_us']:>11.0f} "
              f"{model(p, r['instance'], r['n'], r['S']):>8.0f} {model(None, r['instance'], r['n'], r['S']):>8.0f}")
    print("in sample, fit:", summary(log_errors(p, data)))
    print("shipped (the all-reduce's figures):", summary(log_errors(None, data)))
    for key, field in (("instance", "instance"), ("source", "source_key")):
        for v in sorted({r[field] for r in data}):
            q = fit([r for r in data if r[field] != v])
            errs = log_errors(q, [r for r in data if r[field] == v])
            print(f"held out ({key} {v.split('/')[-1]}; fitted on the rest {q}): {summary(errs)}")
    print("peak busbw of the sweep (size not given) vs the fit's busbw at 8 GiB:")
    for r in rows("peak"):
        n = r["n"]
        bus = r["S"] / (model(p, r["instance"], n, r["S"]) * 1e-6) * (n - 1) / n / 1e9
        print(f"  {r['instance']:>17} {n:>4} ranks: measured peak {float(r['busbw_gbs']):6.1f} GB/s, fit {bus:6.1f}")


def print_ab(p: dict) -> None:
    """predicted / measured of every stock cell of bench/data/clouds/ab_efa.csv, shipped vs with the fit, and
    how many pairs each orders as measured (bench/ab_efa.py)."""
    import itertools

    import ab_efa
    from topologies import fabrics

    kinds = fabrics._kinds()
    shipped = kinds["efa"]
    stock = [r for r in ab_efa.rows() if r["dispatcher"] in ab_efa.STOCK]
    pred = {}
    for label, kind in (("shipped", shipped), ("fit", dataclasses.replace(shipped, a2a=dict(p)))):
        kinds["efa"] = kind
        try:
            pred[label] = [ab_efa.predicted_step(r) for r in stock]
        finally:
            kinds["efa"] = shipped
    print("EFA A/B cells, predicted / measured: shipped | with the fit")
    for i, r in enumerate(stock):
        m = float(r["iter_s"])
        print(f"  {r['group']:<22} PP{r['pp']} EP{r['ep']} MBS{r['mbs']} overlap {r['a2a_overlap']:<3} "
              f"{pred['shipped'][i] / m:5.2f} | {pred['fit'][i] / m:5.2f}")
    for label, t in pred.items():
        shares = []
        for _, grp in itertools.groupby(range(len(stock)), key=lambda i: stock[i]["group"]):
            pairs = list(itertools.combinations(list(grp), 2))
            ok = sum((t[a] < t[b]) == (float(stock[a]["iter_s"]) < float(stock[b]["iter_s"])) for a, b in pairs)
            shares.append(ok / len(pairs))
        print(f"  {label}: per-group mean {100 * sum(shares) / len(shares):.0f}% of pairs ordered as measured")


def print_patched_arms() -> None:
    """The patched DeepEP arms (UCCL-EP, NVSHMEM over libfabric) of the same sweeps, priced as DeepEP's normal
    kernels (flex-deepep, RDMA at 0.9 of line: what UCCL-EP measures on p6-b300, bench/data/clouds/efa_alltoall.csv
    sources) on the same cluster with the RDMA-capable kind's latencies (roce): where the all-to-all is small,
    is the rest of the step right? And the NCCL arm minus the DeepEP arm, measured vs predicted."""
    import ab_efa

    data = ab_efa.rows()
    print("patched DeepEP arms priced as flex-deepep: measured s, predicted s, ratio, ratio with the hosts at "
          "the p5 hosts' 45 us a call (a what-if, docs/cloud.md); NCCL arm - this arm, measured / predicted")
    for r in data:
        if r["dispatcher"] in ab_efa.STOCK:
            continue
        p = ab_efa.predicted_step(r, dispatcher="flex-deepep", fabric="roce")
        m = float(r["iter_s"])
        same = [q for q in data if q["dispatcher"] == "alltoall" and q["group"] == r["group"]
                and all(q[k] == r[k] for k in ("tp", "pp", "vpp", "ep", "mbs", "a2a_overlap", "recompute"))]
        delta = "" if not same else (f"; NCCL arm - this: {float(same[0]['iter_s']) - m:+.2f} / "
                                     f"{ab_efa.predicted_step(same[0]) - p:+.2f}")
        print(f"  {r['group']:<22} PP{r['pp']} EP{r['ep']} MBS{r['mbs']} overlap {r['a2a_overlap']:<3} "
              f"{r['dispatcher']:<25} {m:6.2f} {p:6.2f} {p / m:5.2f} "
              f"{ab_efa.predicted_step(r, dispatcher='flex-deepep', fabric='roce', host_launch_us=45.0) / m:5.2f}"
              f"{delta}")


def main() -> None:
    data = rows()
    p = fit(data)
    print("fitted EFA all-to-all figures:", p)
    print_sweep(p, data)
    print_ab(p)
    print_patched_arms()


if __name__ == "__main__":
    main()
