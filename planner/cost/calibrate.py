"""Fit a stack profile to measured rows: least squares on log error, with bounds and priors.

``calibrate(rows, stack)`` starts every fitted parameter at its prior (``PRIORS``, each with its
source), and minimises::

    sum_rows (log(pred_i / measured_i))^2  +  w^2 * sum_params (log(p / prior) / log(spread))^2

with ``scipy.optimize.least_squares`` inside each parameter's bounds. The prior term keeps a
parameter the rows say little about at its published value instead of letting it absorb noise;
``w`` (``PRIOR_WEIGHT``) is small enough that the rows dominate where they are informative.
"""

from __future__ import annotations

import math

import numpy as np
import yaml
from scipy.optimize import least_squares

from planner.cost.predict import predict
from planner.cost.profiles import ARCHS, PROFILE_DIR, Param, Profile, _version, available, load_profile
from planner.cost.validate import refusal, resolve_case, row_case
from planner.errors import InputError
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
PRIOR_WEIGHT = 0.05
DIFF_STEP = 1e-3
LOSS = "soft_l1"  # robust: a row whose recipe differs from the stack's usual one cannot drag the profile
F_SCALE = 0.03  # residual scale (weighted log error) beyond which the loss grows linearly
ROW_SIGMA = 0.05  # a row's log error the model leaves (the shipped profiles explain their own rows to 4-6%)
MIN_REDUCTION = 1 - 1 / math.sqrt(2)  # fit a parameter when the rows tell at least as much as its prior


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


def _spread(key: str) -> float:
    spec = PRIORS.get(key) or VARIANTS.get(key) or PRIORS.get(key.partition("@")[0])
    return spec[4] if spec else 1.5


def _is_log(p: Param) -> bool:
    return p.min > 0


class _Problem:
    """The fitted parameters of ``base`` in the fitted scale (log for positive bounds) and the rows'
    log errors as a function of them: what ``fit_profile`` and ``informed_params`` share."""

    def __init__(self, cases: list, base: Profile):
        self.cases, self.base = cases, base
        self.keys = [k for k, p in base.params.items() if p.fit]
        ps = [base.params[k] for k in self.keys]
        self.logk = [_is_log(p) for p in ps]
        self.lo = self.to_u([p.min for p in ps])
        self.hi = self.to_u([p.max for p in ps])
        self.u_prior = self.to_u([p.prior if p.prior is not None else p.value for p in ps])
        self.u0 = np.clip(self.u_prior, self.lo + 1e-9, self.hi - 1e-9)
        self.sigma = np.array([math.log(_spread(k)) if lg else _spread(k) for k, lg in zip(self.keys, self.logk)])

    def to_u(self, vals):
        return np.array([math.log(v) if lg else v for v, lg in zip(vals, self.logk)])

    def to_v(self, u):
        return [math.exp(x) if lg else float(x) for x, lg in zip(u, self.logk)]

    def row_errors(self, u):
        prof = self.base.with_values(dict(zip(self.keys, self.to_v(u))))
        return np.array([math.log(max(predict(c.model, c.cluster, c.config, c.training, profile=prof).tflops_per_gpu,
                                      1e-6) / c.measured_tflops) for c in self.cases])

    def reduction(self) -> np.ndarray:
        return posterior_reduction(self.row_errors, self.u0, self.hi, self.sigma) if self.keys else np.zeros(0)


def informed_params(cases: list, base: Profile) -> list[str]:
    """The fitted parameters of ``base`` whose ``posterior_reduction`` on ``cases`` reaches ``MIN_REDUCTION``."""
    pb = _Problem(cases, base)
    return [k for k, r in zip(pb.keys, pb.reduction()) if r >= MIN_REDUCTION]


def fit_profile(cases: list, base: Profile, *, progress=None, max_nfev: int = 60, identify: bool = False):
    """Least-squares fit of ``base``'s fitted parameters to ``cases`` (``planner.cost.validate.Case``,
    recompute resolved, measured TFLOP/s set). Returns (profile, result info); ``identify``: fit only
    the parameters whose ``posterior_reduction`` reaches ``MIN_REDUCTION`` (info: informed, fitted, kept)."""
    pb = _Problem(cases, base)
    keys = pb.keys
    w_rows = 1.0 / math.sqrt(max(len(cases), 1))
    info: dict = {}
    reduction = pb.reduction()
    informed = [i for i in range(len(keys)) if reduction[i] >= MIN_REDUCTION]
    free = informed if identify else list(range(len(keys)))
    info["informed"] = [keys[i] for i in informed]
    info["fitted"] = [keys[i] for i in free]
    info["kept"] = [k for i, k in enumerate(keys) if i not in free]
    info["reduction"] = {k: round(float(r), 3) for k, r in zip(keys, reduction)}
    if not free:
        return base, {**info, "cost": 0.0, "nfev": 0, "status": 0}
    u_all = pb.u0.copy()

    def residuals(uf):
        u = u_all.copy()
        u[free] = uf
        out = list(w_rows * pb.row_errors(u))
        out += [PRIOR_WEIGHT * (u[i] - pb.u_prior[i]) / pb.sigma[i] for i in free]
        if progress is not None:
            progress.advance()
        return np.array(out)

    res = least_squares(residuals, pb.u0[free], bounds=(pb.lo[free], pb.hi[free]), method="trf", x_scale="jac",
                        diff_step=DIFF_STEP, loss=LOSS, f_scale=F_SCALE, max_nfev=max_nfev, xtol=1e-10, ftol=1e-10,
                        gtol=1e-10)
    vals = dict(zip([keys[i] for i in free], pb.to_v(res.x)))
    vals = {k: float(f"{v:.4g}") for k, v in vals.items()}
    return base.with_values(vals), {**info, "cost": float(res.cost), "nfev": int(res.nfev), "status": int(res.status)}


def per_generation(base: Profile, cases: list) -> tuple[Profile, list[str]]:
    """``base`` with every shared parameter the rows inform fitted per GPU generation instead
    (``name@arch`` for each generation of the rows, starting at the shared value; the shared value,
    which the other generations use, stays), and the variants of generations the rows lack held.
    Rows of every generation change nothing. Returns (profile, the keys made per generation)."""
    arches = sorted({c.cluster.gpu_spec.arch for c in cases})
    if set(arches) >= set(ARCHS):
        return base, []
    shared = [k for k in informed_params(cases, base) if "@" not in k]
    params = dict(base.params)
    for k in shared:
        p = params[k]
        for a in arches:
            params.setdefault(f"{k}@{a}", p.model_copy(update={"source": f"{p.source} [{a} only: fitted per generation "
                                                                        "by calibrate; other generations keep the shared value]"}))
        params[k] = p.model_copy(update={"fit": False})
    for k, p in params.items():
        qual = k.partition("@")[2]
        if qual in ARCHS and qual not in arches and p.fit:
            params[k] = p.model_copy(update={"fit": False})
    return base.model_copy(update={"params": params}), shared


def posterior_reduction(row_errors, u0, hi, sigma) -> np.ndarray:
    """For each parameter, the fraction by which the rows shrink its standard deviation under the
    prior: the Gauss-Newton posterior of the linearised model at the start, with the prior's spread
    ``sigma`` (per parameter, in the fitted scale) and a row error of ``ROW_SIGMA``::

        C = (J^T J / ROW_SIGMA^2 + diag(1 / sigma^2))^-1,   reduction_j = 1 - sqrt(C_jj) / sigma_j

    ``J`` is the Jacobian of the rows' log errors (one-sided differences of ``DIFF_STEP`` in the fitted
    scale, stepping inward at a bound). A parameter no row exercises has a zero column and reduction 0;
    two parameters the rows see only together (a GEMM efficiency and the GPU speed, rows of one GPU
    and precision) share what the rows tell, and each is reduced less than either alone would be."""
    base = row_errors(u0)
    cols = []
    for j in range(len(u0)):
        h = DIFF_STEP * max(1.0, abs(u0[j]))
        if u0[j] + h > hi[j]:
            h = -h
        u = u0.copy()
        u[j] += h
        cols.append((row_errors(u) - base) / h)
    jac = np.array(cols).T if cols else np.zeros((len(base), 0))
    precision = jac.T @ jac / ROW_SIGMA ** 2 + np.diag(1.0 / sigma ** 2)
    post = np.linalg.inv(precision)
    return 1.0 - np.sqrt(np.clip(np.diag(post), 0.0, None)) / sigma


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


def calibrate_rows(rows: list[dict], stack: str, *, source: str = "CSV", exclude_model: str | None = None,
                   progress=None, start: Profile | str | None = None, identify: bool = False,
                   by_generation: bool = False) -> tuple[Profile, dict]:
    """Fit the profile ``stack`` to the rows of that stack (all rows when the CSV has no stack column).

    ``start``: a known profile whose values are the priors (``start_profile``); ``"priors"``: the
    published priors; None: a stack with a shipped profile of its name starts from the published priors
    (how the shipped profiles are fitted), any other from ``nearest_profile`` of its trainer.
    ``identify``: fit only the parameters the rows inform (``posterior_reduction``), the rest keep
    their start. ``by_generation``: the shared parameters the rows inform are fitted per generation of
    the rows (``per_generation``), so that other generations' predictions keep the start's values.
    ``info`` says the start, which parameters the rows inform, which were fitted, which were made per
    generation (``per_generation``)."""
    mine = [r for r in rows if (r.get("stack") or stack).strip() == stack]
    if exclude_model:
        mine = [r for r in mine if r["model"].strip() != exclude_model]
    if not mine:
        known = sorted({(r.get("stack") or "").strip() for r in rows} - {""})
        raise InputError(f"{source}: no rows of stack {stack!r}" + (f"; stacks in the file: {', '.join(known)}" if known else ""))
    missing = [r.get("id", "?") for r in mine if not (r.get("model_tflops_per_gpu") or "").strip()]
    if missing:
        raise InputError(f"{source}: row {missing[0]}: model_tflops_per_gpu is empty; calibration needs measured rows")
    if start is None and not (PROFILE_DIR / f"{stack}.yaml").exists():
        near = nearest_profile(base_profile(stack).trainer)
        start = load_profile(near) if near else "priors"
    base = start_profile(stack, start) if isinstance(start, Profile) else base_profile(stack)
    cases, refused = [], []
    for r in mine:
        case = row_case(r, stack, source, profile=base)
        why = refusal(case)
        if why:   # the trainer would not run this layout: a measurement of it cannot be what the row says
            refused.append({"id": case.id, "refused": why})
        else:
            cases.append(resolve_case(case, base))
    if not cases:
        raise InputError(f"{source}: every row of stack {stack!r} breaks a trainer rule (row {refused[0]['id']}: "
                         f"{refused[0]['refused']}); nothing to fit")
    fit_base, localized = per_generation(base, cases) if by_generation else (base, [])
    prof, info = fit_profile(cases, fit_base, progress=progress, identify=identify)
    # the written profile keeps the start's fit flags (a later calibration fits the same parameters)
    prof = prof.model_copy(update={"params": {k: p.model_copy(update={"fit": base.params[k].fit}) if k in base.params
                                              else p for k, p in prof.params.items()}})
    info["per_generation"] = localized
    info["base"] = base                 # the start: the same conventions, the values before the fit
    info["arches"] = sorted({c.cluster.gpu_spec.arch for c in cases})
    name = source.rsplit("/", 1)[-1]
    prof = prof.model_copy(update={"fit_rows": f"{name}: {len(cases)} rows of stack {stack}"
                                   + (f" without {exclude_model}" if exclude_model else "")})
    info["rows"] = len(cases)
    info["refused"] = refused
    info["start"] = start.name if isinstance(start, Profile) else "priors"
    return prof, info
