"""Training FLOPs per token, exactly as Megatron-Bridge counts them, plus per-layer costs and
parameter counts for the memory and step-time models.

``flops_per_token`` reproduces Megatron-Bridge's ``num_floating_point_operations`` (the
``transformer_flops`` branch of ``training/utils/flop_utils.py``), the convention behind every
published "model TFLOP/s". With multiply-adds (MACs) per token::

    FLOPs/token = 6 * (MLP + ATTN + MTP + LOGITS)          # 6 = (1 fwd + 2 bwd) * 2 FLOPs per MAC

    L' = L + m                                               # decoder + MTP layers
    N_moe = sum(p_i) + p_{L-1}*m ;  N_dense = L' - N_moe     # MTP layers copy the last layer's type
    MLP  = h * (k*F_dense*N_dense + k*F_moe*top_k*N_moe + k*F_sh*N_moe)      # k = 3 gated, 2 plain
    ATTN = sum over L' layers of (proj + core)
      GQA: proj = h*(n_h*d + 2*n_kv*d) + n_h*d*h ;  core = n_h*d*s (causal average s/2, QK^T and AV)
           sliding layer (W < s): core = 2*n_h*d*c_W,  c_W = W - W*(W-1)/(2s)
      MLA: proj = q_r*(h + n_h*(d_n+d_r) + 1) + kv_r*(h + n_h*(d_n+d_v) + 1) + h*d_r + n_h*d_v*h
           (no q_lora_rank: h*n_h*(d_n+d_r) for the query)
           core = (s/2)*n_h*(d_n+d_r) + (s/2)*n_h*d_v
    MTP  = m * (3h + 2h^2)                                   # norms + eh_proj
    LOGITS = h * V_pad * (m + 1),   V_pad = ceil(V/(D*TP))*D*TP

``formula="legacy"`` is Megatron-Bridge up to v0.4.x (the 26.02-26.04 containers): ``k = 3`` only
for a silu-gated MLP, and every layer is costed as full causal attention (no sliding window).

Not counted (model FLOPs, not hardware FLOPs): norms other than the MTP and MLA ones, softmax, RoPE,
the router, activations, biases, the embedding lookup, the loss and recomputation.

``layer_costs`` splits the same forward work per decoder layer (then per MTP layer) into the terms
the step-time model prices separately, adds the router GEMM that Megatron's formula leaves out (in
its own field) and gives each layer's parameter counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from planner.model.spec import ModelSpec

FORMULAS = ("current", "legacy")


# ----------------------------------------------------------------------------------------------
# Per-layer building blocks (multiply-adds per token, forward)


def _k(model: ModelSpec, formula: str) -> int:
    if formula == "legacy":
        return 3 if (model.gated_mlp and model.activation == "silu") else 2
    return model.mlp_matrices


def _attn_proj_macs(model: ModelSpec) -> float:
    h, n_h = model.hidden_size, model.num_attention_heads
    if model.attention == "mla":
        d_n, d_r, d_v = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        kv_r = model.kv_lora_rank
        if model.q_lora_rank:
            q = model.q_lora_rank * (h + n_h * (d_n + d_r) + 1)
        else:
            q = h * n_h * (d_n + d_r)
        kv = kv_r * (h + n_h * (d_n + d_v) + 1) + h * d_r
        o = n_h * d_v * h
        return float(q + kv + o)
    d, n_kv = model.head_dim, model.num_kv_heads
    return float(h * (n_h * d + 2 * n_kv * d) + n_h * d * h)


def causal_context(seq_len: int, window: int | None) -> float:
    """Average number of keys a query attends to under a causal mask with an optional window W
    (Megatron window_size (W-1, 0)): s/2 for full attention, W - W(W-1)/(2s) when W < s."""
    s = float(seq_len)
    if window is None or window >= seq_len:
        return s / 2.0
    w = float(window)
    return w - w * (w - 1.0) / (2.0 * s)


def _attn_core_macs(model: ModelSpec, seq_len: int, swa: bool, formula: str = "current") -> float:
    n_h = model.num_attention_heads
    window = model.sliding_window if (swa and formula != "legacy") else None
    if model.dsa is not None:
        window = model.dsa.topk          # DSA: each query reads its top-k keys (planner.model.mixers)
    c = causal_context(seq_len, window)
    if model.attention == "mla":
        return c * n_h * (model.qk_nope_head_dim + model.qk_rope_head_dim) + c * n_h * model.v_head_dim
    return 2.0 * n_h * model.head_dim * c


def mixer_macs(model: ModelSpec, mixer: str, seq_len: int, swa: bool, formula: str = "current") -> tuple[float, float]:
    """(projections, core) multiply-adds per token, forward, of one layer's token mixer: softmax attention
    (with the output gate and DSA's indexer when the model has them), Gated DeltaNet, Mamba-2 or none."""
    h = model.hidden_size
    if mixer == "gdn":
        return model.gdn.proj_macs(h), model.gdn.core_macs()
    if mixer == "mamba":
        return model.mamba.proj_macs(h), model.mamba.core_macs()
    if mixer == "none":
        return 0.0, 0.0
    proj = _attn_proj_macs(model)
    core = _attn_core_macs(model, seq_len, swa, formula)
    if model.attention_output_gate:
        proj += h * model.num_attention_heads * model.head_dim
    if model.dsa is not None:
        proj += model.dsa.proj_macs(h, model.q_lora_rank)
        core += model.dsa.score_macs(causal_context(seq_len, None))
    return proj, core


def _mtp_proj_macs(model: ModelSpec) -> float:
    h = model.hidden_size
    return 3.0 * h + 2.0 * h * h


# ----------------------------------------------------------------------------------------------
# Megatron-Bridge FLOPs per token


def flops_terms(model: ModelSpec, seq_len: int, tp: int = 1, formula: str = "current") -> dict:
    """Megatron-Bridge's training FLOPs per token split into its four terms, in GFLOP/token
    (each already multiplied by 6): ``mlp``, ``attention``, ``mtp``, ``logits``; plus ``total``
    and ``padded_vocab``."""
    if formula not in FORMULAS:
        raise ValueError(f"formula must be one of {FORMULAS}, got {formula!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    h, m = model.hidden_size, model.mtp_layers
    k = _k(model, formula)
    n_moe = sum(model.moe_layers) + (m if model.mtp_is_moe else 0)
    n_dense = model.num_dense_layers + (0 if model.mtp_is_moe else m)
    mlp = h * (
        k * model.ffn_hidden_size * n_dense
        + k * model.moe_ffn_hidden_size * model.top_k * n_moe
        + k * model.shared_ffn_hidden_size * n_moe
    )
    layers = list(zip(model.mixers, model.swa_layers)) + [("attention", bool(model.swa_layers[-1]))] * m
    attn = sum(sum(mixer_macs(model, x, seq_len, f, formula)) for x, f in layers)
    mtp = m * _mtp_proj_macs(model)
    v_pad = model.padded_vocab(tp)
    logits = h * v_pad * (m + 1)
    g = 6.0 / 1e9
    out = {"mlp": mlp * g, "attention": attn * g, "mtp": mtp * g, "logits": logits * g}
    out["total"] = sum(out.values())
    out["padded_vocab"] = v_pad
    return out


def flops_per_token(model: ModelSpec, seq_len: int, tp: int = 1, formula: str = "current") -> float:
    """Megatron-Bridge training FLOPs per token (forward + backward, model FLOPs)."""
    return flops_terms(model, seq_len, tp, formula)["total"] * 1e9


# ----------------------------------------------------------------------------------------------
# Per-layer costs and parameters


@dataclass(frozen=True)
class LayerCost:
    """One decoder layer (``kind='decoder'``) or MTP layer (``kind='mtp'``).

    FLOP fields are forward FLOPs per token (2 x multiply-adds); training is 3x forward (without
    recompute). ``mlp_expert`` counts the ``top_k`` routed experts one token visits. Parameter
    fields count weights (and biases) of this layer; ``expert_params`` is ONE routed expert.
    """

    index: int
    kind: str                   # "decoder" | "mtp"
    is_moe: bool
    swa: bool
    attn_proj: float            # the token mixer's projections: q/k/v/o (MLA: down/up projections, latent
                                # norms; DSA: the indexer's), Gated DeltaNet's or Mamba-2's in/out projections
    attn_core: float            # QK^T and AV with the causal (sliding-window, top-k) average context; the
                                # indexer's scores; the delta rule / SSD scan (linear in the sequence)
    mlp_dense: float            # dense MLP (0 on MoE layers)
    mlp_expert: float           # routed experts, top_k of them
    mlp_shared: float           # shared experts
    router: float               # router GEMM h x n_experts (not in Megatron's model FLOPs)
    mtp_proj: float             # MTP only: eh_proj (2h -> h) and its three norms
    attn_params: int
    mlp_dense_params: int
    expert_params: int          # one routed expert
    n_experts: int
    top_k: int                  # routed experts one token visits (0 on dense layers)
    shared_params: int
    norm_params: int
    router_params: int
    mtp_proj_params: int
    mixer: str = "attention"    # "attention" | "gdn" | "mamba" | "none" (planner.model.mixers)

    @property
    def flops(self) -> float:
        """Forward FLOPs/token as Megatron counts them (router excluded)."""
        return self.attn_proj + self.attn_core + self.mlp_dense + self.mlp_expert + self.mlp_shared + self.mtp_proj

    @property
    def flops_with_router(self) -> float:
        return self.flops + self.router

    @property
    def params(self) -> int:
        """All parameters of the layer (every expert)."""
        return (
            self.attn_params + self.mlp_dense_params + self.expert_params * self.n_experts + self.shared_params
            + self.norm_params + self.router_params + self.mtp_proj_params
        )

    @property
    def dense_params(self) -> int:
        """Parameters outside the routed experts (replicated over expert parallelism)."""
        return self.params - self.expert_params * self.n_experts

    @property
    def active_params(self) -> int:
        """Parameters one token touches: the layer's dense part and ``top_k`` routed experts."""
        return self.dense_params + self.expert_params * self.top_k


def mixer_params(model: ModelSpec, mixer: str) -> int:
    """Parameters of one layer's token mixer (its norm excluded)."""
    h = model.hidden_size
    if mixer == "gdn":
        return model.gdn.params(h)
    if mixer == "mamba":
        return model.mamba.params(h)
    if mixer == "none":
        return 0
    p = _attn_params(model)
    if model.attention_output_gate:
        p += h * model.num_attention_heads * model.head_dim
    if model.dsa is not None:
        p += model.dsa.params(h, model.q_lora_rank)
    return p


def _attn_params(model: ModelSpec) -> int:
    h, n_h = model.hidden_size, model.num_attention_heads
    if model.attention == "mla":
        d_n, d_r, d_v, kv_r = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim, model.kv_lora_rank
        if model.q_lora_rank:
            q = h * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * n_h * (d_n + d_r)
        else:
            q = h * n_h * (d_n + d_r)
        kv = h * (kv_r + d_r) + kv_r + kv_r * n_h * (d_n + d_v)
        return q + kv + n_h * d_v * h
    d, n_kv = model.head_dim, model.num_kv_heads
    p = h * (n_h * d + 2 * n_kv * d) + n_h * d * h
    if model.attention_bias:
        p += n_h * d + 2 * n_kv * d + h
    if model.qk_norm:
        p += 2 * d
    if model.attention_sinks:
        p += n_h
    return p


def _mlp_params(model: ModelSpec, width: int, bias: bool) -> int:
    h, k = model.hidden_size, model.mlp_matrices
    p = k * h * width
    if bias:
        p += (k - 1) * width + h
    return p


def layer_costs(model: ModelSpec, seq_len: int) -> list[LayerCost]:
    """Per decoder layer, then per MTP layer: forward FLOPs per token by term, and parameters.

    Summing ``3 * cost.flops`` over the list and adding ``3 * logits_flops(model)`` (one head per
    main model and MTP depth) gives ``flops_per_token(model, seq_len)`` exactly.
    """
    return list(_layer_costs(model, int(seq_len)))


@lru_cache(maxsize=256)
def _layer_costs(model: ModelSpec, seq_len: int) -> tuple[LayerCost, ...]:
    h = model.hidden_size
    expert_p = _mlp_params(model, model.moe_ffn_hidden_size, model.mlp_bias) if model.num_experts else 0
    shared_p = _mlp_params(model, model.shared_ffn_hidden_size, False) if model.shared_ffn_hidden_size else 0
    if shared_p and model.shared_expert_gate:
        shared_p += h                         # the shared expert's gate, Linear(h, 1)
    dense_p = _mlp_params(model, model.ffn_hidden_size, model.mlp_bias) if model.ffn_hidden_size else 0
    router_p = model.num_experts * h + (model.num_experts if model.router_bias else 0)
    k = model.mlp_matrices
    out: list[LayerCost] = []
    flags = [(i, "decoder", model.moe_layers[i], model.swa_layers[i], model.mixers[i], model.mlp_layers[i])
             for i in range(model.num_layers)]
    flags += [(j, "mtp", model.mtp_is_moe, bool(model.swa_layers[-1]), "attention", True)
              for j in range(model.mtp_layers)]
    for idx, kind, moe, swa, mixer, has_mlp in flags:
        proj, core = (2.0 * x for x in mixer_macs(model, mixer, seq_len, swa))
        dense = has_mlp and not moe
        out.append(
            LayerCost(
                index=idx,
                kind=kind,
                is_moe=moe,
                swa=swa,
                attn_proj=proj,
                attn_core=core,
                mlp_dense=2.0 * k * h * model.ffn_hidden_size if dense else 0.0,
                mlp_expert=2.0 * k * h * model.moe_ffn_hidden_size * model.top_k if moe else 0.0,
                mlp_shared=2.0 * k * h * model.shared_ffn_hidden_size if moe else 0.0,
                router=2.0 * h * model.num_experts if moe else 0.0,
                mtp_proj=2.0 * _mtp_proj_macs(model) if kind == "mtp" else 0.0,
                attn_params=mixer_params(model, mixer),
                mlp_dense_params=dense_p if dense else 0,
                expert_params=expert_p if moe else 0,
                n_experts=model.num_experts if moe else 0,
                top_k=model.top_k if moe else 0,
                shared_params=shared_p if moe else 0,
                norm_params=h * ((mixer != "none") + has_mlp),   # one norm per sub-block (Nemotron-H: one)
                router_params=router_p if moe else 0,
                mtp_proj_params=(2 * h * h + 2 * h) if kind == "mtp" else 0,  # eh_proj + enorm/hnorm
                mixer=mixer,
            )
        )
    return tuple(out)


def logits_flops(model: ModelSpec, tp: int = 1) -> float:
    """Forward FLOPs per token of ONE output head (h x padded vocab); Megatron runs one per main
    model and one per MTP depth."""
    return 2.0 * model.hidden_size * model.padded_vocab(tp)


# ----------------------------------------------------------------------------------------------
# Parameter counts


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts (unpadded vocabulary, as the HF checkpoint holds them).

    ``total`` and ``active`` count decoder layers, input embedding, output head (when untied) and
    final norm, MTP layers excluded: DeepSeek's convention ("671B total, 37B activated"), Meta's
    for Llama 4 (17B active) and Qwen's. ``active_without_embedding`` leaves out the input
    embedding, a table lookup that does no arithmetic per token: OpenAI's convention for
    gpt-oss (20b: 3.6B active). ``active_non_embedding`` leaves out the output head too (the
    "non-embedding" count of scaling-law papers; Zhipu's GLM-4.5 "32B active" matches it).
    Publishers differ, so all are shown (docs/models.md lists whose figure matches which). ``mtp`` is the MTP modules' share (each with its own norm; the
    embedding and head are shared with the main model); ``total_with_mtp`` adds it.
    """

    total: int
    active: int
    embedding: int          # input embedding
    output: int             # output head (0 when tied)
    decoder: int            # all decoder layers
    experts: int            # routed experts (all layers)
    dense: int              # total - experts
    mtp: int
    per_layer: tuple[int, ...] = field(default=())

    @property
    def total_with_mtp(self) -> int:
        return self.total + self.mtp

    @property
    def active_without_embedding(self) -> int:
        return self.active - self.embedding

    @property
    def active_non_embedding(self) -> int:
        return self.active - self.embedding - self.output


def param_counts(model: ModelSpec) -> ParamCounts:
    h = model.hidden_size
    costs = layer_costs(model, 4096)
    dec = [c for c in costs if c.kind == "decoder"]
    mtp = [c for c in costs if c.kind == "mtp"]
    emb = model.vocab_size * h
    out = 0 if model.tied_embeddings else model.vocab_size * h
    final_norm = h
    decoder = sum(c.params for c in dec)
    experts = sum(c.expert_params * c.n_experts for c in dec)
    active_dec = sum(c.active_params for c in dec)
    total = emb + out + final_norm + decoder
    active = emb + out + final_norm + active_dec
    mtp_p = sum(c.params + h for c in mtp)  # + the MTP block's final norm
    return ParamCounts(
        total=total,
        active=active,
        embedding=emb,
        output=out,
        decoder=decoder,
        experts=experts,
        dense=total - experts,
        mtp=mtp_p,
        per_layer=tuple(c.params for c in dec),
    )
