"""Which trainer builds which model family: a family a trainer cannot build as its config says is refused
at emit, in one line naming the trainer, the family and what the trainer lacks (the files would train
a different model from the one planned).

Megatron-LM and Megatron-Bridge build models with megatron-core 0.19 (its TransformerConfig has no
activation clamp on q/k/v, no q/k norm spanning all heads, no LongRoPE, no granite multipliers, and
refuses an expert bias on a softmax router); MaxText 0.x has decoder blocks for none of the families
below; torchtitan refuses every family outside its own list in ``torchtitan.model_entry``.
"""

from __future__ import annotations

from planner.errors import InputError

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
MAXTEXT_CANNOT = ("dbrx", "olmoe", "minimax_m2", "phimoe", "granitemoe", "ernie4_5_moe", "hunyuan_v1_moe",
                  "ministral3")
# Hybrid families (issue 23): megatron-core 0.19.2 builds all three (Mamba hybrid layer pattern, gated_delta_net,
# dsa). torchtitan 0.3.0's models are llama3, qwen3, qwen3_5, deepseek_v3, gpt_oss, kimi_k2_7 (+ flux, muse_glimmer).
TORCHTITAN_CANNOT_HYBRID = {
    "qwen3_next": "Qwen3-Next model (its Gated DeltaNet is inside the multimodal qwen3_5 model only, with M-RoPE "
                  "and another layer layout)",
    "nemotron_h": "Mamba-2 layer",
    "deepseek_v32": "DeepSeek sparse attention (the lightning indexer; its deepseek_v3 model is dense MLA)",
}
MAXTEXT_CANNOT_HYBRID = {
    "nemotron_h": "Mamba-2 decoder block",
    "deepseek_v32": "full-size DeepSeek-V3.2 model (configs/models/deepseek3.2-671b.yml is a reduced test shape: "
                    "1024 wide, 5 layers, index_topk 64)",
}
# a family MaxText builds only as its own model file: (configs/models/<name>.yml, the shape it fixes:
# layers, hidden, experts, top-k); AI-Hypercomputer/maxtext src/MaxText/configs/models/qwen3-next-80b-a3b.yml
MAXTEXT_BUILTIN = {"qwen3_next": ("qwen3-next-80b-a3b", (48, 2048, 512, 10))}


def maxtext_builtin(model) -> str | None:
    """MaxText's model_name for a config of a family MaxText builds only as its own model file, when the
    config is that model's shape; None otherwise."""
    name, shape = MAXTEXT_BUILTIN.get(model.family, (None, None))
    if name and (model.num_layers, model.hidden_size, model.num_experts, model.top_k) == shape:
        return name
    return None


_TRAINER = {"megatron": "Megatron-LM (megatron-core 0.19)", "bridge": "Megatron-Bridge (megatron-core 0.19)",
            "maxtext": "MaxText", "torchtitan": "TorchTitan 0.3.0"}


def _megatron_lacks(model, seq_len: int) -> str | None:
    if model.family in MEGATRON_CANNOT:
        return MEGATRON_CANNOT[model.family]
    orig = model.rope_scaling.original_max_position_embeddings if model.rope_scaling else None
    if model.family == "ministral3" and orig and seq_len > orig:
        # Ministral3Attention scales q by 1 + llama_4_scaling_beta * log(1 + floor(pos / orig)): 1 up to orig
        return (f"Llama-4 attention temperature scaling (rope llama_4_scaling_beta), which changes positions "
                f"beyond original_max_position_embeddings {orig} (seq {seq_len}); plan with --seq-len {orig} or less")
    return None


def check_family(model, emitter: str, seq_len: int = 0) -> None:
    """InputError when trainer ``emitter`` cannot build ``model``'s family as its config says."""
    family = model.family
    why = None
    lacks = _megatron_lacks(model, seq_len) if emitter in ("megatron", "bridge") else None
    if lacks:
        why = f"it has no {lacks}"
    elif emitter == "maxtext" and family in MAXTEXT_CANNOT:
        why = "it has no decoder block for this family"
    elif emitter == "maxtext" and family in MAXTEXT_BUILTIN and maxtext_builtin(model) is None:
        name, shape = MAXTEXT_BUILTIN[family]
        why = (f"it builds this family only as configs/models/{name}.yml (layers, hidden, experts, top-k {shape}), "
               "and this config differs")
    elif emitter == "maxtext" and family in MAXTEXT_CANNOT_HYBRID:
        why = f"it has no {MAXTEXT_CANNOT_HYBRID[family]}"
    elif emitter == "torchtitan" and family in TORCHTITAN_CANNOT_HYBRID:
        why = f"it has no {TORCHTITAN_CANNOT_HYBRID[family]}"
    if why:
        raise InputError(f"--trainer {emitter}: {_TRAINER[emitter]} cannot build the {family} family "
                         f"({model.name}): {why}; its files would train a different model (plan without --emit, or emit "
                         f"for a trainer that builds it: docs/models.md)")
