"""Per-GPU compute of one decoder layer for one micro-batch: GEMMs, attention core, elementwise work.

GEMM time (hardware.md s3 and s6.1)::

    t_gemm = 2 * M * N * K / (peak(precision) * eff),   eff = MAMF(gpu, precision) * k_stack(precision)
                                                              * d / (d + d_half) [* M_e / (M_e + m_half)]

``MAMF`` is the measured maximum achievable matmul fraction of the GPU (hardware.md s3), ``k_stack``
a stack parameter per precision, ``d = min(N, K)`` the thinnest dimension of the GEMM on one GPU (thin
GEMMs lose tile occupancy and arithmetic intensity) and, for grouped expert GEMMs, ``M_e`` the tokens
per expert (the small-M penalty). Backward costs twice the forward (dgrad + wgrad).

Attention core (flash attention, always BF16)::

    FLOPs_fwd = 2 * mbs * s/cp * n_h/tp * (d_qk + d_v) * ctx,   ctx = s/2 (causal) or c_W (window)
    t = FLOPs / (bf16_peak * attn_eff); backward = 2.5 x forward (five matmuls against two)

Elementwise and quantisation work runs at HBM bandwidth::

    t = bytes / (hbm_bw * hbm_eff),  bytes = 2 * elements * mem.elementwise (+ quantisation bytes * mem.quant)

Every per-token figure is divided over the GPUs that share the token: tp (sequence parallel) and cp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

# Maximum achievable matmul FLOPS / dense peak, hardware.md s3 ([stas-acc] MAMF table).
# gb300 has no MAMF row: the B300 figures (same Blackwell Ultra die) are used. NVFP4: B200 MAMF
# 6624 of 10000 TFLOP/s (Stas Bekman, hardware.md s3), applied to every Blackwell part.
MAMF = {
    "h100": {"bf16": 0.803, "fp8": 0.709},
    "h800": {"bf16": 0.803, "fp8": 0.709},
    "h200": {"bf16": 0.803, "fp8": 0.734},
    "b200": {"bf16": 0.776, "fp8": 0.763, "fp4": 0.662},
    "b300": {"bf16": 0.786, "fp8": 0.745, "fp4": 0.662},
    "gb200": {"bf16": 0.729, "fp8": 0.723, "fp4": 0.662},
    "gb300": {"bf16": 0.786, "fp8": 0.745, "fp4": 0.662},
}
_PEAK_KIND = {"bf16": "bf16", "fp8": "fp8", "fp8-block": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
_STACK_KEY = {"bf16": "gemm.bf16", "fp8": "gemm.fp8", "fp8-block": "gemm.mxfp8", "mxfp8": "gemm.mxfp8",
              "nvfp4": "gemm.nvfp4"}
# Bytes moved per quantised element (read BF16, write row-wise and column-wise low-precision copies).
ATTN_TILE = 128  # key-block width of fused attention kernels (FlashAttention / cuDNN: 64-128)
_QUANT_BYTES = {"bf16": 0.0, "fp8": 3.0, "fp8-block": 4.0, "mxfp8": 4.0, "nvfp4": 3.5}


def mamf(gpu_name: str, precision: str) -> float:
    """Measured achievable matmul fraction of the dense peak for this GPU and precision."""
    table = MAMF.get(gpu_name, MAMF["b200"])
    kind = _PEAK_KIND[precision]
    return table.get(kind, table["fp8"])


def stack_key(precision: str) -> str:
    return _STACK_KEY[precision]


def quant_bytes_per_element(precision: str) -> float:
    return _QUANT_BYTES[precision]


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a layer on one GPU for one micro-batch (forward)."""

    module: str            # attn_proj | mla_up_proj | mlp | expert | shared | router | logits | mtp_proj
    m: float               # rows (tokens)
    n: float               # output columns on this GPU
    k: float               # reduction dimension on this GPU
    low_precision: bool    # runs at the training precision (else BF16)
    grouped_m: float | None = None  # tokens per expert for grouped expert GEMMs

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class LayerWork:
    """What one layer costs one GPU per micro-batch, before efficiencies are applied."""

    gemms: tuple[Gemm, ...]
    attn_flops: float              # attention core, forward
    elem_elements: float           # elementwise elements touched, forward
    elem_by_module: dict = field(default_factory=dict)  # module -> elements (forward), for recompute
    quant_elements: float = 0.0    # elements quantised (forward + backward inputs)
    # (peaks, efficiencies, halves) -> (GEMM seconds by module, their sum): the memo lives and dies
    # with the work (``_gemm_by_module``); not part of the value
    gemm_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)


def shape_eff(dim: float, dim_half: float) -> float:
    """Thin-GEMM efficiency: d / (d + d_half)."""
    return dim / (dim + dim_half)


def gemm_time(g: Gemm, peak_lp: float, peak_bf16: float, eff_lp: float, eff_bf16: float,
              dim_half: float, m_half: float) -> float:
    """Forward seconds of one GEMM: FLOPs / (peak * eff * shape factors). Peaks in FLOP/s."""
    # g.flops and shape_eff inlined (the same operations in the same order: bit-identical)
    if g.low_precision:
        peak, eff = peak_lp, eff_lp
    else:
        peak, eff = peak_bf16, eff_bf16
    m, n, k = g.m, g.n, g.k
    d = min(n, k, m)
    e = eff * (d / (d + dim_half))
    gm = g.grouped_m
    if gm is not None:
        e *= gm / (gm + m_half)
    return 2.0 * m * n * k / (peak * e)


_GEMM_MEMO_MAX = 4096


def _gemm_by_module(work: LayerWork, peak_lp: float, peak_bf16: float, eff_lp: float, eff_bf16: float,
                    dim_half: float, m_half: float) -> tuple[dict, float]:
    """Forward GEMM seconds of a layer per module, and their sum (memoised on the work object)."""
    key = (peak_lp, peak_bf16, eff_lp, eff_bf16, dim_half, m_half)
    memo = work.gemm_memo
    hit = memo.get(key)
    if hit is not None:
        return hit
    by_mod: dict[str, float] = {}
    for g in work.gemms:
        by_mod[g.module] = by_mod.get(g.module, 0.0) + gemm_time(g, peak_lp, peak_bf16, eff_lp, eff_bf16,
                                                                dim_half, m_half)
    total = sum(by_mod.values())
    if len(memo) >= _GEMM_MEMO_MAX:  # a calibration fit tries many efficiencies on one work
        memo.clear()
    memo[key] = (by_mod, total)
    return by_mod, total


def causal_context(seq_len: int, window: int | None) -> float:
    """Average keys a query attends to: s/2 for a causal layer, c_W = W - W(W-1)/(2s) under a window."""
    if window is None or window >= seq_len:
        return seq_len / 2.0
    return window - window * (window - 1) / (2.0 * seq_len)


# Activations Megatron runs as one fused kernel (bias_swiglu / bias_geglu fusions): read the
# 2F (gated) or F inputs, write F. Other activations run as separate PyTorch ops; GPT-OSS's clamped
# GLU, out = (clamp(x_lin, -7, 7) + 1) * g * sigmoid(1.702 g) with g = clamp(x_glu, max=7), is seven
# elementwise kernels (2 clamps, scale, sigmoid, 2 multiplies, add) touching about 16F elements.
FUSED_ACTIVATIONS = ("silu", "swiglu", "gelu", "geglu", "relu")
UNFUSED_GLU_ELEMENTS = 16.0


def activation_elements(model, width: float) -> float:
    """Elements one token's MLP activation reads and writes (forward) for an MLP of ``width``."""
    if model.activation in FUSED_ACTIVATIONS:
        return (3.0 if model.gated_mlp else 2.0) * width
    return (UNFUSED_GLU_ELEMENTS if model.gated_mlp else 6.0) * width


def attention_head_factor(head_dim: float, half: float = 32.0) -> float:
    """Fused-attention efficiency by head width, normalised to 1 at d = 128: ``(d/(d+half)) / (128/(128+half))``.

    Smaller heads do less matmul work per softmax element and per tile load; FlashAttention-2 reports
    head dim 64 at about 80% of the head-dim-128 throughput (Dao 2023, fig. 4-6), which ``half = 32``
    reproduces (0.8).
    """
    return (head_dim / (head_dim + half)) / (128.0 / (128.0 + half))


def _attention_work(model, swa: bool, seq_len: int, mbs: int, tp: int, cp: int, lp: bool, gemms: list,
                    elem: dict) -> float:
    """Softmax attention's GEMMs (appended to ``gemms``) and elementwise elements (into ``elem``); returns
    the attention-core FLOPs (forward). DSA: the core reads the top-k keys and the lightning indexer adds
    its projections (duplicated over TP, assumed) and its O(s^2) scores at its width."""
    h = model.hidden_size
    T = mbs * seq_len / cp
    nh = model.num_attention_heads
    if model.attention == "mla":
        dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        qr, kvr = model.q_lora_rank, model.kv_lora_rank
        if qr:
            gemms.append(Gemm("attn_proj", T, qr, h, lp))                     # q down (duplicated)
            gemms.append(Gemm("mla_up_proj", T, nh * (dn + dr) / tp, qr, lp))  # q up
        else:
            gemms.append(Gemm("attn_proj", T, nh * (dn + dr) / tp, h, lp))
        gemms.append(Gemm("attn_proj", T, kvr + dr, h, lp))                     # kv down + rope k (dup)
        gemms.append(Gemm("mla_up_proj", T, nh * (dn + dv) / tp, kvr, lp))     # kv up
        gemms.append(Gemm("attn_proj", T, h, nh * dv / tp, lp))                # out
        d_qk, d_v = dn + dr, dv
        qkv_elems = (nh * (dn + dr) * 2 + nh * dv + (qr or 0) + kvr) / tp
        up_elems = (nh * (dn + dr) + nh * (dn + dv)) / tp
        elem["mla_up_proj"] = T * up_elems
    else:
        d = model.head_dim
        nkv = model.num_kv_heads
        gate = nh if model.attention_output_gate else 0     # Qwen3-Next: q_proj also gives the output gate
        gemms.append(Gemm("attn_proj", T, (nh + gate + 2 * nkv) * d / tp, h, lp))
        gemms.append(Gemm("attn_proj", T, h, nh * d / tp, lp))
        d_qk = d_v = d
        qkv_elems = 4 * (nh + gate + 2 * nkv) * d / tp
    window = model.dsa.topk if model.dsa is not None else (model.sliding_window if swa else None)
    ctx = causal_context(seq_len, window)
    if window and window < seq_len:
        ctx = min(seq_len / 2.0, ctx + ATTN_TILE / 2.0)   # partial key tiles at the window edge
    # the head-width efficiency is folded into the work so that attn.eff stays one number
    attn_flops = (2.0 * mbs * seq_len / cp * (nh / tp) * (d_qk + d_v) * ctx
                  / attention_head_factor((d_qk + d_v) / 2.0))
    if model.dsa is not None:
        ix = model.dsa
        gemms.append(Gemm("attn_proj", T, ix.n_heads * ix.head_dim, model.q_lora_rank, lp))   # wq_b
        gemms.append(Gemm("attn_proj", T, ix.head_dim + ix.n_heads, h, lp))                   # wk, weights
        attn_flops += 2.0 * mbs * seq_len / cp * ix.score_macs(causal_context(seq_len, None))
        qkv_elems += ix.n_heads * ix.head_dim + ix.topk                   # indexer q, top-k indices
    elem["attn"] = T * qkv_elems
    return attn_flops


def _recurrent_work(model, mixer: str, seq_len: int, mbs: int, tp: int, cp: int, lp: bool, gemms: list,
                    elem: dict) -> float:
    """Gated DeltaNet or Mamba-2: in/out projections (heads split over TP, megatron-core), the causal
    convolution and gates as elementwise work, and the chunked scan (linear in the sequence,
    ``planner.model.mixers``) priced as attention-core FLOPs (a fused chunked kernel, BF16)."""
    h = model.hidden_size
    T = mbs * seq_len / cp
    m = model.gdn if mixer == "gdn" else model.mamba
    inner = m.value_dim if mixer == "gdn" else m.inner
    gemms.append(Gemm("attn_proj", T, m.in_width / tp, h, lp))
    gemms.append(Gemm("attn_proj", T, h, inner / tp, lp))
    # conv input/output, gates and the gated norm: about 4 passes over the conv channels and the output
    elem["attn"] = T * (4 * m.conv_dim + 4 * inner) / tp
    return 2.0 * T * m.core_macs() / tp


def _mlp_work(model, kind: str, seq_len: int, mbs: int, tp: int, cp: int, ep: int, etp: int, lp: bool,
              gemms: list, elem: dict) -> None:
    """The layer's MoE block or dense MLP ('none': an MLP-free Nemotron-H block)."""
    h = model.hidden_size
    T = mbs * seq_len / cp
    Tsp = T / tp
    kin = 2 if model.gated_mlp else 1
    if kind == "moe":
        E, k, F = model.num_experts, model.top_k, model.moe_ffn_hidden_size
        m_e = mbs * seq_len * k * ep * etp / (E * cp * tp)
        local = E / ep
        gemms.append(Gemm("router", Tsp, E, h, False))
        gemms.append(Gemm("expert", m_e * local, kin * F / etp, h, lp, grouped_m=m_e))
        gemms.append(Gemm("expert", m_e * local, h, F / etp, lp, grouped_m=m_e))
        routed = m_e * local        # token-expert pairs on this GPU
        elem["moe_act"] = routed * activation_elements(model, F / etp)
        elem["moe_permute"] = 4 * h * (Tsp + routed)
        elem["router"] = Tsp * 6 * E
        if model.shared_ffn_hidden_size:
            Fs = model.shared_ffn_hidden_size
            gemms.append(Gemm("shared", T, kin * Fs / tp, h, lp))
            gemms.append(Gemm("shared", T, h, Fs / tp, lp))
            elem["shared_experts"] = T * activation_elements(model, Fs / tp)
    elif kind == "dense":
        F = model.ffn_hidden_size
        gemms.append(Gemm("mlp", T, kin * F / tp, h, lp))
        gemms.append(Gemm("mlp", T, h, F / tp, lp))
        elem["mlp"] = T * activation_elements(model, F / tp)


@lru_cache(maxsize=4096)
def layer_work(model, kind: str, swa: bool, seq_len: int, mbs: int, tp: int, cp: int, ep: int, etp: int,
               low_precision: bool, mixer: str = "attention") -> LayerWork:
    """GEMMs, attention-core FLOPs and elementwise elements of one layer per GPU: its MLP ``kind``
    ('dense' | 'moe' | 'none') and its token ``mixer`` ('attention' | 'gdn' | 'mamba' | 'none')."""
    h = model.hidden_size
    Tsp = mbs * seq_len / cp / tp    # tokens per GPU in the sequence-parallel regions
    gemms: list[Gemm] = []
    elem: dict[str, float] = {}
    if mixer == "attention":
        attn_flops = _attention_work(model, swa, seq_len, mbs, tp, cp, low_precision, gemms, elem)
    elif mixer in ("gdn", "mamba"):
        attn_flops = _recurrent_work(model, mixer, seq_len, mbs, tp, cp, low_precision, gemms, elem)
    else:
        attn_flops = 0.0
    subs = (mixer != "none") + (kind != "none")      # sub-blocks, each with its norm and residual add
    elem["layernorm"] = Tsp * 2 * h * subs
    elem["residual"] = Tsp * 3 * h * subs
    _mlp_work(model, kind, seq_len, mbs, tp, cp, ep, etp, low_precision, gemms, elem)
    quant = 0.0
    if low_precision:
        for g in gemms:
            if g.low_precision:
                quant += g.m * (g.k + g.n)   # forward input and backward output-gradient
    return LayerWork(tuple(gemms), attn_flops, sum(elem.values()), elem, quant)


@lru_cache(maxsize=1024)
def head_work(model, seq_len: int, mbs: int, tp: int, cp: int, mtp: bool) -> LayerWork:
    """The output head on the last stage (logits GEMM in BF16, cross entropy) or, with ``mtp``, the
    MTP block's extra work besides its transformer layer (eh_proj, norms, its own logits)."""
    h = model.hidden_size
    T = mbs * seq_len / cp
    V = model.padded_vocab(tp)
    gemms = [Gemm("logits", T, V / tp, h, False)]
    elem = {"loss": T * V / tp * 4}                      # logits write, softmax read/write, grad (bf16 units)
    if mtp:
        gemms.append(Gemm("mtp_proj", T, h / tp, 2 * h, False))
        elem["layernorm"] = T / tp * 6 * h
    return LayerWork(tuple(gemms), 0.0, sum(elem.values()), elem, 0.0)


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer for one micro-batch on one GPU (forward + backward, with recompute)."""

    fwd: float
    bwd: float
    expert: float          # the routed-expert part of fwd + bwd (scaled by expert load balance)
    attn_core: float       # attention core fwd + bwd (the window that hides CP exchange)
    recompute: float       # extra forward work in the backward pass
    gemm_fwd: float = 0.0  # forward GEMM seconds (the compute TP collectives can hide behind)

    @property
    def total(self) -> float:
        return self.fwd + self.bwd


def layer_time(work: LayerWork, *, peak_lp: float, peak_bf16: float, eff_lp: float, eff_bf16: float,
               dim_half: float, m_half: float, attn_eff: float, hbm_bps: float, elem_factor: float,
               quant_factor: float, quant_bytes: float, recompute: tuple[str, ...] | str = ()) -> LayerTime:
    """Forward, backward and recompute seconds of a layer from its work and the efficiencies."""
    by_mod, gemm_f = _gemm_by_module(work, peak_lp, peak_bf16, eff_lp, eff_bf16, dim_half, m_half)
    attn_f = work.attn_flops / (peak_bf16 * attn_eff) if work.attn_flops else 0.0
    elem_s = 2.0 * elem_factor / hbm_bps            # seconds per element (bf16)
    elem_f = work.elem_elements * elem_s
    quant = work.quant_elements * quant_bytes * quant_factor / hbm_bps
    fwd = gemm_f + attn_f + elem_f + quant * 0.5
    bwd = 2.0 * gemm_f + 2.5 * attn_f + 2.0 * elem_f + quant * 0.5
    em = work.elem_by_module
    expert_f = by_mod.get("expert", 0.0) + (em.get("moe_act", 0.0) + em.get("moe_permute", 0.0)) * elem_s
    rc = 0.0
    if recompute == "full":
        rc = fwd
    elif recompute:
        for mod in recompute:
            if mod == "core_attn":
                rc += attn_f
            elif mod == "mla_up_proj":
                rc += by_mod.get("mla_up_proj", 0.0) + em.get("mla_up_proj", 0.0) * elem_s
            elif mod == "mlp":
                rc += by_mod.get("mlp", 0.0) + em.get("mlp", 0.0) * elem_s
            elif mod == "moe":
                rc += expert_f + by_mod.get("router", 0.0)
            elif mod == "moe_act":
                rc += em.get("moe_act", 0.0) * elem_s
            elif mod == "layernorm":
                rc += em.get("layernorm", 0.0) * elem_s
            elif mod == "shared_experts":
                rc += by_mod.get("shared", 0.0) + em.get("shared_experts", 0.0) * elem_s
    return LayerTime(fwd=fwd, bwd=bwd + rc, expert=3.0 * expert_f, attn_core=3.5 * attn_f, recompute=rc,
                     gemm_fwd=gemm_f)
