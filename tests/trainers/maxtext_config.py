"""MaxText 0.2.5's config loading, re-stated as an independent oracle for emitted overrides.

``effective(overrides)`` merges like ``maxtext.configs.pyconfig._initialize_pydantic``: base.yml, then
``configs/models/<model_name>.yml`` (when model_name is not "default"), then the overrides; with
``override_model_config`` the model file gives only the keys the overrides leave out, without it a key set
by both to different values is an error (``validate_no_keys_overridden_twice``). YAML is read with
OmegaConf's float rule (``1e-5`` is a float). The real loader needs Python 3.12 and jax (see
tests/data/reference/trainers.md); the files are MaxText 0.2.5's own (tests/data/maxtext/README.md).

``model_view(cfg)`` is the model MaxText builds from a merged config, in MaxText's terms, with the
behaviours that hang on model_name resolved as MaxText's layers do (``layers/moe.py`` DeepSeek routing,
``layers/attentions.py`` RoPE choice, ``layers/attention_mla.py`` softmax scale, ``layers/moe.py`` weights).
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parents[1] / "data" / "maxtext"

# OmegaConf's YAML loader: floats with or without a point (omegaconf._utils.get_yaml_loader)
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


class _Loader(yaml.SafeLoader):
    pass


_Loader.yaml_implicit_resolvers = {k: [r for r in v if r[0] != "tag:yaml.org,2002:float"]
                                   for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def load_yaml(text: str) -> dict:
    return yaml.load(text, Loader=_Loader) or {}


@lru_cache(maxsize=None)
def _file(rel: str) -> dict:
    return load_yaml((DATA / rel).read_text())


def model_file(name: str) -> dict:
    return dict(_file(f"models/{name}.yml"))


def effective(overrides: dict) -> dict:
    """base.yml + model file + overrides, as pyconfig merges them (raises as pyconfig does)."""
    base = dict(_file("base.yml"))
    name = overrides.get("model_name", base["model_name"])
    model = {}
    if name != "default":
        model = model_file(name)
        if overrides.get("override_model_config", base["override_model_config"]):
            model = {k: v for k, v in model.items() if k not in overrides}
        else:
            twice = [k for k in model if k in overrides and model[k] != overrides[k]]
            if twice:
                raise ValueError(f"Keys {twice} are overridden by both model config and CLI/kwargs")
    return {**base, **model, **overrides}


def deepseek_routing(cfg: dict) -> bool:
    """layers/moe.py: selection on biased scores, weights from the unbiased ones, group-limited top-k."""
    return cfg["model_name"].startswith(("deepseek3", "deepseek4", "kimi-k2"))


def rope_view(cfg: dict) -> dict:
    """The RoPE MaxText builds (attentions.init_rotary_embedding) and MLA's softmax scale."""
    mla = cfg["attention_type"] == "mla"
    if cfg["model_name"].startswith("llama3.1") or cfg["rope_type"].startswith("llama3.1"):
        kind = "llama3.1" if cfg["rope_use_scale"] else "default"
    else:
        kind = "yarn" if cfg["rope_type"].startswith("yarn") else "default"
    out = {"kind": kind, "theta": cfg["rope_max_timescale"]}
    if kind == "default":
        out["linear_factor"] = cfg["rope_linear_scaling_factor"]
    if kind == "yarn":
        out.update({k: cfg[k] for k in ("max_position_embeddings", "original_max_position_embeddings", "rope_factor",
                                        "beta_fast", "beta_slow", "rope_interleave", "rope_truncate")})
        f = cfg["rope_factor"]
        out["cos_sin_scale"] = (0.1 * math.log(f) + 1.0) if cfg["rope_attention_scaling"] and f > 1 else 1.0
    if mla:
        scaled = cfg["max_position_embeddings"] > cfg["original_max_position_embeddings"]
        m = 0.1 * cfg["mscale"] * math.log(cfg["rope_factor"]) + 1.0 if scaled else 1.0
        out["softmax_scale_factor"] = m * m
    return out


def model_view(cfg: dict) -> dict:
    """What MaxText builds from the merged config ``cfg``."""
    block = cfg["decoder_block"]
    mla = cfg["attention_type"] == "mla"
    moe = cfg["num_experts"] > 1
    v = {"decoder_block": block, "emb": cfg["base_emb_dim"], "heads": cfg["base_num_query_heads"],
         "kv_heads": cfg["base_num_kv_heads"], "layers": cfg["base_num_decoder_layers"], "vocab": cfg["vocab_size"],
         "eps": cfg["normalization_layer_epsilon"], "activations": list(cfg["mlp_activations"]),
         "tied": cfg["logits_via_embedding"], "mlp_dim": cfg["base_mlp_dim"], "rope": rope_view(cfg),
         "tied_logits_divided": cfg["logits_via_embedding"] and cfg["normalize_embedding_logits"]}
    if mla:
        v.update({k: cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                      "v_head_dim")})
    else:
        v["head_dim"] = cfg["head_dim"]
    if block in ("qwen3", "qwen3_moe"):
        v["qk_norm"] = cfg["use_qk_norm"]
    if block == "qwen3_next":   # layers/attentions.py: Qwen3NextRMSNorm (1 + w) on q/k unless use_qk_norm swaps in RMSNorm
        v["qk_norm"], v["qk_norm_zero_centered"] = True, not cfg["use_qk_norm"]
    if block in ("qwen2", "gpt_oss"):
        v["attention_bias"] = cfg["attention_bias"]
    if block == "gpt_oss":
        v.update({k: cfg[k] for k in ("sliding_window_size", "attention_sink", "mlp_bias", "mlp_activations_limit",
                                      "inhomogeneous_layer_cycle_interval")})
    if block == "qwen3_next":   # models/qwen3.py: full attention last in each cycle, partial RoPE, one shared expert
        v.update({k: cfg[k] for k in ("inhomogeneous_layer_cycle_interval", "partial_rotary_factor", "gdn_num_key_heads",
                                      "gdn_key_head_dim", "gdn_num_value_heads", "gdn_value_head_dim",
                                      "gdn_conv_kernel_dim")})
        v["shared_expert"] = cfg["shared_experts"] > 0
    if moe:
        v.update(_moe_view(cfg, block))
    return v


def _moe_view(cfg: dict, block: str) -> dict:
    v = {"experts": cfg["num_experts"], "top_k": cfg["num_experts_per_tok"], "moe_mlp_dim": cfg["base_moe_mlp_dim"]}
    if block in ("deepseek", "deepseek4"):
        ds = deepseek_routing(cfg)
        v.update({k: cfg[k] for k in ("first_num_dense_layers", "shared_experts", "routed_scaling_factor",
                                      "routed_score_func", "routed_bias")})
        v["deepseek_routing"] = ds
        v["groups"] = (cfg["n_routing_groups"], cfg["topk_routing_group"]) if ds else (-1, -1)
        v["renormalised"] = cfg["routed_score_func"] in ("sigmoid", "sqrtsoftplus")   # deepseek_scale_weights
    else:   # softmax over the top-k logits: the top-k weights always sum to 1 (moe.get_topk)
        v["renormalised"] = True
        v["routed_bias"] = cfg["routed_bias"]
    return v
