"""Model specs: one frozen pydantic value per decoder-only transformer, read from a Hugging Face
style ``config.json``.

A :class:`ModelSpec` holds what the cost model needs and nothing else: layer counts and widths,
the attention kind (MHA/GQA or Multi-head Latent Attention), the MLP (gated or not), the experts
(routed, shared, top-k, group-limited routing), which layers are MoE, multi-token-prediction
(MTP) layers, which layers use a sliding window, and the vocabulary with Megatron's padding rule.

Families read from ``model_type`` (the HF config field):

============================  =====================================================================
``llama``, ``mistral``,       dense, GQA; ``head_dim`` defaults to hidden/heads; ``mistral`` honours
``qwen2``, ``qwen3``          ``sliding_window`` on every layer, ``qwen2/3`` only with
                              ``use_sliding_window`` (layers >= ``max_window_layers``)
``deepseek_v3``, ``deepseek_  MLA (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
v2``, ``kimi_k2``             ``qk_rope_head_dim``, ``v_head_dim``), ``n_routed_experts``,
                              ``n_shared_experts`` x ``moe_intermediate_size``, dense layers
                              ``i < first_k_dense_replace`` (and ``i % moe_layer_freq != 0``),
                              ``n_group``/``topk_group``, MTP ``num_nextn_predict_layers``;
                              Megatron pads the vocabulary to a multiple of 1280
``qwen3_moe``, ``qwen2_moe``  every layer MoE unless in ``mlp_only_layers`` or
                              ``(i+1) % decoder_sparse_step != 0``; ``num_experts``,
                              ``moe_intermediate_size``; qwen2_moe adds
                              ``shared_expert_intermediate_size``
``mixtral``                   every layer MoE, ``num_local_experts`` experts of ``intermediate_size``
``gpt_oss``                   every layer MoE (``num_local_experts``, ``intermediate_size``),
                              biases, attention sinks, sliding window on even layers (or as
                              ``layer_types`` says); Megatron's activation is a clamped quick-GELU GLU
``glm4_moe`` (GLM-4.5,        GQA with q/k/v biases and optional ``use_qk_norm``, partial RoPE
GLM-4.5-Air)                  (``partial_rotary_factor``: no FLOP or parameter effect), dense layers
                              ``i < first_k_dense_replace``, ``n_shared_experts`` x
                              ``moe_intermediate_size``, MTP ``num_nextn_predict_layers``
``llama4`` / ``llama4_text``  a ``text_config`` inside ``Llama4ForConditionalGeneration``: MoE
(Llama 4 Scout, Maverick)     layers ``moe_layers`` (default every ``interleave_moe_layer_step``-th),
                              one shared expert of ``intermediate_size`` beside the routed ones,
                              dense layers of ``intermediate_size_mlp``; the chunked attention
                              of RoPE layers is priced as full causal attention (exact up to seq
                              8192 = ``attention_chunk_size``; megatron-core has no chunked attention)
``dbrx``, ``olmoe``,           each family's own field names (DBRX's ``ffn_config``/``attn_config``,
``phimoe``, ``granitemoe``,   ERNIE's ``moe_k``, Hunyuan's per-layer ``moe_topk``, ...) mapped onto the
``ernie4_5_moe``,             names above by :mod:`planner.model.families`; a refusal names the
``minimax_m2``,               family's own field
``hunyuan_v1_moe``
``ministral3``                Mistral 3's text model (in a ``mistral3`` wrapper): dense, as ``mistral``
``qwen3_next``,               hybrids (:mod:`planner.model.hybrids`): per-layer ``mixers`` (Gated
``nemotron_h``,               DeltaNet, Mamba-2, none) and ``mlp_layers`` with the widths of
``deepseek_v32``              :mod:`planner.model.mixers`; DeepSeek-V3.2's sparse-attention indexer
============================  =====================================================================

Besides the shape, a ModelSpec carries the hyperparameters the trainers must run as the config says
(issue 23): RoPE base and scaling (``rope_theta`` + ``rope_scaling``, or transformers v5
``rope_parameters`` holding both; YaRN, llama3, linear), ``partial_rotary_factor``, the norm epsilon
(``rms_norm_eps`` / ``layer_norm_epsilon``), the router (``scoring_func``; expert bias for
``topk_method: noaux_tc`` only with a non-softmax router; ``routed_scaling_factor``; ``norm_topk_prob``),
Llama 4's L2 q/k norm and GPT-OSS's ``swiglu_limit``. A field the file leaves out takes the default of
its transformers config class.

A multimodal wrapper (Llama 4, Mistral 3, Kimi-K2.5) is read as its ``text_config``.
A ``model_type`` outside these is read as the family of its ``architectures`` entry when that is
a known class (a renamed fine-tune, e.g. ``LlamaForCausalLM``) and refused otherwise (pure Mamba,
encoders). A config that lacks a field the cost model needs, or whose values contradict
each other, is refused with an :class:`~planner.errors.InputError` that names the file and the
field.
"""

from __future__ import annotations

import difflib
import json
import math
import weakref
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import InputError, not_utf8, pydantic_message
from planner.model import families, hybrids
from planner.model.mixers import MIXERS, GatedDeltaNet, Mamba2, SparseIndexer

# Megatron-Bridge's DeepSeek-V3 and Kimi-K2 bridges pad the vocabulary to a multiple of 1280;
# everything else uses Megatron's default of 128 (flops_per_token.md, models.json _about).
MAX_LAYERS = 10_000   # a sanity bound on num_hidden_layers (the deepest published decoders have ~130)
_VOCAB_DIVISOR_1280 = ("deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32")
_MLA_FAMILIES = ("deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32")
_QWEN_MOE = ("qwen3_moe", "qwen2_moe", "qwen3_next")
_DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "ministral3", "nemotron")  # ministral3: Mistral 3's text model
# Nemotron-3/4 (HF NemotronConfig): plain MLP with squared ReLU (hidden_act relu2), LayerNorm, partial RoPE
_PLAIN_MLP_FAMILIES = ("nemotron", "gpt2")
POSITION_EMBEDDINGS = ("rope", "none", "learned_absolute")
_LAYERNORM_FAMILIES = ("nemotron", "gpt2")
_LLAMA4 = ("llama4", "llama4_text")
KNOWN_FAMILIES = (_DENSE_FAMILIES + _MLA_FAMILIES + _QWEN_MOE + ("mixtral", "gpt_oss", "glm4_moe") + _LLAMA4
                  + families.MODEL_TYPES)
# every layer MoE, experts of intermediate_size (the dense width is not used)
_ALL_MOE = ("mixtral", "gpt_oss") + families.EXPERTS_OF_INTERMEDIATE + ("dbrx",)
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2",
    "KimiK2ForCausalLM": "kimi_k2", "Qwen3MoeForCausalLM": "qwen3_moe", "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral", "GptOssForCausalLM": "gpt_oss", "Glm4MoeForCausalLM": "glm4_moe",
    "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4",
    "Ministral3ForCausalLM": "ministral3", "NemotronForCausalLM": "nemotron", "KimiK25ForConditionalGeneration": "kimi_k2", **families.ARCHITECTURES,
}


ROPE_KINDS = ("yarn", "llama3", "linear")
ROUTER_SCORES = ("softmax", "sigmoid", "sqrtsoftplus")


class RopeScaling(BaseModel):
    """RoPE frequency scaling as the config sets it (HF ``rope_scaling``, or transformers v5
    ``rope_parameters``); a field the file does not give stays None (the trainer's default applies)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(..., description="'yarn', 'llama3' or 'linear' [rope_type / type]")
    factor: float = Field(..., gt=0, description="context extension factor [factor]")
    original_max_position_embeddings: int | None = Field(None, ge=1, description="pre-extension context")
    beta_fast: float | None = Field(None, description="YaRN high-frequency boundary [beta_fast]")
    beta_slow: float | None = Field(None, description="YaRN low-frequency boundary [beta_slow]")
    mscale: float | None = Field(None, description="YaRN attention scale [mscale]")
    mscale_all_dim: float | None = Field(None, description="YaRN attention scale, all dims [mscale_all_dim]")
    truncate: bool | None = Field(None, description="YaRN: round the correction range to integers [truncate]")
    low_freq_factor: float | None = Field(None, gt=0, description="llama3 [low_freq_factor]")
    high_freq_factor: float | None = Field(None, gt=0, description="llama3 [high_freq_factor]")

    @model_validator(mode="after")
    def _check_kind(self):
        if self.kind not in ROPE_KINDS:
            raise ValueError(f"rope scaling type must be one of {', '.join(ROPE_KINDS)}, got {self.kind!r}")
        return self


class ModelSpec(BaseModel):
    """A decoder-only transformer as the cost model sees it (HF field names in brackets).

    Widths are per token; per-layer facts are tuples with one entry per decoder layer. MTP layers
    (``mtp_layers``) come after the decoder layers and copy the type (MoE or dense) of the last
    decoder layer, as Megatron builds them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(..., description="catalog key or the config's name")
    family: str = Field(..., description="HF model_type: llama, deepseek_v3, kimi_k2, qwen3_moe, gpt_oss, mixtral, ...")
    num_layers: int = Field(..., ge=1, description="decoder layers [num_hidden_layers]")
    hidden_size: int = Field(..., ge=1, description="model width h [hidden_size]")
    vocab_size: int = Field(..., ge=1, description="tokenizer vocabulary [vocab_size]")
    make_vocab_divisible_by: int = Field(128, ge=1, description="Megatron make_vocab_size_divisible_by")
    tied_embeddings: bool = Field(False, description="output head shares the input embedding [tie_word_embeddings]")
    num_attention_heads: int = Field(..., ge=1, description="query heads [num_attention_heads]")
    num_kv_heads: int = Field(..., ge=1, description="key/value heads [num_key_value_heads]")
    head_dim: int = Field(..., ge=1, description="per-head width [head_dim]; MLA: v_head_dim (Megatron kv_channels)")
    attention: str = Field("gqa", description="'gqa' (MHA/GQA/MQA) or 'mla' (Multi-head Latent Attention)")
    q_lora_rank: int | None = Field(None, ge=1, description="MLA query low-rank width (None: full-rank query)")
    kv_lora_rank: int | None = Field(None, ge=1, description="MLA compressed KV width")
    qk_nope_head_dim: int | None = Field(None, ge=1, description="MLA per-head q/k width without RoPE")
    qk_rope_head_dim: int | None = Field(None, ge=1, description="MLA per-head q/k RoPE width")
    v_head_dim: int | None = Field(None, ge=1, description="MLA per-head value width")
    ffn_hidden_size: int = Field(..., ge=0, description="dense MLP width [intermediate_size]")
    gated_mlp: bool = Field(True, description="gated linear unit (SwiGLU etc.): 3 matrices per MLP, else 2")
    activation: str = Field("silu", description="MLP activation as Megatron runs it (silu, gelu, quick_gelu, ...)")
    num_experts: int = Field(0, ge=0, description="routed experts per MoE layer; 0 = dense model")
    moe_ffn_hidden_size: int = Field(0, ge=0, description="routed expert width [moe_intermediate_size]")
    top_k: int = Field(0, ge=0, description="experts per token [num_experts_per_tok]")
    shared_ffn_hidden_size: int = Field(0, ge=0, description="shared-expert width (n_shared_experts x moe_intermediate_size)")
    moe_layers: tuple[bool, ...] = Field((), description="per decoder layer: True when the layer is MoE")
    n_group: int = Field(1, ge=1, description="expert groups for group-limited routing [n_group]")
    topk_group: int = Field(1, ge=1, description="groups a token may route to [topk_group]")
    mtp_layers: int = Field(0, ge=0, description="multi-token-prediction layers [num_nextn_predict_layers]")
    sliding_window: int | None = Field(None, ge=1, description="sliding-window width W (tokens)")
    max_position_embeddings: int | None = Field(None, ge=1, description="longest context the released model "
                                                "was trained for [max_position_embeddings]; None = not given")
    swa_layers: tuple[bool, ...] = Field((), description="per decoder layer: True when the layer uses the window")
    qk_norm: bool = Field(False, description="RMSNorm on q and k per head (Qwen3) or on the MLA latents")
    attention_bias: bool = Field(False, description="biases on the q, k, v, o projections")
    mlp_bias: bool = Field(False, description="biases on the expert / MLP projections (GPT-OSS)")
    router_bias: bool = Field(False, description="trained per-expert router bias (GPT-OSS)")
    attention_sinks: bool = Field(False, description="one learnable sink logit per head and layer (GPT-OSS)")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base [rope_theta; v5 rope_parameters.rope_theta]")
    rope_scaling: RopeScaling | None = Field(None, description="RoPE scaling (YaRN, llama3, linear); None = plain RoPE")
    partial_rotary_factor: float = Field(1.0, gt=0, le=1, description="share of each head that is rotated "
                                         "[partial_rotary_factor]")
    norm_eps: float = Field(1e-6, gt=0, description="RMSNorm epsilon [rms_norm_eps / layer_norm_epsilon]")
    layer_norm: bool = Field(False, description="LayerNorm (mean and bias) rather than RMSNorm: GPT-2/GPT-3 "
                             "(GPT2Block ln_1/ln_2), Nemotron-3/4 (NemotronLayerNorm1P)")
    router_score: str = Field("softmax", description="router score function: softmax, sigmoid or sqrtsoftplus "
                              "[scoring_func]")
    expert_bias: bool = Field(False, description="aux-loss-free routing with a per-expert score bias "
                              "[topk_method noaux_tc]; never with a softmax router")
    router_scale: float = Field(1.0, gt=0, description="routed experts' output scale [routed_scaling_factor]")
    norm_topk_prob: bool = Field(False, description="top-k router weights renormalised to sum to 1 [norm_topk_prob]")
    qk_l2_norm: bool = Field(False, description="weightless L2 norm on q and k (Llama 4 [use_qk_norm])")
    activation_clamp: float | None = Field(None, gt=0, description="GLU inputs clamped to +-limit (GPT-OSS "
                                           "[swiglu_limit]); None = no clamp")
    mixers: tuple[str, ...] = Field((), description="per decoder layer: its token mixer, 'attention', 'gdn' (Gated "
                                    "DeltaNet), 'mamba' (Mamba-2) or 'none' (an MLP-only block); () = all attention")
    mlp_layers: tuple[bool, ...] = Field((), description="per decoder layer: True when it has an MLP or MoE (False: a "
                                         "mixer-only Nemotron-H block); () = every layer")
    gdn: GatedDeltaNet | None = Field(None, description="Gated DeltaNet widths of the 'gdn' layers [linear_*]")
    mamba: Mamba2 | None = Field(None, description="Mamba-2 widths of the 'mamba' layers [mamba_*, ssm_state_size]")
    dsa: SparseIndexer | None = Field(None, description="DeepSeek sparse attention's indexer on every attention "
                                      "layer [index_*]; None = dense attention")
    attention_output_gate: bool = Field(False, description="sigmoid gate on the attention output (Qwen3-Next)")
    shared_expert_gate: bool = Field(False, description="sigmoid gate (h -> 1) on the shared expert's output (Qwen3-Next)")
    norm_zero_centered: bool = Field(False, description="norms scale by 1 + weight (zero-centered gamma, Qwen3-Next)")
    position_embedding: str = Field("rope", description="'rope', 'none' (Nemotron-H's attention has none) or "
                                    "'learned_absolute' (GPT-2/GPT-3: a learned table added to the token embedding)")
    source: str = Field("", description="where the numbers came from (catalog source or the file path)")

    @model_validator(mode="after")
    def _check(self):
        n = self.num_layers
        if not self.moe_layers:
            object.__setattr__(self, "moe_layers", tuple([self.num_experts > 0] * n))
        if not self.swa_layers:
            object.__setattr__(self, "swa_layers", tuple([self.sliding_window is not None] * n))
        if not self.mixers:
            object.__setattr__(self, "mixers", ("attention",) * n)
        if not self.mlp_layers:
            object.__setattr__(self, "mlp_layers", (True,) * n)
        for name in ("moe_layers", "mixers", "mlp_layers"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, num_layers is {n}")
        self._check_mixers()
        if len(self.swa_layers) != n:
            raise ValueError(f"swa_layers has {len(self.swa_layers)} entries, num_layers is {n}")
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"attention must be 'gqa' or 'mla', got {self.attention!r}")
        if self.attention == "gqa" and self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_key_value_heads ({self.num_kv_heads}) must divide num_attention_heads ({self.num_attention_heads})"
            )
        if self.attention == "mla":
            for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, f) is None:
                    raise ValueError(f"Multi-head Latent Attention needs {f}")
        if any(self.moe_layers):
            if self.num_experts < 1:
                raise ValueError("MoE layers need num_experts >= 1")
            if self.moe_ffn_hidden_size < 1:
                raise ValueError("MoE layers need moe_intermediate_size >= 1")
            if not 1 <= self.top_k <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.top_k}) must be between 1 and the number of experts ({self.num_experts})"
                )
            if self.num_experts % self.n_group:
                raise ValueError(f"n_group ({self.n_group}) must divide the number of experts ({self.num_experts})")
            if self.topk_group > self.n_group:
                raise ValueError(f"topk_group ({self.topk_group}) must not exceed n_group ({self.n_group})")
        if self.num_dense_layers and self.ffn_hidden_size < 1:
            raise ValueError("dense layers need intermediate_size >= 1")
        if self.router_score not in ROUTER_SCORES:
            raise ValueError(f"router score function must be one of {', '.join(ROUTER_SCORES)}, got {self.router_score!r}")
        if self.expert_bias and self.router_score == "softmax":
            raise ValueError("expert bias (noaux_tc) needs a sigmoid or sqrtsoftplus router, not softmax")
        if any(self.swa_layers) and self.sliding_window is None:
            raise ValueError("swa_layers marks sliding-window layers but sliding_window is not set")
        return self

    def _check_mixers(self) -> None:
        bad = sorted(set(self.mixers) - set(MIXERS))
        if bad:
            raise ValueError(f"mixers must be among {', '.join(MIXERS)}, got {bad}")
        for kind, attr in (("gdn", "gdn"), ("mamba", "mamba")):
            if kind in self.mixers and getattr(self, attr) is None:
                raise ValueError(f"'{kind}' layers need the {attr} widths")
        if any(e and not m for e, m in zip(self.moe_layers, self.mlp_layers)):
            raise ValueError("a MoE layer must have an MLP (mlp_layers)")
        if self.dsa is not None and not (self.attention == "mla" and self.q_lora_rank):
            raise ValueError("DeepSeek sparse attention's indexer needs MLA with a q_lora_rank")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding must be one of {', '.join(POSITION_EMBEDDINGS)}, "
                             f"got {self.position_embedding!r}")

    # ----- derived facts -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP (not MoE, not a mixer-only block)."""
        return sum(1 for e, m in zip(self.moe_layers, self.mlp_layers) if m and not e)

    @property
    def is_hybrid(self) -> bool:
        """Some layer mixes tokens with something other than softmax attention, or has no MLP, or the
        attention is sparse (DSA)."""
        return any(x != "attention" for x in self.mixers) or not all(self.mlp_layers) or self.dsa is not None

    def mlp_kind(self, i: int) -> str:
        """Layer ``i``'s MLP: 'moe', 'dense' or 'none'."""
        return "moe" if self.moe_layers[i] else ("dense" if self.mlp_layers[i] else "none")

    @property
    def mtp_is_moe(self) -> bool:
        """MTP layers copy the type of the last decoder layer (Megatron)."""
        return bool(self.moe_layers[-1])

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP: 3 for a gated linear unit, 2 otherwise."""
        return 3 if self.gated_mlp else 2

    def padded_vocab(self, tp: int = 1) -> int:
        """Megatron's padded vocabulary: ceil(V / (D*TP)) * D*TP."""
        m = self.make_vocab_divisible_by * max(1, int(tp))
        return -(-self.vocab_size // m) * m

    def summary(self) -> str:
        kind = f"MoE {self.num_experts}x top-{self.top_k}" if self.is_moe else "dense"
        return f"{self.name}: {self.family}, {self.num_layers} layers, h={self.hidden_size}, {self.attention.upper()}, {kind}"


# The cost model's caches are keyed by the model (``functools.lru_cache`` and memo dicts: ~14,000 lookups in
# one plan of DeepSeek-V3), and pydantic hashes a frozen model field by field each time (55 fields, ~4 us).
# The spec is frozen, so its hash is pydantic's, computed once per instance: kept by identity while the
# instance lives (a weak reference drops the entry with it; ``model_copy`` makes a new instance).
_FIELD_HASH = ModelSpec.__hash__
_HASHES: dict[int, tuple] = {}


def _hash_once(self) -> int:
    hit = _HASHES.get(id(self))
    if hit is not None and hit[0]() is self:
        return hit[1]
    h = _FIELD_HASH(self)
    key = id(self)
    _HASHES[key] = (weakref.ref(self, lambda _, k=key: _HASHES.pop(k, None)), h)
    return h


ModelSpec.__hash__ = _hash_once


# ----------------------------------------------------------------------------------------------
# Reading a config.json


class _Reader:
    """Field access on one config dict that turns a missing or malformed field into an
    InputError naming the file and the field."""

    def __init__(self, cfg: dict, source: str):
        self.cfg = cfg
        self.source = source

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def err(self, key: str, problem: str) -> InputError:
        key = (self.cfg.get("_field_names") or {}).get(key, key)   # the family's own name (planner.model.families)
        return InputError(f"{self.source}: field '{key}' {problem}")

    def int(self, key: str, default: Any = ..., minimum: int = 0, maximum: int | None = None) -> Any:
        v = self.cfg.get(key)
        if v is None:
            if default is ...:
                raise self.err(key, "is missing; add it (Hugging Face config.json name)")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v:
            raise self.err(key, f"must be an integer, got {v!r}")
        if int(v) < minimum:
            raise self.err(key, f"must be >= {minimum}, got {v!r}")
        if maximum is not None and int(v) > maximum:
            raise self.err(key, f"must be <= {maximum}, got {v!r}")
        return int(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.cfg.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.err(key, f"must be true or false, got {v!r}")
        return v


def _first_key(r: _Reader, keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if r.has(k):
            return k
    return None


def _unwrap_text_config(cfg: dict) -> dict:
    """A multimodal config (Llama 4) keeps the decoder's fields under ``text_config``."""
    if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type")),
               "architectures": cfg.get("architectures") or cfg["text_config"].get("architectures"),
               "source": cfg.get("source")}
    return cfg


def _family(cfg: dict, r: _Reader) -> str:
    """The decoder family: ``model_type``, else the family of a known architecture."""
    family = str(cfg.get("model_type") or "").strip().lower()
    archs = cfg.get("architectures") if isinstance(cfg.get("architectures"), list) else []
    if family == "llama4_text":
        family = "llama4"
    if family in KNOWN_FAMILIES:
        return family
    # a renamed model_type of a known architecture (e.g. a fine-tune) is read as that family
    by_arch = [_ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in _ARCHITECTURES]
    if by_arch:
        return by_arch[0]
    if not family:
        raise r.err("model_type", f"is missing (architectures {archs!r}); set it to one of {', '.join(KNOWN_FAMILIES)}")
    raise r.err(
        "model_type",
        f"{family!r} (architectures {archs!r}) is not a decoder family topoplan can model; "
        f"use one of {', '.join(KNOWN_FAMILIES)} if the layers match",
    )


def _attention(r: _Reader, family: str, h: int, n_h: int, n_kv: int) -> tuple[dict, int, int]:
    """(MLA fields, head_dim, key/value heads)."""
    fields: dict[str, Any] = {}
    if family in _MLA_FAMILIES or r.has("kv_lora_rank"):
        fields.update(
            attention="mla",
            q_lora_rank=r.int("q_lora_rank", None, minimum=1),
            kv_lora_rank=r.int("kv_lora_rank", minimum=1),
            qk_nope_head_dim=r.int("qk_nope_head_dim", minimum=1),
            qk_rope_head_dim=r.int("qk_rope_head_dim", minimum=1),
            v_head_dim=r.int("v_head_dim", minimum=1),
        )
        # MLA has no key/value groups: every head gets its own K and V from the latent
        return fields, fields["v_head_dim"], n_h
    if r.has("head_dim"):
        head_dim = r.int("head_dim", minimum=1)
    else:
        if h % n_h:
            raise r.err(
                "num_attention_heads",
                f"({n_h}) must divide hidden_size ({h}) when head_dim is not given; set head_dim",
            )
        head_dim = h // n_h
    if n_h % n_kv:
        raise r.err("num_key_value_heads", f"({n_kv}) must divide num_attention_heads ({n_h})")
    return fields, head_dim, n_kv


def _experts(r: _Reader, family: str) -> dict[str, int]:
    """Routed experts, top-k, expert and shared-expert widths, and group-limited routing."""
    ek = _first_key(r, ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"))
    n_exp = r.int(ek, 0) if ek else 0
    out = dict(num_experts=n_exp, top_k=0, moe_ffn_hidden_size=0, shared_ffn_hidden_size=0, n_group=1, topk_group=1)
    if n_exp <= 0:
        return out
    kk = _first_key(r, ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k")) or "num_experts_per_tok"
    top_k = r.int(kk, minimum=1)
    if top_k > n_exp:
        raise r.err(kk, f"({top_k}) exceeds the number of experts {ek} ({n_exp})")
    if family in ("mixtral", "gpt_oss", "llama4"):
        moe_ffn = r.int("intermediate_size", minimum=1)
    else:
        moe_ffn = r.int("moe_intermediate_size", minimum=1)
    shared = 0
    if family == "llama4":
        shared = moe_ffn  # Llama4TextMoe: one shared expert of the routed experts' width
    elif r.has("n_shared_experts"):
        shared = r.int("n_shared_experts") * moe_ffn
    elif r.has("shared_expert_intermediate_size"):
        shared = r.int("shared_expert_intermediate_size")
    n_group = r.int("n_group", 1, minimum=1)
    topk_group = r.int("topk_group", 1, minimum=1)
    if n_exp % n_group:
        raise r.err("n_group", f"({n_group}) must divide the number of experts ({n_exp})")
    if topk_group > n_group:
        raise r.err("topk_group", f"({topk_group}) must not exceed n_group ({n_group})")
    out.update(top_k=top_k, moe_ffn_hidden_size=moe_ffn, shared_ffn_hidden_size=shared, n_group=n_group,
               topk_group=topk_group)
    return out


def _layer_list(r: _Reader, cfg: dict, key: str, L: int, default: Any) -> list:
    listed = cfg.get(key)
    if listed is None:
        listed = default
    if not isinstance(listed, list) or not all(isinstance(i, int) and 0 <= i < L for i in listed):
        raise r.err(key, f"must be a list of layer indices in [0, {L}), got {listed!r}")
    return listed


def _moe_layers(r: _Reader, cfg: dict, family: str, L: int, n_exp: int) -> list[bool]:
    """Which layers are MoE, in each family's own convention."""
    if n_exp == 0:
        return [False] * L
    if isinstance(cfg.get("_moe_pattern"), list):   # Nemotron-H: the 'E' blocks (planner.model.hybrids)
        return list(cfg["_moe_pattern"])
    if family == "ernie4_5_moe":    # planner.model.families lists them from moe_layer_start_index etc.
        listed = set(_layer_list(r, cfg, "moe_layers", L, list(range(L))))
        return [i in listed for i in range(L)]
    if family == "llama4":
        # HF Llama4TextConfig: moe_layers, else every interleave_moe_layer_step-th layer
        step = r.int("interleave_moe_layer_step", 1, minimum=1)
        listed = set(_layer_list(r, cfg, "moe_layers", L, list(range(step - 1, L, step))))
        return [i in listed for i in range(L)]
    if family in _MLA_FAMILIES or r.has("first_k_dense_replace"):
        k = r.int("first_k_dense_replace", 0)
        freq = r.int("moe_layer_freq", 1, minimum=1)
        if k > L:
            raise r.err("first_k_dense_replace", f"({k}) exceeds num_hidden_layers ({L})")
        return [i >= k and i % freq == 0 for i in range(L)]
    if family in _QWEN_MOE or r.has("decoder_sparse_step") or r.has("mlp_only_layers"):
        step = r.int("decoder_sparse_step", 1, minimum=1)
        only = _layer_list(r, cfg, "mlp_only_layers", L, []) if cfg.get("mlp_only_layers") else []
        return [(i not in only) and (i + 1) % step == 0 for i in range(L)]
    return [True] * L


def _dense_ffn(r: _Reader, family: str, moe: list[bool]) -> int:
    """Dense MLP width: needed only when some layer is dense."""
    dense_key = "intermediate_size_mlp" if family == "llama4" else "intermediate_size"
    if all(moe):
        return r.int(dense_key, 0) if family not in _ALL_MOE else 0
    return r.int(dense_key, minimum=1)


def _sliding_window(r: _Reader, cfg: dict, family: str, L: int) -> tuple[int | None, list[bool]]:
    """(window, which layers slide) in each family's own convention."""
    window = None
    swa = [False] * L
    lt = cfg.get("layer_types")
    if family == "gpt_oss" or isinstance(lt, list):
        window = r.int("sliding_window", None, minimum=1)
        if isinstance(lt, list):
            if len(lt) != L:
                raise r.err("layer_types", f"has {len(lt)} entries, num_hidden_layers is {L}")
            swa = [t == "sliding_attention" for t in lt]
        elif window is not None:
            swa = [i % 2 == 0 for i in range(L)]  # GPT-OSS: even layers slide, odd layers are full
        if any(swa) and window is None:
            raise r.err("sliding_window", "is missing but layer_types has sliding_attention layers")
    elif family == "llama4":
        # Chunked attention (attention_chunk_size, 8192) on the RoPE layers is priced as full causal
        # attention: exact up to seq 8192, and what megatron-core 0.19 runs (it has no chunked
        # attention), an over-estimate of those layers' attention core beyond (docs/models.md).
        pass
    elif family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if r.bool("use_sliding_window", False) and r.has("sliding_window"):
            window = r.int("sliding_window", minimum=1)
            first = r.int("max_window_layers", L)
            swa = [i >= first for i in range(L)]
    elif r.has("sliding_window"):  # mistral / mixtral semantics: every layer slides
        window = r.int("sliding_window", minimum=1)
        swa = [True] * L
    return (window if any(swa) else None), swa


def _activation(r: _Reader, cfg: dict, family: str) -> tuple[str, bool]:
    """(activation, gated MLP)."""
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "silu").lower()
    gated = r.bool("gated_mlp", act in ("silu", "swiglu", "geglu", "gelu_pytorch_tanh")
                   or (family in KNOWN_FAMILIES and family not in _PLAIN_MLP_FAMILIES))
    if family == "gpt_oss":
        act = "quick_gelu"  # Megatron: quick_gelu GLU with offset 1.0 and clamp 7.0 (models.json)
    if act == "swiglu":
        act = "silu"
    return act, gated


# Transformers' config-class defaults for a field the file leaves out (rope_theta, rms_norm_eps, router).
_THETA_DEFAULT = {"mixtral": 1e6, "gpt_oss": 150000.0, "llama4": 500000.0}
_EPS_DEFAULT = {"mixtral": 1e-5, "gpt_oss": 1e-5, "glm4_moe": 1e-5, "llama4": 1e-5}
_SIGMOID_FAMILIES = ("deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "llama4")   # DeepseekV3Config scoring_func, Glm4MoeTopkRouter
_NOAUX_FAMILIES = ("deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe")              # DeepseekV3Config topk_method, e_score_correction_bias
_NORM_TOPK_FAMILIES = ("deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "mixtral", "gpt_oss")  # renormalised (or top-k softmax)
_ROPE_TYPES = {"yarn": "yarn", "llama3": "llama3", "linear": "linear", "default": None}


def _float(r: _Reader, cfg: dict, key: str, default: Any, where: str = "") -> Any:
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise r.err(where + key, f"must be a positive number, got {v!r}")
    return float(v)


def _rope_dict(r: _Reader, cfg: dict) -> tuple[dict, str]:
    """The RoPE settings and the field they came from: transformers v5 ``rope_parameters`` (one dict,
    or one per layer type when all agree), else ``rope_scaling`` beside a top-level ``rope_theta``."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        kinds = list(rp.values())
        if any(k != kinds[0] for k in kinds):
            raise r.err("rope_parameters", f"differs between layer types ({', '.join(rp)}); topoplan's trainers "
                        "take one RoPE setting for every layer: use a config with one")
        rp = kinds[0]
    if isinstance(rp, dict):
        return {**rp, "rope_theta": rp.get("rope_theta", cfg.get("rope_theta"))}, "rope_parameters."
    if rp is not None:
        raise r.err("rope_parameters", f"must be an object, got {rp!r}")
    rs = cfg.get("rope_scaling")
    if rs is not None and not isinstance(rs, dict):
        raise r.err("rope_scaling", f"must be an object or null, got {rs!r}")
    return {**(rs or {}), "rope_theta": cfg.get("rope_theta")}, "rope_scaling."


def _rope(r: _Reader, cfg: dict, family: str) -> dict:
    """rope_theta, rope_scaling (None for plain RoPE) and partial_rotary_factor."""
    d, where = _rope_dict(r, cfg)
    theta = _float(r, d, "rope_theta", _THETA_DEFAULT.get(family, 10000.0),
                   "rope_parameters." if where == "rope_parameters." else "")
    raw = d.get("rope_type") or d.get("type") or "default"
    kind = _ROPE_TYPES.get(str(raw), ...)
    if kind is ...:
        raise r.err(where + "rope_type", f"{raw!r} is not a RoPE scaling topoplan can emit; use one of "
                    f"{', '.join(_ROPE_TYPES)}")
    scaling = None
    if kind:
        opt = {k: d[k] for k in ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                                 "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor")
               if d.get(k) is not None}
        if "factor" not in d:
            raise r.err(where + "factor", f"is missing for {raw} RoPE scaling; add the scaling factor")
        try:
            scaling = RopeScaling(kind=kind, factor=d["factor"], **opt)
        except ValidationError as exc:
            raise InputError(pydantic_message(exc, r.source)) from None
    partial = _float(r, cfg, "partial_rotary_factor", d.get("partial_rotary_factor") or 1.0)
    return dict(rope_theta=theta, rope_scaling=scaling, partial_rotary_factor=partial)


def _norm_eps(r: _Reader, cfg: dict, family: str) -> float:
    key = _first_key(r, ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_epsilon", "norm_eps"))
    return _float(r, cfg, key, 0.0) if key else _EPS_DEFAULT.get(family, 1e-6)


def _router(r: _Reader, cfg: dict, family: str, n_exp: int) -> dict:
    """Router score function, aux-loss-free expert bias (``topk_method: noaux_tc``; megatron-core refuses
    it with softmax, so a softmax router never gets it), routed scale and top-k renormalisation."""
    if n_exp <= 0:
        return {}
    score = str(cfg.get("scoring_func") or ("sigmoid" if family in _SIGMOID_FAMILIES else "softmax")).lower()
    if score not in ROUTER_SCORES:
        raise r.err("scoring_func", f"{score!r} is not a router score function; use one of {', '.join(ROUTER_SCORES)}")
    method = str(cfg.get("topk_method") or ("noaux_tc" if family in _NOAUX_FAMILIES else "greedy"))
    return dict(router_score=score, expert_bias=method == "noaux_tc" and score != "softmax",
                router_scale=_float(r, cfg, "routed_scaling_factor", 1.0),
                norm_topk_prob=r.bool("norm_topk_prob", family in _NORM_TOPK_FAMILIES))


def spec_from_config(cfg: dict, name: str | None = None, source: str = "config.json") -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face style config dict; InputError names the field.

    The steps read the fields in this order (the first bad field is the one reported): family,
    sizes, attention, experts, which layers are MoE, dense width, sliding window, activation, the rest."""
    if not isinstance(cfg, dict):
        raise InputError(f"{source}: expected a JSON object (a Hugging Face config.json)")
    cfg = _unwrap_text_config(cfg)
    family = _family(cfg, _Reader(cfg, source))
    cfg = families.canonical(cfg, family, source)
    r = _Reader(cfg, source)
    L = r.int("num_hidden_layers", minimum=1, maximum=MAX_LAYERS)
    h = r.int("hidden_size", minimum=1)
    n_h = r.int("num_attention_heads", minimum=1)
    n_kv = r.int("num_key_value_heads", n_h, minimum=1)
    vocab = r.int("vocab_size", minimum=1)
    fields, head_dim, n_kv = _attention(r, family, h, n_h, n_kv)
    experts = _experts(r, family)
    moe = _moe_layers(r, cfg, family, L, experts["num_experts"])
    ffn = _dense_ffn(r, family, moe)
    window, swa = _sliding_window(r, cfg, family, L)
    act, gated = _activation(r, cfg, family)
    div = r.int("megatron_make_vocab_size_divisible_by", 1280 if family in _VOCAB_DIVISOR_1280 else 128, minimum=1)
    mtp = r.int("num_nextn_predict_layers", None) if r.has("num_nextn_predict_layers") else r.int("mtp_num_layers", 0)

    try:
        return ModelSpec(
            name=name or str(cfg.get("_name_or_path") or family),
            family=family,
            num_layers=L,
            hidden_size=h,
            vocab_size=vocab,
            make_vocab_divisible_by=div,
            tied_embeddings=r.bool("tie_word_embeddings", False),
            num_attention_heads=n_h,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            ffn_hidden_size=ffn,
            gated_mlp=gated,
            activation=act,
            **experts,
            moe_layers=tuple(moe),
            mtp_layers=mtp,
            sliding_window=window,
            max_position_embeddings=r.int("max_position_embeddings", None, minimum=1),
            swa_layers=tuple(swa),
            qk_norm=family in ("qwen3", "qwen3_moe") or bool(cfg.get("qk_layernorm")) or (bool(cfg.get("use_qk_norm")) and family != "llama4"),  # Llama 4: weightless L2 norm
            qk_l2_norm=family == "llama4" and r.bool("use_qk_norm", False),
            activation_clamp=_float(r, cfg, "swiglu_limit", None),
            layer_norm=family in _LAYERNORM_FAMILIES,
            # Qwen2 / Qwen2-MoE: q, k, v biases by construction (HF Qwen2Attention), no config field
            attention_bias=r.bool("attention_bias", family in ("gpt_oss", "qwen2", "qwen2_moe")),
            mlp_bias=family == "gpt_oss" or r.bool("mlp_bias", False),
            # GPT-OSS routers have a trained bias; DeepSeek's e_score_correction_bias is a buffer
            # updated outside the optimizer, so it is not a parameter (models.json counts agree).
            router_bias=family == "gpt_oss",
            attention_sinks=family == "gpt_oss",
            source=str(cfg.get("source") or source),
            norm_eps=_norm_eps(r, cfg, family),
            **_rope(r, cfg, family),
            **_router(r, cfg, family, experts["num_experts"]),
            **hybrids.spec_fields(cfg),
            **fields,
        )
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, source)) from None


# ----------------------------------------------------------------------------------------------
# Catalog


# planner/data/models.json: the reference catalog (Hugging Face config.json fields; each model's 'source' is
# the primary file its numbers were checked against); models_extra.json adds families beyond it in the same format.
CATALOG_FILES = ("data/models.json", "data/models_extra.json")


@lru_cache(maxsize=1)
def _catalog_raw() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in CATALOG_FILES:
        data = json.loads(resources.files("planner").joinpath(name).read_text())
        out.update({k: v for k, v in data.items() if not k.startswith("_")})
    return out


def catalog() -> list[str]:
    """Names of the built-in models (planner/data/models.json and models_extra.json)."""
    return list(_catalog_raw())


def _unknown(name: str) -> str:
    """The refusal of an unknown model name, with the closest catalog names when there are any."""
    close = difflib.get_close_matches(_norm(name), [_norm(k) for k in catalog()], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"unknown model {name!r}: {hint}use a catalog name (topoplan models list) or a config.json path"


def catalog_entry(name: str) -> dict:
    """The raw catalog record (HF fields plus sources and the computed parameter counts)."""
    key = _catalog_key(name)
    if key is None:
        raise InputError(_unknown(name))
    return dict(_catalog_raw()[key])


def _norm(s: str) -> str:
    return s.strip().lower().replace("_", "-").replace(" ", "-")


def _catalog_key(name: str) -> str | None:
    want = _norm(name)
    for k in _catalog_raw():
        if _norm(k) == want:
            return k
    return None


@lru_cache(maxsize=64)
def _load_catalog(key: str) -> ModelSpec:
    return spec_from_config(_catalog_raw()[key], name=key, source=f"catalog:{key}")


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog name (``deepseek-v3``, case-insensitive) or a path to a ``config.json`` (or a
    directory holding one). Raises InputError naming the file and the field it cannot model."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    s = str(name_or_path)
    key = _catalog_key(s)
    if key is not None:
        return _load_catalog(key)
    p = Path(s).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise InputError(f"--model {s}: the directory has no config.json; give the model's Hugging Face "
                             "config.json (or the directory that holds it)")
        p = p / "config.json"
    if not p.exists():
        if "/" in s or s.endswith(".json"):
            raise InputError(f"--model {s}: no such file; give a catalog name (topoplan models list) or a config.json path")
        raise InputError(_unknown(s))
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise not_utf8(p, exc, "config.json") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror})") from None
    name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    if isinstance(cfg, dict) and cfg.get("_name_or_path"):
        name = str(cfg["_name_or_path"]).rstrip("/").split("/")[-1]
    return spec_from_config(cfg, name=name, source=str(p))
