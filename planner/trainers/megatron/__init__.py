"""Megatron-LM and Megatron-Bridge (megatron-core 0.19.2): rules, recipe, emitters, read-back, log parser.

Parts (loaded on first use, :class:`planner.trainers.base.Trainer`): ``recipe`` (its Recipe fields),
``rules`` (its layout and recipe rules, ``effective_recipe``), ``families`` (what megatron-core cannot build),
``emit`` (Megatron-LM's args.txt / env.sh) and ``bridge`` (Megatron-Bridge's overrides), ``readback``
(args.txt back into a layout), ``logs`` (rank logs).
"""

from __future__ import annotations

from planner.trainers.base import Launch, Pricing, Search, Trainer, foreign_knob
from planner.trainers.megatron.recipe import FIELDS, OFF

NAME = "megatron"


def refuse_recipe(recipe) -> str | None:
    if recipe.torch_compile is not None:
        return foreign_knob("torch_compile", recipe.torch_compile, "TorchTitan", "model compile", NAME,
                            "its fusions come from Transformer Engine and CUDA graphs (recipe.cuda_graph_impl)")
    return None


TRAINER = Trainer(
    name=NAME, title="Megatron-LM", default_stack="megatron-26.08",
    knobs=("cuda_graph_impl", "cuda_graph_modules", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
           "tp_comm_overlap", "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion",
           "moe_router_enable_expert_bias", "fsdp_impl", "cpu_offload_layers", "fp8_param_gather",
           "fp4_param_gather", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d", "fp8_recipe"),
    # Megatron-Bridge's performance recipes (the runs in calibration.csv): grad_reduce_in_fp32=False, so
    # gradients are bf16; BF16 weights with FP32 master copies in the distributed optimizer.
    pricing=Pricing(grad_bytes=2.0, master_weights=True, fusion="cuda_graphs", host_floor=True, graph_buffers=True),
    search=Search(selective_recompute=True, flex_dispatchers=True, expert_tp=True, fsdp=(False, True),
                  equal_slices=False),
    emitters={"megatron": "emit", "bridge": "bridge"},
    refuse_recipe=refuse_recipe,
    parts=("recipe", "rules", "families", "emit", "bridge", "readback", "logs"),
    recipe_fields=FIELDS, recipe_off=OFF,
    aliases={"megatron-lm": "megatron", "mcore": "megatron", "megatron-bridge": "bridge"},
    launch={"megatron": Launch(home=("MEGATRON_LM", "Megatron-LM checkout (the directory holding pretrain_gpt.py)")),
            "bridge": Launch(home=("MEGATRON_BRIDGE", "Megatron-Bridge checkout (the directory holding "
                                                      "scripts/training/run_recipe.py)"))},
)
