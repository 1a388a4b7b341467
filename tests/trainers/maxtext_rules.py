"""MaxText 0.2.5's mesh rules, re-stated as an independent oracle (MaxText 0.2.5
src/maxtext/utils/max_utils.py fill_unspecified_mesh_axes, configs/types.py MaxTextConfig).

The real loader (maxtext.configs.pyconfig) needs Python 3.12 and jax; these are the rules it applies
to the mesh: max_utils.fill_unspecified_mesh_axes and MaxTextConfig's DCN check.
"""

from __future__ import annotations

import math


def maxtext_mesh_errors(o: dict, devices: int) -> list[str]:
    """MaxText 0.2.5's rules (max_utils.fill_unspecified_mesh_axes, MaxTextConfig), re-stated."""
    errs = []
    ici = [v for k, v in o.items() if k.startswith("ici_")]
    dcn = [v for k, v in o.items() if k.startswith("dcn_")]
    slices = o["num_slices"]
    per_slice = devices // slices
    for name, group, target in (("ICI", ici, per_slice), ("DCN", dcn, slices)):
        if sum(1 for v in group if v == -1) > 1:
            errs.append(f"more than one -1 in {name}")
        if math.prod(group) != target:
            errs.append(f"{name} product {math.prod(group)} != {target}")
    if math.prod(dcn) > 1 and slices == 1:
        errs.append("DCN parallelism requested but only one slice available")
    return errs


def maxtext_pipeline(o: dict, num_layers: int, first_dense: int, deepseek_block: bool) -> tuple[int, int, int, list[str]]:
    """(pipelined layers, repeats, microbatches, errors) as MaxText derives them from the overrides
    (src/maxtext/configs/types.py:3565-3615 at AI-Hypercomputer/maxtext e591f30), re-stated."""
    errs = []
    ppl = o.get("pipeline_parallel_layers", -1)
    if ppl == -1:
        ppl = num_layers - first_dense if deepseek_block else num_layers
    stages = o["ici_pipeline_parallelism"] * o["dcn_pipeline_parallelism"]
    per_stage = o.get("num_layers_per_pipeline_stage", 1)
    repeats = o.get("num_pipeline_repeats", -1)
    if repeats == -1:
        repeats, rem = divmod(ppl, stages * per_stage)
        if rem:
            errs.append("layers per stage x stages must divide pipeline_parallel_layers")
    if stages * repeats * per_stage != ppl:
        errs.append("stages x repeats x layers per stage != pipeline_parallel_layers")
    if deepseek_block and ppl > num_layers - first_dense:
        errs.append("a deepseek block pipelines at most its MoE layers (decoders.py: negative layers outside)")
    micro = o.get("num_pipeline_microbatches", -1)
    micro = stages if micro == -1 else micro
    if micro % stages:
        errs.append("num_pipeline_microbatches must be divisible by the stages")
    return ppl, repeats, micro, errs
