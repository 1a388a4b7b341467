"""Fit a stack profile to measured rows: least squares on log error, with bounds and priors.

``calibrate(rows, stack)`` starts every fitted parameter at its prior (``planner.calibration.priors``:
``PRIORS``, each with its source), and minimises::

    sum_rows (log(pred_i / measured_i))^2  +  w^2 * sum_params (log(p / prior) / log(spread))^2

with ``scipy.optimize.least_squares`` inside each parameter's bounds. The prior term keeps a
parameter the rows say little about at its published value instead of letting it absorb noise;
``w`` (``PRIOR_WEIGHT``) is small enough that the rows dominate where they are informative.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import least_squares

from planner.calibration.priors import PRIORS, VARIANTS, base_profile, nearest_profile, start_profile
from planner.calibration.validate import refusal, resolve_case, row_case
from planner.cost.predict import predict
from planner.cost.profiles import ARCHS, PROFILE_DIR, Param, Profile, load_profile
from planner.errors import InputError

PRIOR_WEIGHT = 0.05
DIFF_STEP = 1e-3
LOSS = "soft_l1"  # robust: a row whose recipe differs from the stack's usual one cannot drag the profile
F_SCALE = 0.03  # residual scale (weighted log error) beyond which the loss grows linearly
ROW_SIGMA = 0.05  # a row's log error the model leaves (the shipped profiles explain their own rows to 4-6%)
MIN_REDUCTION = 1 - 1 / math.sqrt(2)  # fit a parameter when the rows tell at least as much as its prior


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
    """Least-squares fit of ``base``'s fitted parameters to ``cases`` (``planner.calibration.validate.Case``,
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
                        jac=_forward_jacobian(residuals, pb.hi[free]), loss=LOSS, f_scale=F_SCALE, max_nfev=max_nfev, xtol=1e-10, ftol=1e-10,
                        gtol=1e-10)
    vals = dict(zip([keys[i] for i in free], pb.to_v(res.x)))
    vals = {k: float(f"{v:.4g}") for k, v in vals.items()}
    return base.with_values(vals), {**info, "cost": float(res.cost), "nfev": int(res.nfev), "status": int(res.status)}


def _forward_jacobian(fun, hi):
    """One-sided differences of ``fun`` with the absolute step ``posterior_reduction`` uses (``DIFF_STEP`` times
    max(1, |u|), backwards at the upper bound). scipy's ``diff_step`` is relative to |u|, which vanishes where a
    log-scaled parameter is 1 (u = 0): the Jacobian came out 0 there and the fit stopped at its first step."""
    def jac(u):
        f0 = fun(u)
        J = np.empty((f0.size, u.size))
        for j in range(u.size):
            h = DIFF_STEP * max(1.0, abs(u[j]))
            h = -h if u[j] + h > hi[j] else h
            x = u.copy()
            x[j] += h
            J[:, j] = (fun(x) - f0) / h
        return J
    return jac


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
