"""MaxText's model keys for a user's config.json: the overrides that make MaxText 0.2.5 build THAT model.

MaxText builds a model from ``base.yml``, then ``configs/models/<model_name>.yml``, then the overrides
(``pyconfig._initialize_pydantic``). A config with no MaxText model file keeps ``model_name: default`` and
gets every model key here, in MaxText's own names (``base.yml``, ``configs/types.py``); a catalog model
names its MaxText file and overrides it with the same keys (MaxText's Qwen3 MoE files carry the 2507
releases' RoPE base, not the config's). Two behaviours hang on ``model_name`` rather than on a key: DeepSeek-V3's routing (sigmoid scores with the expert bias
used for selection only, group-limited top-k; ``layers/moe.py`` checks ``model_name.startswith(("deepseek3",
"deepseek4", "kimi-k2"))``) and Llama 3.1's RoPE (``rope_type: llama3.1`` also selects it). For the first,
the overrides name MaxText's own file of that family with ``override_model_config: true`` and set every
key that file sets, so nothing of that file's model reaches the run (tests/test_maxtext_model_keys.py
checks it key by key).

What MaxText's decoder blocks cannot express is refused in one line naming the config's field. Not
written: multi-token prediction (MaxText's own deepseek3-671b.yml trains without it, as topoplan's
TorchTitan files do) and dropout (base.yml's dropout_rate is 0).
"""

from __future__ import annotations

# HF model_type -> MaxText decoder_block (common_types.DecoderBlockType) for the families topoplan maps
BLOCKS = {"llama": "llama2", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
          "mixtral": "mixtral", "deepseek_v2": "deepseek", "deepseek_v3": "deepseek", "kimi_k2": "deepseek",
          "gpt_oss": "gpt_oss", "qwen3_next": "qwen3_next"}
# MaxText's file of the family whose model_name switches on DeepSeek-V3 routing (moe.py)
ROUTING_ANCHOR = {"kimi_k2": "kimi-k2-1t"}
DEEPSEEK_ANCHOR = "deepseek3-671b"
# HF hidden_act -> jax.nn name MaxText's MLP calls (linears._convert_to_activation_function); jax.nn.gelu is
# the tanh approximation, so HF's exact "gelu" has no MaxText name
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu", "relu": "relu"}
QK_NORM_BLOCKS = ("qwen3", "qwen3_moe")
BIAS_BLOCKS = ("qwen2", "gpt_oss")       # blocks that read attention_bias
ALL_MOE_BLOCKS = ("mixtral", "qwen3_moe", "gpt_oss", "qwen3_next")
# MaxText's LLaMARotaryEmbedding._apply_scaling_factor: factor 8, low 1, high 4, original 8192, fixed
LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def refusal(model) -> str | None:
    """Why MaxText cannot build ``model`` from keys (None: it can); the reason names the config's field."""
    block = BLOCKS.get(model.family)
    if block is None:
        return f"topoplan maps no MaxText decoder block to model_type {model.family!r}"
    for check in (_layers_refusal, _next_refusal, _moe_refusal, _router_refusal, _rope_refusal):
        if why := check(model, block):
            return why
    return None


def _layers_refusal(m, block: str) -> str | None:
    if m.activation not in ACTIVATIONS and block != "gpt_oss":
        return f"its MLP has no activation {m.activation!r} (hidden_act; MaxText's gelu is the tanh approximation)"
    if m.qk_norm and block not in QK_NORM_BLOCKS + ("qwen3_next",):
        return f"its {block} decoder block has no q/k norm (qk_norm / use_qk_norm in the config)"
    if m.attention_bias and block not in BIAS_BLOCKS:
        return f"its {block} decoder block has no q/k/v biases (attention_bias in the config)"
    if m.mlp_bias and block != "gpt_oss":
        return f"its {block} decoder block has no MLP biases (mlp_bias in the config)"
    if m.activation_clamp is not None and block != "gpt_oss":
        return f"its {block} decoder block clamps no activations (swiglu_limit in the config)"
    swa = list(m.swa_layers) if any(m.swa_layers) else []
    if swa and block != "gpt_oss":
        return f"its {block} decoder block has no sliding-window layers (sliding_window in the config)"
    if block == "gpt_oss" and swa != [i % 2 == 0 for i in range(m.num_layers)]:
        return "its gpt_oss decoder block slides the window on even layers only (layer_types in the config differ)"
    if m.partial_rotary_factor != 1.0 and block != "qwen3_next":   # types.py: only qwen3_next reads it
        return f"its {block} decoder block rotates whole heads (partial_rotary_factor {m.partial_rotary_factor:g})"
    if block != "qwen3_next" and (m.gdn or m.attention_output_gate or m.shared_expert_gate or m.norm_zero_centered):
        return f"its {block} decoder block has no Gated DeltaNet, output gates or zero-centered norms"
    return None


def _next_refusal(m, block: str) -> str | None:
    """MaxText's qwen3_next block (models/qwen3.py): Gated DeltaNet layers with a gated full-attention layer
    last in every cycle of inhomogeneous_layer_cycle_interval layers, q/k norm, zero-centered norms, one gated
    shared expert of the routed experts' width."""
    if block != "qwen3_next":
        return None
    if _cycle(m) is None:
        return ("its qwen3_next block puts one full-attention layer last in every cycle of layers "
                "(layer_types / full_attention_interval in the config differ)")
    if not (m.qk_norm and m.attention_output_gate and m.norm_zero_centered):
        return "its qwen3_next block always has q/k norm, the attention output gate and zero-centered norms"
    if m.shared_ffn_hidden_size not in (0, m.moe_ffn_hidden_size) or bool(m.shared_ffn_hidden_size) != m.shared_expert_gate:
        return ("its qwen3_next block has one gated shared expert of moe_intermediate_size (shared_expert_"
                f"intermediate_size {m.shared_ffn_hidden_size} in the config)")
    return None


def _cycle(m) -> int | None:
    """The cycle length when layer i is full attention exactly when (i + 1) % cycle == 0 (None: it is not)."""
    full = [i for i, x in enumerate(m.mixers) if x == "attention"]
    if not full or m.num_layers % (full[0] + 1):
        return None
    every = full[0] + 1
    return every if list(m.mixers) == [("attention" if (i + 1) % every == 0 else "gdn") for i in range(m.num_layers)] \
        else None


def _moe_refusal(m, block: str) -> str | None:
    if not m.num_experts:
        return (f"its {block} decoder block is MoE on every layer after the dense ones (no experts in the config)"
                if block in ALL_MOE_BLOCKS + ("deepseek",) else None)
    moe = list(m.moe_layers)
    if block in ALL_MOE_BLOCKS:
        if not all(moe):
            return f"its {block} decoder block makes every layer MoE (mlp_only_layers / decoder_sparse_step differ)"
        if m.shared_ffn_hidden_size and block != "qwen3_next":
            return f"its {block} decoder block has no shared expert (shared_expert_intermediate_size in the config)"
        return None
    k = moe.index(True) if True in moe else len(moe)
    if moe != [False] * k + [True] * (len(moe) - k):
        return "its deepseek decoder block has dense layers only first (moe_layer_freq in the config differs)"
    if m.shared_ffn_hidden_size % m.moe_ffn_hidden_size:
        return (f"its shared experts are whole experts (n_shared_experts: {m.shared_ffn_hidden_size} is not a "
                f"multiple of moe_intermediate_size {m.moe_ffn_hidden_size})")
    return None


def _router_refusal(m, block: str) -> str | None:
    if not m.num_experts:
        return None
    if block != "deepseek":
        if m.router_score != "softmax" or m.expert_bias:
            return f"its {block} router is a softmax without expert bias (scoring_func {m.router_score!r} in the config)"
        if not m.norm_topk_prob:
            return f"its {block} router renormalises the top-k weights (norm_topk_prob false in the config)"
        if m.router_scale != 1.0 or m.n_group > 1:
            return f"its {block} router has no scale or expert groups (routed_scaling_factor / n_group in the config)"
        return None
    renorm = m.router_score != "softmax"   # moe.deepseek_scale_weights: renormalises sigmoid scores only
    if m.norm_topk_prob != renorm:
        return (f"its deepseek router renormalises the top-k weights exactly for non-softmax scores "
                f"(norm_topk_prob {str(m.norm_topk_prob).lower()} with scoring_func {m.router_score!r} in the config)")
    if m.n_group > 1 and not m.expert_bias:
        return ("its group-limited routing is DeepSeek-V3's (groups scored by their top-2 sum, noaux_tc); "
                "n_group with topk_method other than noaux_tc in the config")
    return None


def _rope_refusal(m, block: str) -> str | None:
    if m.rope_theta != int(m.rope_theta):
        return f"its rope_max_timescale is an integer (rope_theta {m.rope_theta!r} in the config)"
    rs = m.rope_scaling
    mla = m.attention == "mla"
    if mla and (rs is None or rs.kind != "yarn"):
        return "its MLA (deepseek decoder block) runs YaRN RoPE only (rope_scaling in the config is not yarn)"
    if rs is None:
        return None
    if rs.kind == "llama3":
        have = {k: (getattr(rs, k) if getattr(rs, k) is not None else v) for k, v in LLAMA31.items()}
        if have != LLAMA31:
            return f"its Llama 3.1 RoPE scaling is fixed at {LLAMA31} (rope_scaling in the config: {have})"
        return None
    if rs.kind == "linear":
        return None
    return _yarn_refusal(m, rs, mla)


def _yarn_refusal(m, rs, mla: bool) -> str | None:
    orig = rs.original_max_position_embeddings or 4096
    for field, v in (("factor", rs.factor), ("beta_fast", rs.beta_fast or 32), ("beta_slow", rs.beta_slow or 1)):
        if v != int(v):
            return f"its YaRN {field} is an integer (rope_scaling.{field} {v!r} in the config)"
    if rs.mscale and rs.mscale_all_dim and rs.mscale != rs.mscale_all_dim:
        return (f"its YaRN scales cos/sin by 1 or by 0.1 ln(factor) + 1 only (rope_scaling.mscale {rs.mscale:g} "
                f"differs from mscale_all_dim {rs.mscale_all_dim:g} in the config)")
    if mla and rs.mscale_all_dim and _max_positions(m) <= orig:
        return ("its MLA applies YaRN's softmax scale only when max_position_embeddings exceeds "
                "original_max_position_embeddings (max_position_embeddings in the config)")
    return None


def _max_positions(m) -> int:
    """YaRN's position table length (embeddings.YarnRotaryEmbedding): the extended context, factor x original,
    or the config's max_position_embeddings when longer; the frequencies do not depend on it."""
    rs = m.rope_scaling
    return max(m.max_position_embeddings or 0, int(rs.factor * (rs.original_max_position_embeddings or 4096)))


# -- the keys ------------------------------------------------------------------------------------------------

def model_keys(model, model_name: str | None = None) -> dict[str, object]:
    """MaxText's overrides that build ``model`` (call :func:`refusal` first). ``model_name``: MaxText's own
    file of this model (a catalog model); it is named, and the config's keys override it."""
    m, block = model, BLOCKS[model.family]
    out: dict[str, object] = {}
    if anchor := model_name or _anchor(m, block):
        out.update(model_name=anchor, override_model_config=True)
    out.update(decoder_block=block, base_emb_dim=m.hidden_size, base_num_query_heads=m.num_attention_heads,
               base_num_kv_heads=m.num_kv_heads, base_num_decoder_layers=m.num_layers, vocab_size=m.vocab_size,
               normalization_layer_epsilon=m.norm_eps, logits_via_embedding=m.tied_embeddings)
    if m.tied_embeddings:
        out["normalize_embedding_logits"] = False     # HF's tied head does not divide by sqrt(emb_dim)
    out.update(_mlp_keys(m, block))
    out.update(_attention_keys(m, block))
    out.update(_moe_keys(m, block))
    out.update(_rope_keys(m, block))
    return out


def _anchor(m, block: str) -> str | None:
    """MaxText's model file whose name switches on DeepSeek-V3 routing, when the config routes that way."""
    if block == "deepseek" and m.num_experts and (m.expert_bias or m.n_group > 1):
        return ROUTING_ANCHOR.get(m.family, DEEPSEEK_ANCHOR)
    return None


def _mlp_keys(m, block: str) -> dict[str, object]:
    if block == "gpt_oss":   # GPT-OSS's clamped GLU: x * sigmoid(1.702 x) * (up + 1) (moe.apply_ffn_activation)
        return {"mlp_activations": ["sigmoid", "linear"], "mlp_activations_limit": float(m.activation_clamp or 7.0),
                "mlp_bias": True}
    act = ACTIVATIONS[m.activation]
    return {"mlp_activations": [act, "linear"] if m.gated_mlp else [act]}


def _attention_keys(m, block: str) -> dict[str, object]:
    out: dict[str, object] = {}
    if m.attention == "mla":
        out.update(attention_type="mla", q_lora_rank=m.q_lora_rank or 0, kv_lora_rank=m.kv_lora_rank,
                   qk_nope_head_dim=m.qk_nope_head_dim, qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim)
        return out
    out["head_dim"] = m.head_dim
    if block in QK_NORM_BLOCKS:
        out["use_qk_norm"] = m.qk_norm
    if block in BIAS_BLOCKS:
        out["attention_bias"] = m.attention_bias
    if block == "gpt_oss":
        out.update(sliding_window_size=m.sliding_window, attention_sink=m.attention_sinks,
                   inhomogeneous_layer_cycle_interval=2)
    if block == "qwen3_next":
        g = m.gdn
        out.update(inhomogeneous_layer_cycle_interval=_cycle(m), partial_rotary_factor=float(m.partial_rotary_factor),
                   gdn_num_key_heads=g.num_key_heads, gdn_key_head_dim=g.key_head_dim,
                   gdn_num_value_heads=g.num_value_heads, gdn_value_head_dim=g.value_head_dim,
                   gdn_conv_kernel_dim=g.conv_kernel)
    return out


def _moe_keys(m, block: str) -> dict[str, object]:
    if not m.num_experts:
        return {"base_mlp_dim": m.ffn_hidden_size}
    out: dict[str, object] = {"num_experts": m.num_experts, "num_experts_per_tok": m.top_k,
                              "base_moe_mlp_dim": m.moe_ffn_hidden_size}
    if block in ALL_MOE_BLOCKS:
        out["base_mlp_dim"] = m.moe_ffn_hidden_size      # MaxText's files: base_mlp_dim = base_moe_mlp_dim
        if block in ("qwen3_moe", "qwen3_next"):
            out["norm_topk_prob"] = True
        if block == "qwen3_next":
            out["shared_experts"] = 1 if m.shared_ffn_hidden_size else 0
        if block == "gpt_oss":
            out["routed_bias"] = m.router_bias
        return out
    out.update(base_mlp_dim=m.ffn_hidden_size, first_num_dense_layers=list(m.moe_layers).index(True),
               shared_experts=m.shared_ffn_hidden_size // m.moe_ffn_hidden_size,
               routed_scaling_factor=float(m.router_scale), routed_score_func=m.router_score,
               routed_bias=m.expert_bias)
    if m.expert_bias:   # base.yml's 0.0 never moves the bias; DeepSeek-V3's gamma, as the Megatron files write it
        out["routed_bias_update_rate"] = 1e-3
    if m.n_group > 1:
        out.update(n_routing_groups=m.n_group, topk_routing_group=m.topk_group)
    return out


def _rope_keys(m, block: str) -> dict[str, object]:
    out: dict[str, object] = {"rope_max_timescale": int(m.rope_theta)}
    rs = m.rope_scaling
    if rs is None:
        return out
    if rs.kind == "llama3":
        return {**out, "rope_type": "llama3.1", "rope_use_scale": True}
    if rs.kind == "linear":
        return {**out, "rope_type": "default", "rope_linear_scaling_factor": float(rs.factor)}
    # transformers scales cos/sin by get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) when both are set (1:
    # _yarn_refusal keeps them equal), else by get_mscale(f) = 0.1 ln f + 1, MaxText's rope_attention_scaling
    cos_sin_one = bool(rs.mscale and rs.mscale_all_dim)
    out.update(rope_type="yarn", max_position_embeddings=_max_positions(m),
               original_max_position_embeddings=rs.original_max_position_embeddings or 4096,
               rope_factor=int(rs.factor), beta_fast=int(rs.beta_fast or 32), beta_slow=int(rs.beta_slow or 1),
               rope_interleave=block == "deepseek", rope_truncate=True if rs.truncate is None else bool(rs.truncate),
               rope_attention_scaling=not cos_sin_one)
    if m.attention == "mla":   # attention_mla: softmax scale x (0.1 mscale ln(factor) + 1)^2 = HF's mscale_all_dim
        out["mscale"] = float(rs.mscale_all_dim or 0.0)
    return out
