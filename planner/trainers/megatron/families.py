"""The model families megatron-core 0.19 cannot build as their config says (refused at emit by
``planner.output.emit.support.check_family``): its TransformerConfig has no activation clamp on q/k/v, no q/k
norm spanning all heads, no LongRoPE, no granite multipliers, and refuses an expert bias on a softmax router.
"""

from __future__ import annotations

TITLES = {"megatron": "Megatron-LM (megatron-core 0.19)", "bridge": "Megatron-Bridge (megatron-core 0.19)"}

_QK_ALL_HEADS = ("q/k RMSNorm over all heads at once (megatron-core's qk_layernorm normalises each head "
                 "on its own)")
# family (HF model_type) -> what megatron-core lacks to build it as its config says
MEGATRON_CANNOT = {
    "dbrx": "clip_qkv (q/k/v activations clamped to +-clip_qkv)",
    "olmoe": _QK_ALL_HEADS,
    "minimax_m2": _QK_ALL_HEADS,
    "phimoe": "LongRoPE (rope_scaling type longrope) nor the SparseMixer router",
    "granitemoe": "embedding, attention, residual or logits multipliers (granite muP scaling)",
    "ernie4_5_moe": "aux-loss-free expert bias (moe_use_aux_free) on a softmax router: megatron-core allows "
                    "that bias only with a sigmoid router",
}


def why_not(model, seq_len: int) -> str | None:
    """Why megatron-core cannot build ``model`` at ``seq_len`` (None: it can)."""
    lacks = _lacks(model, seq_len)
    return f"it has no {lacks}" if lacks else None


def _lacks(model, seq_len: int) -> str | None:
    if model.family in MEGATRON_CANNOT:
        return MEGATRON_CANNOT[model.family]
    orig = model.rope_scaling.original_max_position_embeddings if model.rope_scaling else None
    if model.family == "ministral3" and orig and seq_len > orig:
        # Ministral3Attention scales q by 1 + llama_4_scaling_beta * log(1 + floor(pos / orig)): 1 up to orig
        return (f"Llama-4 attention temperature scaling (rope llama_4_scaling_beta), which changes positions "
                f"beyond original_max_position_embeddings {orig} (seq {seq_len}); plan with --seq-len {orig} or less")
    return None
