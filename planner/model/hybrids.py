"""The hybrid families' config.json fields, mapped onto :class:`~planner.model.spec.ModelSpec`'s per-layer
mixers (:mod:`planner.model.mixers`). Sources: transformers' ``configuration_qwen3_next.py``,
``configuration_nemotron_h.py`` and DeepSeek-V3.2-Exp's ``inference/model.py`` / ``config.json``.

==================  =====================================================================================
``qwen3_next``      ``layer_types`` (``linear_attention`` | ``full_attention``), else every
                    ``full_attention_interval``-th layer full; Gated DeltaNet widths ``linear_*``; the full
                    attention layers have an output gate (q_proj doubled) and per-head q/k norm; MoE as
                    ``qwen3_moe`` (``num_experts``, ``shared_expert_intermediate_size``)
``nemotron_h``      ``hybrid_override_pattern`` (``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE: one
                    mixer OR one MLP per block, each block one norm) or ``layers_block_type``; Mamba-2
                    ``mamba_num_heads`` x ``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``;
                    squared-ReLU MLPs and experts (``mlp_hidden_act``), ``moe_shared_expert_intermediate_size``,
                    sigmoid router with a score-correction bias; no positional embedding
``deepseek_v32``    DeepSeek-V3 (MLA, 256 experts) plus the lightning indexer ``index_n_heads``,
                    ``index_head_dim``, ``index_topk`` on every layer (DeepSeek sparse attention)
==================  =====================================================================================
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from planner.errors import InputError
from planner.model.mixers import PATTERN_MIXER, GatedDeltaNet, Mamba2, SparseIndexer

MODEL_TYPES = ("qwen3_next", "nemotron_h", "deepseek_v32")
ARCHITECTURES = {"Qwen3NextForCausalLM": "qwen3_next", "NemotronHForCausalLM": "nemotron_h",
                 "DeepseekV32ForCausalLM": "deepseek_v32"}
_BLOCK_SYMBOL = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _fail(source: str, field: str, problem: str) -> InputError:
    return InputError(f"{source}: field '{field}' {problem}")


def _int(cfg: dict, key: str, source: str, default: Any = ...) -> int:
    v = cfg.get(key)
    if v is None:
        if default is ...:
            raise _fail(source, key, "is missing; add it (Hugging Face config.json name)")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _fail(source, key, f"must be a positive integer, got {v!r}")
    return v


def _value(cls, source: str, field: str, **kw):
    try:
        return cls(**kw)
    except ValidationError as exc:
        raise _fail(source, field, f"is not a valid {cls.__name__}: {exc.errors()[0]['msg']}") from None


def _qwen3_next(cfg: dict, source: str) -> dict:
    out = dict(cfg)
    L = cfg.get("num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None and isinstance(L, int) and not isinstance(L, bool):
        every = _int(cfg, "full_attention_interval", source, 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)]
    if not isinstance(types, list) or any(t not in ("linear_attention", "full_attention") for t in types):
        raise _fail(source, "layer_types", f"must list 'linear_attention' or 'full_attention' per layer, got {types!r}")
    out["layer_types"] = types
    out["_mixers"] = ["gdn" if t == "linear_attention" else "attention" for t in types]
    out["_gdn"] = _value(GatedDeltaNet, source, "linear_num_value_heads",
                         num_key_heads=_int(cfg, "linear_num_key_heads", source, 16),
                         key_head_dim=_int(cfg, "linear_key_head_dim", source, 128),
                         num_value_heads=_int(cfg, "linear_num_value_heads", source, 32),
                         value_head_dim=_int(cfg, "linear_value_head_dim", source, 128),
                         conv_kernel=_int(cfg, "linear_conv_kernel_dim", source, 4))
    if out["_gdn"].num_value_heads % out["_gdn"].num_key_heads:
        raise _fail(source, "linear_num_value_heads", f"({out['_gdn'].num_value_heads}) must be a multiple of "
                    f"linear_num_key_heads ({out['_gdn'].num_key_heads})")
    out["_attention_output_gate"] = True      # Qwen3NextAttention: q_proj gives q and its gate
    out["qk_layernorm"] = True                # Qwen3NextAttention: q_norm, k_norm per head
    out["_shared_expert_gate"] = True         # Qwen3NextSparseMoeBlock: shared_expert_gate Linear(h, 1)
    out["_norm_zero_centered"] = True         # Qwen3NextRMSNorm: x * (1 + weight)
    return out


def nemotron_pattern(cfg: dict, source: str) -> str:
    """The block pattern: ``hybrid_override_pattern``, or ``layers_block_type`` written as one."""
    pat = cfg.get("hybrid_override_pattern")
    if pat is None and isinstance(cfg.get("layers_block_type"), list):
        blocks = cfg["layers_block_type"]
        if any(b not in _BLOCK_SYMBOL for b in blocks):
            raise _fail(source, "layers_block_type", f"must list {', '.join(_BLOCK_SYMBOL)} per block, got {blocks!r}")
        pat = "".join(_BLOCK_SYMBOL[b] for b in blocks)
    if not isinstance(pat, str) or not pat or any(c not in "M*-E" for c in pat):
        raise _fail(source, "hybrid_override_pattern", f"must be a string of M (Mamba), * (attention), - (MLP) "
                    f"and E (MoE), one per block, got {pat!r}")
    return pat


def _nemotron_h(cfg: dict, source: str) -> dict:
    out = dict(cfg)
    pat = nemotron_pattern(cfg, source)
    L = cfg.get("num_hidden_layers")
    if L is not None and L != len(pat):
        raise _fail(source, "hybrid_override_pattern", f"has {len(pat)} blocks, num_hidden_layers is {L}")
    out["num_hidden_layers"] = len(pat)
    out["_mixers"] = [PATTERN_MIXER[c] for c in pat]
    out["_mlp_layers"] = [c in "-E" for c in pat]
    out["_moe_pattern"] = [c == "E" for c in pat]
    out["_pattern"] = pat
    if "M" in pat:
        out["_mamba"] = _value(Mamba2, source, "mamba_num_heads",
                               num_heads=_int(cfg, "mamba_num_heads", source),
                               head_dim=_int(cfg, "mamba_head_dim", source, 64),
                               state_size=_int(cfg, "ssm_state_size", source, 128),
                               n_groups=_int(cfg, "n_groups", source, 8),
                               conv_kernel=_int(cfg, "conv_kernel", source, 4),
                               chunk_size=_int(cfg, "chunk_size", source, 128))
    if cfg.get("head_dim") is None and cfg.get("attention_head_dim") is not None:
        out["head_dim"] = cfg["attention_head_dim"]
    out["hidden_act"] = cfg.get("mlp_hidden_act") or cfg.get("hidden_act") or "relu2"
    out["gated_mlp"] = False                  # NemotronHMLP: up_proj, act, down_proj (squared ReLU)
    out.pop("n_shared_experts", None)         # the shared width is moe_shared_expert_intermediate_size
    if cfg.get("moe_shared_expert_intermediate_size") is not None:
        out["shared_expert_intermediate_size"] = cfg["moe_shared_expert_intermediate_size"]
    out.setdefault("scoring_func", "sigmoid")  # NemotronHTopkRouter: sigmoid + e_score_correction_bias
    out.setdefault("topk_method", "noaux_tc")
    out["_position_embedding"] = "none"       # NemotronHAttention applies no RoPE
    return out


def _deepseek_v32(cfg: dict, source: str) -> dict:
    out = dict(cfg)
    out["_dsa"] = _value(SparseIndexer, source, "index_topk",
                         n_heads=_int(cfg, "index_n_heads", source, 64),
                         head_dim=_int(cfg, "index_head_dim", source, 128),
                         topk=_int(cfg, "index_topk", source, 2048))
    if not cfg.get("q_lora_rank"):
        raise _fail(source, "q_lora_rank", "is missing: the lightning indexer reads the MLA query latent")
    return out


READERS = {"qwen3_next": _qwen3_next, "nemotron_h": _nemotron_h, "deepseek_v32": _deepseek_v32}


def spec_fields(cfg: dict) -> dict:
    """The ModelSpec fields a reader above filled in (none for other families)."""
    out: dict[str, Any] = {}
    for key, field in (("_mixers", "mixers"), ("_mlp_layers", "mlp_layers"), ("_gdn", "gdn"), ("_mamba", "mamba"),
                       ("_dsa", "dsa"), ("_attention_output_gate", "attention_output_gate"),
                       ("_shared_expert_gate", "shared_expert_gate"), ("_norm_zero_centered", "norm_zero_centered"),
                       ("_position_embedding", "position_embedding")):
        if cfg.get(key) is not None:
            v = cfg[key]
            out[field] = tuple(v) if isinstance(v, list) else v
    return out
