"""megatron-core 0.19.2's own ``RankGenerator`` groups for placement checks.

Usage: ``python rank_generator_check.py JOBS.json RESULTS.json`` with megatron-core unpacked on
PYTHONPATH. JOBS.json is a list of ``{"id", "tp", "cp", "ep", "etp", "pp", "world", "order"}``; for each
job this builds the two generators exactly as ``parallel_state.initialize_model_parallel`` does (the
dense one with ep=1, the expert one with tp=etp, dp=edp, cp=1, both with the job's order) and writes
``{id: {axis: [[ranks]]}}`` for tp, cp, dp, pp, dp-cp (dense) and ep, etp, edp (expert). The shims
megatron-core needs on this machine come from importing megatron_check (trainers.md section 1.4).
"""

from __future__ import annotations

import json
import os
import sys

try:  # nvidia-resiliency-ext 0.4.1 installs as a namespace package without __version__, which megatron-core
    import nvidia_resiliency_ext as _nvrx  # 0.19.2's dist_checkpointing reads at import: treat it as absent
    if not hasattr(_nvrx, "__version__"):
        sys.modules["nvidia_resiliency_ext"] = None
except ImportError:
    pass
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_check  # noqa: E402,F401  (its module-level shims: typing.override, no triton)
from megatron.core.parallel_state import RankGenerator  # noqa: E402

DENSE = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp", "dp-cp": "dp-cp"}
EXPERT = {"ep": "ep", "etp": "tp", "edp": "dp"}


def groups(job: dict) -> dict:
    world, tp, cp, ep, etp, pp = (job[k] for k in ("world", "tp", "cp", "ep", "etp", "pp"))
    dense = RankGenerator(tp=tp, ep=1, dp=world // (tp * cp * pp), pp=pp, cp=cp, order=job["order"])
    expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=job["order"])
    out = {axis: dense.get_ranks(token) for axis, token in DENSE.items()}
    out.update({axis: expert.get_ranks(token) for axis, token in EXPERT.items()})
    return out


def main() -> int:
    jobs = json.loads(open(sys.argv[1]).read())
    with open(sys.argv[2], "w") as f:
        json.dump({job["id"]: groups(job) for job in jobs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
