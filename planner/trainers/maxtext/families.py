"""The model families MaxText 0.x has no decoder block for (refused at emit by
``planner.output.emit.support.check_family``)."""

from __future__ import annotations

TITLES = {"maxtext": "MaxText"}
MAXTEXT_CANNOT = ("dbrx", "olmoe", "minimax_m2", "phimoe", "granitemoe", "ernie4_5_moe", "hunyuan_v1_moe",
                  "ministral3")


def why_not(model, seq_len: int) -> str | None:
    """Why MaxText cannot build ``model`` (None: it can)."""
    return "it has no decoder block for this family" if model.family in MAXTEXT_CANNOT else None
