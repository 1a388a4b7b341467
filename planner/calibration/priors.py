"""Where a fit starts: each fitted parameter's prior, bounds and source (``PRIORS``, ``VARIANTS``),
the profile of a stack at its priors (``prior_profile``, ``base_profile``), and the start of a stack
topoplan has not seen (``nearest_profile``, ``start_profile``). ``planner.calibration.calibrate``
fits from here; ``planner.calibration.runs`` reads a new stack's FLOP convention here."""

from __future__ import annotations

import yaml

from planner.cost.profiles import PROFILE_DIR, Param, Profile, _version, available, load_profile
from planner.trainers import DEFAULT

# name: (prior, min, max, fit, spread, source)
PRIORS: dict[str, tuple] = {
    "gemm.bf16": (1.0, 0.5, 1.3, True, 1.3,
                  "multiplier on the BF16 MAMF fraction (hardware.md s3: H100 80.3%, B200 77.6%, B300 78.6%, GB200 72.9%); prior 1 = the measured MAMF"),
    "gemm.fp8": (1.0, 0.5, 1.3, True, 1.3,
                 "multiplier on the FP8 MAMF fraction (hardware.md s3: H100 70.9%, B200 76.3%, B300 74.5%, GB200 72.3%); prior 1"),
    "gemm.mxfp8": (1.0, 0.5, 1.3, True, 1.3,
                   "multiplier on the FP8 MAMF fraction for block-scaled FP8 (MXFP8, FP8 blockwise); prior 1 (hardware.md s3)"),
    "gemm.nvfp4": (1.0, 0.4, 1.3, True, 1.3,
                   "multiplier on the NVFP4 MAMF fraction (B200 6624 of 10000 TFLOP/s, hardware.md s3); prior 1"),
    "gemm.dim_half": (128.0, 16.0, 2048.0, True, 3.0,
                      "prior: one 128-wide tensor-core tile (CUTLASS/cuBLAS Hopper and Blackwell tiles are 128 or 256 wide): a GEMM this thin runs at half speed"),
    "gemm.grouped_m_half": (128.0, 8.0, 8192.0, True, 3.0,
                            "prior: one 128-row tile per expert; grouped GEMMs waste the partial last tile of every expert (DeepGEMM contiguous layout pads M to 128, hardware.md s3)"),
    "attn.eff": (0.5, 0.2, 0.9, True, 1.5,
                 "prior: fused attention forward+backward at half the BF16 peak (FlashAttention-3 forward 75% of H100 BF16 peak, backward about 1.5-2x slower)"),
    "mem.elementwise": (1.0, 0.25, 6.0, True, 2.0,
                        "multiplier on the counted elementwise HBM traffic (norms, residuals, activations, RoPE, permutation); prior 1 = unfused kernels each reading and writing once"),
    "mem.elementwise_eager": (2.0, 0.25, 8.0, True, 2.0,
                              "multiplier on the counted elementwise HBM traffic for rows run eagerly (Training.cuda_graphs=False, CSV column cuda_graphs=false: no CUDA graph capture, no fused ops, so every op is its own kernel with a launch gap); prior 2 = twice the fused traffic"),
    "mem.quant": (1.0, 0.1, 6.0, True, 2.0,
                  "multiplier on the counted quantisation traffic (read BF16, write FP8/FP4 row- and column-wise); prior 1"),
    "mem.hbm_eff": (0.85, 0.5, 1.0, False, 1.2,
                    "achievable fraction of HBM bandwidth for streaming kernels (assumption: 85%, typical of copy kernels on H100/B200)"),
    "tp.overlap": (0.5, 0.0, 0.98, True, 0.5,
                   "prior 0.5: Megatron --tp-comm-overlap hides part of the SP all-gather/reduce-scatter behind the GEMMs"),
    "ep.overlap": (0.5, 0.0, 0.98, True, 0.5,
                   "prior 0.5: Megatron overlap of the EP all-to-all with the other micro-batch (overlap_moe_expert_parallel_comm) and the shared expert"),
    "cp.overlap": (0.8, 0.0, 0.98, True, 0.5,
                   "prior 0.8: Megatron p2p context parallelism overlaps each ring step with the attention of the previous chunk"),
    "dp.overlap": (0.8, 0.0, 0.98, True, 0.5,
                   "prior 0.8: Megatron --overlap-grad-reduce / --overlap-param-gather in buckets"),
    "pp.overlap": (0.8, 0.0, 0.98, True, 0.5,
                   "prior 0.8: Megatron --overlap-p2p-comm with the interleaved schedule"),
    "ep.dispatch_bytes_fp8": (1.0, 0.0, 1.0, False, 1.0,
                              "1 = tokens dispatched in FP8 for FP8/MXFP8/NVFP4 runs (DeepEP/HybridEP FP8 dispatch, BF16 combine; hardware.md s2.3)"),
    "gpu.speed": (1.0, 0.5, 1.5, False, 1.3,
                  "1 = the GPU sustains its MAMF clocks; see the @arch variants"),
    "net.bw": (1.0, 0.3, 1.5, False, 1.5,
               "1 = the fabric model's scale-out bandwidth (0.74 of line rate, hardware.md s2.2); see the @arch variants"),
    "dp.grad_bytes": (2.0, 2.0, 4.0, False, 2.0,
                      "bytes per gradient in the data-parallel reduce-scatter: 2 = BF16 (Megatron-Bridge perf recipes set ddp.grad_reduce_in_fp32=False for DeepSeek-V3, Qwen3, GPT-OSS), 4 = FP32"),
    "host.launch_us": (25.0, 10.0, 100.0, True, 1.5,
                       "host seconds per launched kernel (terms/host.py: the host floor and the dropless router's sync); prior 25 us: PyTorch adds 20-30 us of host overhead per call unless it is overlapped (hardware.md s2.4)"),
    "other.layer_us": (25.0, 0.0, 500.0, False, 2.0,
                       "host and launch overhead not hidden per layer and micro-batch: PyTorch adds 20-30 us per call unless overlapped (hardware.md s2.4)"),
}
# Generation- and precision-specific variants a fresh profile carries (name@qualifier).
VARIANTS: dict[str, tuple] = {
    "gpu.speed@hopper": (1.0, 0.5, 1.5, True, 1.3,
                         "Hopper sustained speed relative to its MAMF benchmark (H100 SXM 700 W); prior 1"),
    "gpu.speed@blackwell": (1.0, 0.5, 1.5, True, 1.3,
                            "Blackwell (B200 1000 W, GB200 1200 W) sustained speed relative to MAMF; prior 1"),
    "gpu.speed@blackwell-ultra": (1.0, 0.5, 1.5, True, 1.3,
                                  "Blackwell Ultra (B300, GB300 1400 W) sustained speed relative to MAMF; prior 1"),
    "net.bw@hopper": (1.0, 0.3, 1.5, True, 1.5,
                      "achieved/modelled scale-out bandwidth, 400G CX7 (0.74 of line rate measured on 4x8 B200, hardware.md s2.2); prior 1"),
    "net.bw@blackwell": (1.0, 0.3, 1.5, True, 1.5,
                         "achieved/modelled scale-out bandwidth, 400G CX7 on B200/GB200 (hardware.md s2.2 measured 0.74 of line rate); prior 1"),
    "net.bw@blackwell-ultra": (1.0, 0.3, 1.5, True, 1.5,
                               "achieved/modelled scale-out bandwidth, 800G CX8 on B300/GB300: not measured (hardware.md s6.2 assumes 0.74 of line rate); prior 1"),
    "gemm.nvfp4@blackwell-ultra": (1.0, 0.4, 1.3, True, 1.3,
                                   "multiplier on the NVFP4 MAMF fraction on Blackwell Ultra, whose 15 PFLOP/s dense FP4 peak (hardware.md s1) has no MAMF measurement; prior 1 = the B200 fraction"),
    "attn.eff@blackwell-ultra": (0.6, 0.2, 0.95, True, 1.5,
                                 "prior 0.6: Blackwell Ultra doubles the SFU exponent rate that bounds attention softmax (NVIDIA Blackwell Ultra announcement), so attention runs closer to the matmul rate"),
}

def prior_profile(name: str, description: str = "", flops_formula: str = "current", dispatcher: str = "alltoall",
                  trainer: str = DEFAULT, overrides: dict | None = None) -> Profile:
    """A profile whose parameters all sit at their priors (optionally some fixed to other values)."""
    params = {}
    for n, (prior, lo, hi, fit, _spread, src) in list(PRIORS.items()) + list(VARIANTS.items()):
        params[n] = Param(value=prior, min=lo, max=hi, prior=prior, fit=fit, source=src)
    for key, spec in (overrides or {}).items():
        params[key] = Param(**spec)
    return Profile(name=name, description=description, trainer=trainer, flops_formula=flops_formula,
                   dispatcher=dispatcher, params=params)


def base_profile(stack: str) -> Profile:
    """A fresh profile for ``stack`` at its priors, keeping a shipped profile's conventions (FLOP
    formula, dispatcher, trainer, description) when one of that name exists."""
    path = PROFILE_DIR / f"{stack}.yaml"
    if not path.exists():
        return prior_profile(stack)
    # A shipped profile of that name gives the conventions and each parameter's prior, bounds, fit flag
    # and source (its values are not used: the fit starts from the priors); unknown keys are skipped.
    doc = yaml.safe_load(path.read_text()) or {}
    overrides = {}
    for key, spec in (doc.get("params") or {}).items():
        # a generation variant of a known parameter counts too (host.launch_us@hopper, set by bench/hopper.py)
        if (key in PRIORS or key in VARIANTS or key.partition("@")[0] in PRIORS) and isinstance(spec, dict) \
                and "prior" in spec:
            prior = float(spec["prior"])
            overrides[key] = dict(value=prior, min=float(spec["min"]), max=float(spec["max"]), prior=prior,
                                  fit=bool(spec.get("fit", True)), source=str(spec["source"]))
    return prior_profile(stack, doc.get("description", ""), doc.get("flops_formula", "current"),
                         doc.get("dispatcher", "alltoall"), doc.get("trainer", DEFAULT), overrides)


def nearest_profile(trainer: str, exclude: tuple[str, ...] = ()) -> str | None:
    """The shipped profile a stack of ``trainer`` topoplan has not seen starts from: the newest of that
    trainer (Megatron by container release, ``megatron-26.08`` before ``megatron-26.04``), else None."""
    names = [n for n in available() if n not in exclude and load_profile(n).trainer == trainer]
    return max(names, key=lambda n: (_version(n) or (0, 0), n)) if names else None


def start_profile(stack: str, start: Profile) -> Profile:
    """A profile for ``stack`` whose priors are another stack's values (``calibrate --from``, issue 13):
    a stack topoplan has not seen starts from the nearest one it knows instead of the published priors;
    bounds, fit flags and sources stay, the FLOP convention and dispatcher are ``stack``'s own
    (``base_profile``: the priors' for a name no profile describes)."""
    own = base_profile(stack)
    params = {k: p.model_copy(update={"prior": p.value, "source": f"{p.source} (prior: {start.name}'s value)"})
              for k, p in start.params.items()}
    return own.model_copy(update={"params": params, "trainer": start.trainer,
                                  "description": own.description or f"started from {start.name}"})
