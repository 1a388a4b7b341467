"""The memory lower bound of ``plan``'s program (``planner.search.program``): a limit node that drops,
inside the search, layouts whose model state cannot fit; ``plan`` checks the exact peak of the
layouts that pass (``planner.cost.memory``), lazily."""

from __future__ import annotations

import math

from planner.config import ParallelConfig
from planner.cost.memory import (WEIGHT_COPY_BYTES, fsdp_buffer_bytes, gpu_optimizer_bytes, linear_weight_bytes,
                                 options_for, state_bytes, usable_hbm_gib)
from planner.model.flops import layer_costs, param_counts
from planner.rules import effective_recipe, optimizer_offload, quantised_params
from planner.trainers import get_trainer


def add_memory_bound(b) -> None:
    """A lower bound of ``planner.cost.memory``'s peak, averaged over the pipeline ranks (the worst
    rank holds at least the average), that must fit in HBM less the reserve:

    - without FSDP: the weights and gradients of every parameter a replica holds (BF16 for
      Megatron; FP32, with the optimizer state, for TorchTitan and MaxText), spread over tp*pp
      (dense) or ep*etp*pp (experts), plus the low-precision copies of the expert weights;
    - with FSDP: the same state sharded over all W GPUs (dense / (tp*pp*dp*cp) and expert /
      (ep*etp*pp*edp) are both x / W), plus the gathered buffers of the biggest layer, at least
      one MoE layer's experts on a GPU, twice;
    - Megatron's distributed optimizer shard, (dense + expert) / W, less the share its optimizer CPU
      offload keeps on the host (``memory.gpu_optimizer_bytes``).
    Activations, logits, dense-weight copies and fragmentation are left out (they are >= 0).
    ``tests/test_plan.py`` checks that every layout it drops fails the exact estimate."""
    P, vals, model, tr = b.prog, b.vals, b.model, b.training
    opt = options_for(tr, b.profile)   # a fitted profile's reserve (issue 13) bounds memory too
    megatron = get_trainer(tr.trainer).pricing.master_weights   # BF16 weights, distributed optimizer
    pc = param_counts(model)
    # MTP layers excluded and the vocabulary unpadded: both counts are at most what memory holds
    expert_total = float(pc.experts) if model.is_moe else 0.0
    dense_total = float(pc.dense)
    q = WEIGHT_COPY_BYTES[tr.precision]
    # one MoE layer's experts (all of them; a GPU holds ceil(n/ep) of them, each / etp)
    layer_experts = max((c.n_experts * c.expert_params for c in layer_costs(model, tr.seq_len)
                         if c.kind == "decoder" and c.n_experts), default=0.0)
    GiB = float(1 << 30)
    budget = math.ceil((usable_hbm_gib(b.gpu.hbm_gib, tr) - opt.reserve_gib) * GiB / 1e3)  # kB
    # bytes per parameter (planner.cost.memory): Megatron keeps BF16 weights and gradients and shards the
    # optimizer over data parallel; TorchTitan / MaxText keep FP32 weights and gradients and shard
    # everything only under FSDP
    wb, gb, optb = state_bytes(opt, megatron)
    opt_gpu = gpu_optimizer_bytes(optb, optimizer_offload(tr)) if megatron else optb   # offload: 0 under FSDP
    # FP8 / NVFP4 parameters (planner.rules.quantised_params, per FSDP value) drop the BF16 weight of the
    # linear layers; where any layout keeps them, the bound drops every BF16 weight (a bound stays one)
    qparams = any(quantised_params(effective_recipe(model, ParallelConfig(fsdp=f), tr)) for f in vals["fsdp"])
    state = linear_weight_bytes(wb, qparams) + gb
    buf = fsdp_buffer_bytes(opt, megatron, q, qparams)
    lb1, lb2 = {}, {}
    for ix, a in b.combos("tp", "pp", "ep", "etp", "fsdp"):
        etp = a["tp"] if a["etp"] is None else a["etp"]
        if a["fsdp"]:
            lb1[ix] = int(2 * buf * layer_experts / (a["ep"] * etp) / 1e3)
        else:
            per = state if megatron else state + optb
            lb1[ix] = int((per * dense_total / (a["tp"] * a["pp"])
                           + (per + q) * expert_total / (a["ep"] * etp * a["pp"])) / 1e3)
    # what is sharded over every GPU: dense / (tp*pp*dp*cp) + expert / (ep*etp*pp*edp) =
    # (dense + expert) / W, as tp*cp*pp*dp = W and the expert grid ep*etp*pp*edp covers the
    # same W GPUs: Megatron's optimizer always, and FSDP's weights and gradients
    for fi, f in enumerate(vals["fsdp"]):
        per = (opt_gpu if megatron else 0.0) + ((state + (0.0 if megatron else optb)) if f else 0.0)
        for w in b.worlds:
            lb2[(fi, w)] = int(per * (dense_total + expert_total) / w / 1e3)
    LB = P.sum([P.table_t(b.idx("tp", "pp", "ep", "etp", "fsdp"), lb1),
                P.table_t(b.idx("fsdp"), lb2, nodes=[b.W])])
    P.at_most(LB, budget)
    b.notes.append("memory lower bound: model state and expert copies / (tp*pp, ep*etp*pp), or FSDP shards "
                      "and the biggest layer's buffers, + optimizer shard <= HBM - reserve")
