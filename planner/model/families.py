"""Each MoE family's own config.json field names, mapped onto the names :mod:`planner.model.spec` reads.

``canonical(cfg)`` returns a copy of a Hugging Face config with the standard names filled in from the
family's own (``n_layers`` -> ``num_hidden_layers`` for DBRX, ``moe_k`` -> ``num_experts_per_tok`` for
ERNIE, ...) and ``_field_names``: standard name -> the family's name, so a refusal names the field the
user's file has. Sources: transformers' ``configuration_*.py`` / ``modeling_*.py`` of each family.

==================  =====================================================================================
``dbrx``            ``n_layers``, ``d_model``, ``n_heads``, ``max_seq_len``; ``attn_config.kv_n_heads``,
                    ``.rope_theta``; ``ffn_config.moe_num_experts``, ``.moe_top_k``, ``.ffn_hidden_size``
                    (each expert's width), ``.ffn_act_fn.name``; LayerNorm (eps 1e-5, no bias)
``olmoe``           ``num_experts`` x ``intermediate_size`` (the expert width); q/k RMSNorm over all heads
``phimoe``          ``num_local_experts`` x ``intermediate_size``; ``sliding_window`` equal to the context
                    is no window; LongRoPE (no trainer emits it: refused at emit)
``granitemoe``      ``num_local_experts`` x ``intermediate_size``; the granite multipliers change neither
                    FLOPs nor parameters
``ernie4_5_moe``    ``moe_num_experts``, ``moe_k``, ``moe_num_shared_experts`` x ``moe_intermediate_size``,
                    MoE layers ``moe_layer_start_index <= i <= moe_layer_end_index`` with
                    ``(i+1) % moe_layer_interval == 0``; ``use_bias``; ``moe_use_aux_free`` expert bias
``minimax_m2``      ``num_local_experts`` x ``intermediate_size``; ``use_qk_norm`` (over all heads);
                    ``rotary_dim`` / ``head_dim`` = partial RoPE; ``use_routing_bias`` = expert bias
``gpt2``            ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (None: 4 ``n_embd``), ``n_positions``,
                    ``activation_function``; a plain two-matrix MLP, biases on every linear layer, tied
                    embeddings, learned absolute positions (GPT-3 is this architecture: Megatron's GPTModel
                    defaults, ``position_embedding_type='learned_absolute'``)
``hunyuan_v1_moe``  ``num_experts``, ``moe_topk`` (an int or one per layer) x ``moe_intermediate_size``
                    (else ``intermediate_size``); ``use_mixed_mlp_moe`` adds ``num_shared_expert`` shared
                    experts of ``intermediate_size``; per-head q/k norm; NTK-alpha RoPE
                    (``rope_scaling.alpha``) = base ``rope_theta * alpha ** (d / (d - 2))``
==================  =====================================================================================
"""

from __future__ import annotations

from typing import Any

from planner.errors import InputError
from planner.model import hybrids

# model_type (or the architectures class) of a family read here, as transformers names it.
MODEL_TYPES = ("dbrx", "olmoe", "phimoe", "granitemoe", "ernie4_5_moe", "minimax_m2", "hunyuan_v1_moe",
               "gpt2") + hybrids.MODEL_TYPES
# Tencent's own config.json names the family "hunyuan" (architectures HunYuanMoEV1ForCausalLM)
ARCHITECTURES = {
    "DbrxForCausalLM": "dbrx", "OlmoeForCausalLM": "olmoe", "PhiMoEForCausalLM": "phimoe",
    "GraniteMoeForCausalLM": "granitemoe", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
    "MiniMaxM2ForCausalLM": "minimax_m2", "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe", "GPT2LMHeadModel": "gpt2",
    **hybrids.ARCHITECTURES,
}
# families whose every layer is MoE with experts of intermediate_size (Mixtral's convention)
EXPERTS_OF_INTERMEDIATE = ("olmoe", "phimoe", "granitemoe", "minimax_m2")


def _fail(source: str, field: str, problem: str) -> InputError:
    return InputError(f"{source}: field '{field}' {problem}")


def _uniform(cfg: dict, key: str, source: str) -> Any:
    """A per-layer list that must hold one value for every layer (Hunyuan), or a scalar."""
    v = cfg.get(key)
    if isinstance(v, list):
        if not v or any(x != v[0] for x in v):
            raise _fail(source, key, f"differs between layers ({v!r}); topoplan models one value for every layer")
        return v[0]
    return v


def _set(out: dict, names: dict, std: str, value: Any, own: str) -> None:
    if value is not None:
        out[std] = value
    names[std] = own


def _dbrx(cfg: dict, source: str) -> tuple[dict, dict]:
    attn, ffn = cfg.get("attn_config") or {}, cfg.get("ffn_config") or {}
    if not isinstance(attn, dict) or not isinstance(ffn, dict):
        raise _fail(source, "attn_config" if not isinstance(attn, dict) else "ffn_config", "must be an object")
    out, names = dict(cfg), {}
    for std, own, val in (("num_hidden_layers", "n_layers", cfg.get("n_layers")),
                          ("hidden_size", "d_model", cfg.get("d_model")),
                          ("num_attention_heads", "n_heads", cfg.get("n_heads")),
                          ("max_position_embeddings", "max_seq_len", cfg.get("max_seq_len")),
                          ("num_key_value_heads", "attn_config.kv_n_heads", attn.get("kv_n_heads")),
                          ("rope_theta", "attn_config.rope_theta", attn.get("rope_theta")),
                          ("num_local_experts", "ffn_config.moe_num_experts", ffn.get("moe_num_experts")),
                          ("num_experts_per_tok", "ffn_config.moe_top_k", ffn.get("moe_top_k")),
                          ("moe_intermediate_size", "ffn_config.ffn_hidden_size", ffn.get("ffn_hidden_size"))):
        _set(out, names, std, val, own)
    act = ffn.get("ffn_act_fn") or {}
    out["hidden_act"] = act.get("name", "silu") if isinstance(act, dict) else "silu"
    out["layer_norm_eps"] = 1e-5                           # DbrxBlock: nn.LayerNorm(d_model, bias=False)
    out["norm_topk_prob"] = ffn.get("moe_normalize_expert_weights") is not None
    return out, names


def _gpt2(cfg: dict, source: str) -> tuple[dict, dict]:
    """transformers' GPT2Config names (configuration_gpt2.py: n_layer, n_embd, n_head, n_inner, n_positions,
    activation_function, tie_word_embeddings True by default; GPT2MLP c_fc, c_proj and GPT2Attention c_attn,
    c_proj carry biases)."""
    out, names = dict(cfg), {}
    for std, own in (("num_hidden_layers", "n_layer"), ("hidden_size", "n_embd"), ("num_attention_heads", "n_head"),
                     ("max_position_embeddings", "n_positions")):
        _set(out, names, std, cfg.get(own), own)
    h = cfg.get("n_embd")
    inner = cfg.get("n_inner")
    _set(out, names, "intermediate_size", inner if inner is not None else (4 * h if isinstance(h, int) else None),
         "n_inner")
    out["hidden_act"] = cfg.get("activation_function") or "gelu_new"
    out.setdefault("gated_mlp", False)
    out.setdefault("tie_word_embeddings", True)
    out.setdefault("attention_bias", True)
    out.setdefault("mlp_bias", True)
    out["_position_embedding"] = "learned_absolute"
    return out, names


def _ernie(cfg: dict, source: str) -> tuple[dict, dict]:
    out, names = dict(cfg), {}
    L = cfg.get("num_hidden_layers")
    ints = {k: cfg.get(k, d) for k, d in (("moe_layer_start_index", 0), ("moe_layer_end_index", -1),
                                          ("moe_layer_interval", 1))}
    for k, v in ints.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise _fail(source, k, f"must be an integer, got {v!r}")
    if ints["moe_layer_interval"] < 1:
        raise _fail(source, "moe_layer_interval", f"must be >= 1, got {ints['moe_layer_interval']}")
    if isinstance(L, int) and not isinstance(L, bool) and L >= 1:
        end = L - 1 if ints["moe_layer_end_index"] == -1 else ints["moe_layer_end_index"]
        # Ernie4_5_MoeDecoderLayer: a MoE layer when (i+1) % interval == 0 and start <= i <= end
        out["moe_layers"] = [i for i in range(L) if (i + 1) % ints["moe_layer_interval"] == 0
                             and ints["moe_layer_start_index"] <= i <= end]
        names["moe_layers"] = "moe_layer_start_index"
    _set(out, names, "n_shared_experts", cfg.get("moe_num_shared_experts"), "moe_num_shared_experts")
    out["attention_bias"] = bool(cfg.get("use_bias", False))
    if cfg.get("moe_use_aux_free"):
        out["topk_method"] = "noaux_tc"    # a softmax router with a score-correction bias
    return out, names


def _minimax(cfg: dict, source: str) -> tuple[dict, dict]:
    out, names = dict(cfg), {}
    rd, hd = cfg.get("rotary_dim"), cfg.get("head_dim")
    if isinstance(rd, int) and isinstance(hd, int) and 0 < rd < hd and "partial_rotary_factor" not in cfg:
        out["partial_rotary_factor"] = rd / hd
    if cfg.get("use_routing_bias"):
        out["topk_method"] = "noaux_tc"
    return out, names


def _hunyuan(cfg: dict, source: str) -> tuple[dict, dict]:
    out, names = dict(cfg), {}
    if cfg.get("use_cla"):
        raise _fail(source, "use_cla", "is true: cross-layer attention (K/V shared between layers) is not modelled; "
                    "no trainer topoplan emits for builds it")
    _set(out, names, "num_experts_per_tok", _uniform(cfg, "moe_topk", source), "moe_topk")
    _set(out, names, "num_experts", _uniform(cfg, "num_experts", source), "num_experts")
    width = _uniform(cfg, "moe_intermediate_size", source)
    _set(out, names, "moe_intermediate_size", width if width is not None else cfg.get("intermediate_size"),
         "moe_intermediate_size" if width is not None else "intermediate_size")
    if cfg.get("use_mixed_mlp_moe", True) and isinstance(cfg.get("intermediate_size"), int):
        n_shared = _uniform(cfg, "num_shared_expert", source)
        n_shared = 1 if n_shared is None else n_shared
        if isinstance(n_shared, int):
            out["shared_expert_intermediate_size"] = n_shared * cfg["intermediate_size"]
    _set(out, names, "head_dim", cfg.get("head_dim") or cfg.get("attention_head_dim"), "head_dim")
    out["qk_layernorm"] = bool(cfg.get("use_qk_norm", True))
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict) and rs.get("alpha") is not None:
        out["rope_theta"], out["rope_scaling"] = _ntk_alpha_base(out, rs["alpha"], source), None
    return out, names


def _positive(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and v > 0


def _ntk_alpha_base(cfg: dict, alpha: Any, source: str) -> float:
    """HunYuan's NTK-alpha RoPE is plain RoPE of a larger base: theta * alpha ** (d / (d - 2))."""
    if not _positive(alpha):
        raise _fail(source, "rope_scaling.alpha", f"must be a positive number, got {alpha!r}")
    d, h, n = cfg.get("head_dim"), cfg.get("hidden_size"), cfg.get("num_attention_heads")
    if not (isinstance(d, int) and not isinstance(d, bool)):
        d = h // n if isinstance(h, int) and isinstance(n, int) and n > 0 else None
    if not isinstance(d, int) or d <= 2:
        raise _fail(source, "attention_head_dim", f"must be an integer > 2 for NTK-alpha RoPE, got {d!r}")
    theta = cfg.get("rope_theta", 10000.0)
    if not _positive(theta):
        raise _fail(source, "rope_theta", f"must be a positive number, got {theta!r}")
    return float(theta) * float(alpha) ** (d / (d - 2))


def _experts_of_intermediate(cfg: dict, source: str) -> tuple[dict, dict]:
    out, names = dict(cfg), {}
    _set(out, names, "moe_intermediate_size", cfg.get("intermediate_size"), "intermediate_size")
    family = str(cfg.get("model_type"))
    if family == "olmoe":
        out["qk_layernorm"] = True                       # OlmoeAttention: q_norm, k_norm
    if family == "phimoe":
        sw, ctx = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
        if isinstance(sw, int) and isinstance(ctx, int) and sw >= ctx:
            out["sliding_window"] = None                 # a window as long as the context masks nothing
        if isinstance(cfg.get("rope_scaling"), dict) and "longrope" in str(cfg["rope_scaling"].get("type")
                                                                         or cfg["rope_scaling"].get("rope_type")):
            out["rope_scaling"] = None                   # LongRoPE: refused at emit (planner.trainers.megatron.families)
            out["_longrope"] = True
    if family == "granitemoe":
        out.setdefault("norm_topk_prob", True)           # GraniteMoeTopKGating: softmax over the top-k logits
    if family == "minimax_m2":
        out.update(_minimax(out, source)[0])
    return out, names


_READERS = {"dbrx": _dbrx, "ernie4_5_moe": _ernie, "hunyuan_v1_moe": _hunyuan, "gpt2": _gpt2,
            **{f: _experts_of_intermediate for f in EXPERTS_OF_INTERMEDIATE}, **hybrids.READERS}


def canonical(cfg: dict, family: str, source: str) -> dict:
    """``cfg`` with the standard field names filled in from ``family``'s own; unchanged for the
    families :mod:`planner.model.spec` reads directly."""
    reader = _READERS.get(family)
    if reader is None:
        return cfg
    if family in hybrids.READERS:
        return {**reader({**cfg, "model_type": family}, source), "_field_names": {}}
    out, names = reader({**cfg, "model_type": family}, source)
    out["_field_names"] = names
    return out
