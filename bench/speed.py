"""Speed of the things a user waits for, side by side with another checkout (issue 22 item 5).

    python bench/speed.py                              # this checkout: start-up, solve, refusal
    python bench/speed.py --baseline ../topoplan-main  # the same, beside another checkout's figures
    python bench/speed.py --experts --tests            # also place-experts per model and the test loop

Every figure is measured in a fresh subprocess (imports included where the user pays them) and
repeated (``--repeat``); it prints the best wall seconds and the least CPU seconds (user + sys of
the child) of the runs, because on a shared machine wall time mostly measures the neighbours.
Rows:

* ``topoplan --help``: the CLI's start-up (target 0.5 s).
* ``plan()`` of the solver cases below: wall and CPU of ``planner.search.plan`` alone, the model and
  cluster loaded beforehand (targets: 1 s at 256 GPUs, 3 s at 16K), and the README's first command
  end to end (``topoplan plan ... --gpus 256``).
* ``--gpus 100000000``: how the CLI answers an absurd count (``--absurd-timeout`` seconds at most;
  a killed run prints ``>T``), with the child's peak memory.
* ``place-experts`` (``--experts``): the CLI on 58 layers of seeded Zipf loads for DeepSeek-V3,
  EP64 over 8 HGX H100 nodes and EP256 over four GB300 NVL72 racks (target 10 s per model).
* the quick test loop (``--tests``): ``python -m pytest -q`` (target 60 s on 2 cores), cold (no
  bytecode: a fresh clone's first run, or ``PYTHONDONTWRITEBYTECODE=1``) and warm (bytecode cached).

The baseline checkout is run with its own code (``PYTHONPATH`` set to it); make one with
``git worktree add ../topoplan-main <commit>`` (docs/speed.md names the commit of its figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SOLVE_CASES = {
    # name: (model, cluster preset, gpus, seq, gbs, precision)
    "dsv3-256-gb300": ("deepseek-v3", "gb300-nvl72", 256, 4096, 4096, "mxfp8"),
    "qwen3-235b-256-gb200": ("qwen3-235b-a22b", "gb200-nvl72", 256, 4096, 8192, "mxfp8"),
    "dsv3-16384-gb300": ("deepseek-v3", "gb300-nvl72", 16384, 4096, 65536, "mxfp8"),
    "llama405b-16384-h100": ("llama3.1-405b", "dgx-h100", 16384, 8192, 2048, "bf16"),
}
README_PLAN = ["plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "256",
               "--precision", "mxfp8", "--seq-len", "4096", "--gbs", "4096"]
ABSURD = ["plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "100000000",
          "--precision", "mxfp8", "--gbs", "4096"]
EXPERT_CASES = {
    # name: (cluster, gpus, ep, usable per rack, slots per GPU)
    "dsv3-ep64-8xhgx": ("dgx-h100", 64, 64, None, 5),
    "dsv3-ep256-4xnvl72": ("gb300-nvl72", 256, 256, 64, 2),
}

_SOLVE = """
import sys, time
from planner.config import Training
from planner.model.spec import load_model
from planner.search.plan import plan
from topologies.loader import load_cluster
m, cl, g, s, gbs, p = sys.argv[1:7]
model, cluster = load_model(m), load_cluster(cl, gpus=int(g))
tr = Training(seq_len=int(s), global_batch=int(gbs), precision=p)
w, c = time.perf_counter(), time.process_time()
res = plan(model, cluster, tr, top=3)
print(time.perf_counter() - w, time.process_time() - c, res.solver["status"], res.plans[0].label,
      round(res.plans[0].prediction.tokens_per_s))
"""


# Runs one command and reports its own child's CPU seconds and peak memory (RUSAGE_CHILDREN of a
# fresh process holds that child alone), killing it after the timeout.
_WRAP = """
import json, resource, subprocess, sys, time
timeout = float(sys.argv[1]) or None
t = time.perf_counter()
try:
    p = subprocess.run(sys.argv[2:], capture_output=True, text=True, timeout=timeout)
    rc, out, err = p.returncode, p.stdout, p.stderr
except subprocess.TimeoutExpired as exc:
    rc, out, err = None, exc.stdout or "", exc.stderr or ""
    out, err = (x.decode() if isinstance(x, bytes) else x for x in (out, err))
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stdout.write(out)
sys.stderr.write(err + "\\n@@" + json.dumps({"rc": rc, "wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_kib": ru.ru_maxrss}))
"""


def _child(cmd: list[str], tree: Path, timeout: float | None = None, env: dict | None = None) -> dict:
    """Run ``cmd`` with ``tree``'s code: wall seconds, its CPU seconds (user + sys), peak RSS, output.
    ``env``: variables to set for it (None as a value: unset)."""
    env = {k: v for k, v in {**os.environ, "PYTHONPATH": str(tree), **(env or {})}.items() if v is not None}
    proc = subprocess.run([sys.executable, "-c", _WRAP, str(timeout or 0), *cmd], cwd=tree, env=env,
                          capture_output=True, text=True)
    err, _, tail = proc.stderr.rpartition("\n@@")
    info = json.loads(tail)
    return {"rc": info["rc"], "wall": info["wall"], "cpu": info["cpu"], "maxrss_mib": info["maxrss_kib"] / 1024,
            "out": proc.stdout, "err": err}


def _best(runs: list[dict]) -> dict:
    """The fastest run's figures, with the least CPU of all runs (each is a lower bound of the code's
    cost that the neighbours' load can only raise)."""
    best = dict(min(runs, key=lambda r: r["wall"]))
    best["cpu"] = min(r["cpu"] for r in runs)
    return best


def measure(tree: Path, args) -> dict:
    """{row name: (wall s, cpu s, note)} for one checkout."""
    py = [sys.executable]
    rows: dict = {}
    r = _best([_child(py + ["-m", "planner.cli", "--help"], tree) for _ in range(args.repeat)])
    rows["topoplan --help"] = (r["wall"], r["cpu"], f"rc {r['rc']}")
    for name, case in SOLVE_CASES.items():
        runs = []
        for _ in range(args.repeat):
            r = _child(py + ["-c", _SOLVE, *map(str, case)], tree)
            if r["rc"] != 0:
                raise SystemExit(f"{name} in {tree}: {r['err'].strip().splitlines()[-1:]}")
            wall, cpu, *rest = r["out"].split()
            runs.append({"wall": float(wall), "cpu": float(cpu), "note": " ".join(rest)})
        b = _best(runs)
        rows[f"plan() {name}"] = (b["wall"], b["cpu"], b["note"])
    r = _best([_child(py + ["-m", "planner.cli", *README_PLAN], tree) for _ in range(args.repeat)])
    rows["topoplan plan (README, 256 GB300)"] = (r["wall"], r["cpu"], f"rc {r['rc']}")
    r = _child(py + ["-m", "planner.cli", *ABSURD], tree, timeout=args.absurd_timeout)
    note = (f"killed after {args.absurd_timeout:g} s" if r["rc"] is None else
            f"rc {r['rc']}: {(r['err'].strip().splitlines() or [''])[-1][:90]}")
    rows["plan --gpus 100000000"] = (r["wall"], r["cpu"], f"{note}; peak {r['maxrss_mib']:.0f} MiB")
    if args.experts:
        rows.update(_experts(tree, args))
    if args.tests:
        rows.update(_tests(tree))
    return rows


BYTECODE_DIRS = ("planner", "solver", "topologies", "tests", "bench", "examples")


def _tests(tree: Path) -> dict:
    """The quick loop twice: cold, as a fresh clone's first run or a machine that writes no bytecode
    (``PYTHONDONTWRITEBYTECODE=1``, as this project's build machine runs: every module is compiled and
    every test module's asserts rewritten in each xdist worker), and warm, with the bytecode a previous
    run wrote (a collection, ``--co``, writes it first). Clears the checkout's own ``__pycache__``
    folders (``BYTECODE_DIRS``; git ignores them) before the cold run."""
    import shutil

    for top in BYTECODE_DIRS:
        for d in sorted((tree / top).rglob("__pycache__"), reverse=True):
            shutil.rmtree(d, ignore_errors=True)
    loop = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    rows = {}
    r = _child(loop, tree, env={"PYTHONDONTWRITEBYTECODE": "1"})
    rows["pytest -q (quick loop), cold: no bytecode"] = (r["wall"], r["cpu"], _tail(r))
    _child(loop + ["--co", "-n", "0"], tree, env={"PYTHONDONTWRITEBYTECODE": None})
    r = _child(loop, tree, env={"PYTHONDONTWRITEBYTECODE": None})
    rows["pytest -q (quick loop), warm: bytecode cached"] = (r["wall"], r["cpu"], _tail(r))
    return rows


def _tail(r: dict) -> str:
    return (r["out"].strip().splitlines() or [""])[-1][:90]


def _experts(tree: Path, args) -> dict:
    import numpy as np

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        loads = np.random.default_rng(0).zipf(1.8, size=(58, 256)).astype(float)   # seeded, heavy-tailed
        path = Path(tmp) / "loads.npy"
        np.save(path, loads)
        for name, (cl, gpus, ep, per_rack, k) in EXPERT_CASES.items():
            cmd = [sys.executable, "-m", "planner.cli", "place-experts", "--model", "deepseek-v3", "--cluster", cl,
                   "--gpus", str(gpus), "--ep", str(ep), "--slots-per-gpu", str(k), "--loads", str(path), "--json"]
            if per_rack:
                cmd += ["--usable-per-rack", str(per_rack)]
            r = _child(cmd, tree)
            note = f"rc {r['rc']}"
            if r["rc"] != 0:     # e.g. a checkout from before place-experts had --usable-per-rack
                note += ": " + (r["err"].strip().splitlines() or [""])[-1][:80]
            if r["rc"] == 0:
                doc = json.loads(r["out"])
                s = doc["summary"]
                cpsat = sum(not str(x.get("solver_status", "greedy")).startswith("greedy") for x in doc["layers"])
                note += (f", balance {s['balance']:.3f} (worst {s['worst_balance']:.3f}), "
                         f"remote domains/token {s['remote_domains_per_token']:.2f}, CP-SAT on {cpsat} layers")
            rows[f"place-experts {name} (58 layers)"] = (r["wall"], r["cpu"], note)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout to measure beside this one")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the fastest is shown (default 3)")
    ap.add_argument("--absurd-timeout", type=float, default=60.0)
    ap.add_argument("--experts", action="store_true", help="also place-experts per model (minutes on main)")
    ap.add_argument("--tests", action="store_true", help="also the quick test loop (minutes)")
    args = ap.parse_args(argv)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs", flush=True)
    trees = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    figures = {label: measure(tree, args) for label, tree in trees}
    head = "| what | " + " | ".join(f"{lb} wall s | {lb} CPU s" for lb, _ in trees) + " | note (this) |"
    print(head)
    print("|---" * (2 + 2 * len(trees)) + "|")
    for row, (wall, cpu, note) in figures["this"].items():
        cells = [f"{wall:.2f} | {cpu:.2f}"]
        if args.baseline:
            bw, bc, _ = figures["baseline"].get(row, (float("nan"), float("nan"), ""))
            cells.append(f"{bw:.2f} | {bc:.2f}")
        print(f"| {row} | " + " | ".join(cells) + f" | {note} |")
    if args.baseline:
        print("baseline notes: " + "; ".join(f"{k}: {v[2]}" for k, v in figures["baseline"].items()))


if __name__ == "__main__":
    main()
