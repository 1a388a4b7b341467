"""The optimizer step: Adam over the parameter shard a rank owns, bound by HBM bandwidth.

With the distributed optimizer (or FSDP) a rank updates ``P_shard = P_rank / dp`` parameters. Mixed-
precision Adam reads the FP32 master weight, both moments and the gradient and writes the three FP32
states and the BF16 weight: ``4*4 + 3*4 + 2 = 30`` bytes per parameter::

    t_opt = 30 * P_shard / (hbm_bw * hbm_eff)
"""

from __future__ import annotations

ADAM_BYTES_PER_PARAM = 30.0


def optimizer_time(params_shard: float, hbm_bps: float) -> float:
    """Seconds of one Adam step over ``params_shard`` parameters at ``hbm_bps`` effective bytes/s."""
    return ADAM_BYTES_PER_PARAM * params_shard / hbm_bps
