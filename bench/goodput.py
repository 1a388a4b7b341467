"""Goodput figures and the cost of ``--objective goodput``: DeepSeek-V3 on 288 GB300 (4 NVL72 racks)
planned for throughput and for goodput at several repair times, and Llama 3's own job.

Run: ``python bench/goodput.py``

Prints, per repair time, the GPUs-per-rack option each objective picks, tokens/s, goodput and the
effective share, and the wall time of each search (the goodput objective runs one throughput
search per option: two on NVL72 racks).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from planner.config import Training
    from planner.cost.goodput import JobShape, Resilience, checkpoint_bytes, goodput
    from planner.model.spec import load_model
    from planner.search.plan import plan
    from topologies.loader import load_job

    m = load_model("llama3.1-405b")
    ck = checkpoint_bytes(m, Training(seq_len=8192, global_batch=2048))
    g = goodput(1.0, JobShape(tuple([8] * 2048), 8, 8, (256,), True), ck, Resilience(), "h100")
    print(f"Llama 3 405B on 16,384 H100: {g.interruptions_per_day * 54:.0f} interruptions in 54 days, MTBF "
          f"{g.mtbf_h:.2f} h, checkpoint {g.checkpoint_gb:,.0f} GB in {g.checkpoint_write_s:.1f} s every "
          f"{g.interval_s:.0f} s, effective {g.effective_fraction:.1%} (paper: >90%)")
    m = load_model("deepseek-v3")
    tr = Training(seq_len=4096, global_batch=4608, precision="mxfp8")
    job = load_job("gb300-nvl72", gpus=288)
    for repair in (4, 24, 72, 168):
        s = Resilience(repair_hours=repair)
        for obj in ("throughput", "goodput"):
            t0 = time.perf_counter()
            r = plan(m, job, tr, top=1, objective=obj, resilience=s)
            e = r.plans[0]
            print(f"repair {repair:>3} h, objective {obj:<10}: {e.label} on {e.world} GPUs, "
                  f"{e.prediction.tokens_per_s:,.0f} tokens/s, goodput {e.goodput.goodput_tokens_per_s:,.0f} "
                  f"({e.goodput.effective_fraction:.1%}), {e.goodput.spare_hosts_per_domain} spare trays/rack, "
                  f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
