"""How long ``topoplan replan`` takes: DeepSeek-V3 on 1,024 GB200 GPUs (16 NVL72 racks used 64 of 72).

Run: ``python bench/replan.py [GPUS]``

1. The healthy plan (``planner.plan``, not timed as part of the replan).
2. Spare case: one tray fails; its 4 ranks move to a spare tray of the rack (``planner.replan``:
   matching, relocation, the prediction priced again).
3. Re-plan case: three trays of one rack fail (two spares): ``planner.search.plan`` on what is left.
4. Both again through the CLI's output step (plan.json, hostfile, launch files; ``write_outputs``).

Prints the wall time of each step on this machine and the replan's CPU time (the target: under 10 s
for 1,024 GPUs on 2 cores; on a shared machine the wall time counts the other users' load too).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    import planner
    from planner.cli.replan import default_trainers, write_outputs
    from topologies.loader import load_job

    gpus = int(argv[0]) if argv else 1024
    training = planner.Training(seq_len=4096, global_batch=8192, precision="mxfp8")
    model = planner.load_model("deepseek-v3")
    t0 = time.perf_counter()
    doc = planner.plan(model, load_job("gb200-nvl72", gpus=gpus, usable_per_domain=64), training, top=1).to_dict()
    t_plan = time.perf_counter() - t0
    print(f"healthy plan: {doc['plans'][0]['label']} on {doc['plans'][0]['config']['world']} GPUs "
          f"({t_plan:.2f} s)")
    cases = (("one tray (spares)", "gb200-r05-t07"), ("three trays in one rack (re-plan)", "gb200-r05-t[02-04]"))
    for name, failed in cases:
        t0, c0 = time.perf_counter(), time.process_time()
        res = planner.replan(doc, failed)
        t_lib, c_lib = time.perf_counter() - t0, time.process_time() - c0
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            write_outputs(res, Path(tmp) / "out", default_trainers(res.document))
            t_out = time.perf_counter() - t0
        d = res.to_dict()
        print(f"{name:34s} case {res.case:7s} {d['after']['layout']} on {d['after']['world']} GPUs, "
              f"tokens/s {d['change'].get('tokens_per_s', 0):+.1%}, moved ranks {d['moved_ranks']}: "
              f"replan {t_lib:.2f} s (CPU {c_lib:.2f} s) + files {t_out:.2f} s = {t_lib + t_out:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
