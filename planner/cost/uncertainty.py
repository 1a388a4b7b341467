"""The uncertainty band of a prediction, from the residuals of measured runs in the same regime.

A *regime* is what separates runs that the step-time model predicts well from those it does not
(docs/uncertainty.md has the evidence):

- ``system``: ``hgx`` (NVLink domains of at most 8 GPUs) or ``nvl72`` (rack-scale NVLink domains);
- ``kind``: ``dense`` or ``moe``;
- ``ep`` (MoE only): ``ep-in-domain`` when every expert-parallel group sits inside one NVLink
  domain, ``ep-across-domains`` when one spans several (the worst EP group of the placement);
- ``fsdp``, ``cp`` (CP > 1) and ``precision`` (``bf16``, ``fp8`` for FP8/FP8-block/MXFP8, ``fp4``).

The first three form the *core* regime: the band's width is the residual statistic of the measured
runs in it. The last three are checked for coverage: a layout whose FSDP, CP or precision class no
measured run of its core regime has is *extrapolated* (``"no measured FSDP+MoE run (NVL72, ...)"``) and
its band is widened by ``extrapolation_step`` per uncovered feature.

The figures are data, ``planner/data/uncertainty.yaml``, written by ``bench/uncertainty.py`` from
the residuals ``ln(predicted / measured)`` of every measured run (leave-one-model-out for the rows
a profile was fitted to). The statistic (``planner.calibration.bands.half_width``) is the ``quantile`` (0.8) of the absolute
log residuals, linear interpolation between order statistics, never below ``floor``; a core regime
needs ``min_runs`` runs, first among the runs of the stack profile, then among those of its trainer
family (all Megatron releases); else the band is ``default_half_width`` and extrapolated.

A fourth check is the GPU *generation* (``GPUSpec.arch``: hopper, blackwell, blackwell-ultra): a
stack profile records the generations of the runs it was fitted on (``fitted_archs``); a prediction
on another generation is extrapolated (``"no measured Hopper run of megatron-26.08"``) and its band is
at least the widest residual of that stack's predictions of the family's measured runs of that
generation and core regime (``generations``: few runs, so the widest rather than a quantile; the
default half-width when there are none), plus ``extrapolation_step``.

The band of a prediction ``T`` is ``[T exp(-h), T exp(+h)]``: symmetric in log space, so a
half-width of 0.10 is -9.5% / +10.5%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from planner.cost.placement import default_gpus_per_domain, group_shapes, make_placement
from planner.errors import InputError
from planner.io import read_yaml
from planner.rules import optimizer_offload
from planner.trainers import NAMES

TABLE_PATH = Path(__file__).resolve().parents[1] / "data" / "uncertainty.yaml"
PRECISION_CLASS = {"bf16": "bf16", "fp8": "fp8", "fp8-block": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
HGX_MAX_DOMAIN = 8           # an NVLink domain larger than this is a rack-scale (NVL72) system
SECONDARY = ("fsdp", "cp", "precision")


@dataclass(frozen=True)
class Regime:
    system: str              # "hgx" | "nvl72"
    kind: str                # "dense" | "moe"
    ep: str | None           # "ep-in-domain" | "ep-across-domains" | None (dense)
    fsdp: bool
    cp: bool
    precision: str           # "bf16" | "fp8" | "fp4"
    arch: str | None = None  # GPU generation (GPUSpec.arch); None: not checked
    offload: bool = False    # Megatron's optimizer CPU offload (no measured run: always extrapolated)

    @property
    def core(self) -> str:
        """``"nvl72 moe ep-in-domain"``: the key of the band's width."""
        return " ".join(x for x in (self.system, self.kind, self.ep) if x)

    def label(self) -> str:
        """``"nvl72 moe ep-in-domain fsdp cp fp8"``: every feature, the form ``Prediction.regime`` carries."""
        return " ".join([self.core] + (["fsdp"] if self.fsdp else []) + (["cp"] if self.cp else []) + [self.precision]
                        + (["optimizer-offload"] if self.offload else []))

    def describe(self, features=SECONDARY) -> str:
        """Words for the features named (and the core): ``"FSDP+MoE run (NVL72, EP inside NVLink domains)"``."""
        parts = []
        if "precision" in features:
            parts.append(self.precision.upper())
        if "fsdp" in features:
            parts.append("FSDP" if self.fsdp else "non-FSDP")
        if "cp" in features:
            parts.append("CP" if self.cp else "CP1")
        what = "+".join(parts + ["MoE" if self.kind == "moe" else "dense"])
        where = self.system.upper()
        if self.ep:
            where += ", EP " + ("inside" if self.ep == "ep-in-domain" else "across") + " NVLink domains"
        return f"{what} run ({where})"


def classify(model, cluster, config, training, ep_domains: int | None = None, placement=None) -> Regime:
    """The regime of a layout. ``ep_domains``: NVLink domains spanned by the worst EP group (from the
    placement's group shapes when not given; ``placement`` defaults to the planner's)."""
    system = "nvl72" if cluster.gpu_spec.nvlink_domain_max > HGX_MAX_DOMAIN else "hgx"
    ep = None
    if model.is_moe:
        if ep_domains is None:
            ep_domains = _ep_domains(cluster, config, placement)
        ep = "ep-across-domains" if ep_domains > 1 else "ep-in-domain"
    prec = PRECISION_CLASS.get(training.precision)
    if prec is None:
        raise InputError(f"precision {training.precision!r}: use one of {', '.join(PRECISION_CLASS)}")
    return Regime(system, "moe" if model.is_moe else "dense", ep, bool(config.fsdp), config.cp > 1, prec,
                  cluster.gpu_spec.arch, optimizer_offload(training) > 0)


def _ep_domains(cluster, config, placement) -> int:
    if placement is None:
        world = config.world(cluster.num_gpus)
        gpd = default_gpus_per_domain(cluster.domain_sizes(), config, world)
        placement = make_placement(cluster, config, world, gpus_per_domain=gpd)
    return group_shapes(cluster, config, placement)["ep"].domains


@dataclass(frozen=True)
class Band:
    half_width: float        # h: the band is [T exp(-h), T exp(h)]
    runs: int                # measured runs behind the core figure (0: the default)
    regime: Regime
    source: str              # the pool the figure comes from: a stack, a trainer family, or "default"
    extrapolated: str | None  # why the regime is not covered by a measured run, or None

    def bounds(self, value: float) -> tuple[float, float]:
        return value * math.exp(-self.half_width), value * math.exp(self.half_width)

    def factor(self) -> float:
        """exp(h): the robust objective divides throughput by it (maximises the lower edge)."""
        return math.exp(self.half_width)


@lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> dict:
    try:
        doc = read_yaml(Path(path).read_text())   # 46 kB: libyaml where present
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read the uncertainty table ({str(exc).splitlines()[0]}); "
                         "regenerate it with python bench/uncertainty.py --write") from None
    for key in ("quantile", "floor", "min_runs", "default_half_width", "extrapolation_step", "pools"):
        if key not in (doc or {}):
            raise InputError(f"{path}: missing field {key!r}; regenerate it with python bench/uncertainty.py --write")
    return doc


def load_table(path: str | Path | None = None) -> dict:
    """The shipped uncertainty table (``planner/data/uncertainty.yaml``) or another file."""
    p = Path(path) if path is not None else TABLE_PATH
    if not p.exists():
        raise InputError(f"{p}: no uncertainty table; regenerate it with python bench/uncertainty.py --write")
    return _load(str(p), p.stat().st_mtime)


def family_of(stack: str, trainer: str | None = None) -> str:
    """The trainer family of a stack profile name: ``megatron-26.08`` -> ``megatron``."""
    s = (stack or "").lower()
    for fam in NAMES:
        if s.startswith(fam):
            return fam
    return trainer or s


def band_for(regime: Regime, stack: str, trainer: str | None = None, table: dict | None = None) -> Band:
    """The band of a regime for a stack profile (see the module docstring for the rules)."""
    if table is None:
        p = TABLE_PATH
        return _band_cached(regime, stack, trainer, str(p), p.stat().st_mtime if p.exists() else 0.0)
    return _band_of(regime, stack, trainer, table)


@lru_cache(maxsize=1024)
def _band_cached(regime: Regime, stack: str, trainer: str | None, path: str, mtime: float) -> Band:
    return _band_of(regime, stack, trainer, load_table())


OFFLOAD_WHY = ("no measured run with Megatron's optimizer CPU offload (its CPU Adam rate is one single-GPU "
               "measurement, planner/cost/terms/cpu_optimizer.py)")


def _band_of(regime: Regime, stack: str, trainer: str | None, t: dict) -> Band:
    """The band of the regime's measured runs (``_measured_band``), one extrapolation step wider with the
    optimizer offloaded, which no measured run covers."""
    b = _measured_band(regime, stack, trainer, t)
    if not regime.offload:
        return b
    why = "; ".join(x.removesuffix(": extrapolated") for x in (b.extrapolated, OFFLOAD_WHY) if x) + ": extrapolated"
    return Band(b.half_width + t["extrapolation_step"], b.runs, regime, b.source, why)


def _measured_band(regime: Regime, stack: str, trainer: str | None, t: dict) -> Band:
    pools = t["pools"]
    fam = family_of(stack, trainer)
    order = [p for p in dict.fromkeys((stack, fam)) if p in pools]
    h, runs, source = None, 0, "default"
    for name in order:
        cell = pools[name].get("regimes", {}).get(regime.core)
        if cell and cell["runs"] >= t["min_runs"]:
            h, runs, source = float(cell["half_width"]), int(cell["runs"]), name
            break
    if h is None:
        have = max((pools[n].get("regimes", {}).get(regime.core, {}).get("runs", 0) for n in order), default=0)
        why = f"no measured {regime.describe(())}" if not have else \
            f"only {have} measured {regime.describe(())}{'s' if have > 1 else ''} (fewer than {t['min_runs']})"
        h, why = float(t["default_half_width"]), f"{why} with {fam}"
        gen = _generation(regime, stack, t)
        if gen is not None:
            h, why = max(h, gen[0]) + t["extrapolation_step"], f"{why}; {gen[1]}"
        return Band(h, 0, regime, "default", f"{why}: extrapolated")
    # coverage of FSDP, CP and the precision class among the family's runs of this core regime
    measured = [r for n in order for r in pools[n].get("runs", []) if r["core"] == regime.core]
    missing = [f for f in SECONDARY if not any(r[f] == getattr(regime, f) for r in measured)]
    why = [f"no measured {regime.describe(missing)} with {fam}"] if missing else []
    gen = _generation(regime, stack, t)
    if gen is not None:
        h, why = max(h, gen[0]), why + [gen[1]]
    steps = len(missing) + (gen is not None)
    if not steps:
        return Band(h, runs, regime, source, None)
    return Band(h + t["extrapolation_step"] * steps, runs, regime, source, "; ".join(why) + ": extrapolated")


ARCH_WORDS = {"hopper": "Hopper", "blackwell": "Blackwell", "blackwell-ultra": "Blackwell Ultra"}


def _generation(regime: Regime, stack: str, t: dict) -> tuple[float, str] | None:
    """(half-width, why) when ``stack`` was fitted on other GPU generations than the regime's, else None
    (also when the table does not record the stack's generations)."""
    pool = t["pools"].get(stack) or {}
    fitted = pool.get("fitted_archs")
    if regime.arch is None or fitted is None or regime.arch in fitted:
        return None
    word = ARCH_WORDS.get(regime.arch, regime.arch)
    cell = (pool.get("generations") or {}).get(regime.arch, {}).get(regime.core)
    if not cell:
        return float(t["default_half_width"]), f"no measured {word} run of {stack} (nor of its family in this regime)"
    return (float(cell["half_width"]),
            f"no measured {word} run of {stack} (fitted on {', '.join(ARCH_WORDS.get(a, a) for a in fitted)}); "
            f"its predictions of {cell['runs']} measured {word} run{'s' if cell['runs'] > 1 else ''} of this regime "
            f"are off by up to {100 * (math.exp(cell['half_width']) - 1):.0f}%")


def band(model, cluster, config, training, stack: str, ep_domains: int | None = None, placement=None,
         table: dict | None = None) -> Band:
    """``band_for(classify(...))``: the band of one layout."""
    reg = classify(model, cluster, config, training, ep_domains=ep_domains, placement=placement)
    return band_for(reg, stack, training.trainer, table)


def lead(leader: float, leader_half_width: float, other: float) -> tuple[float, bool]:
    """(leader / other - 1, within): ``within`` when ``other`` lies inside the leader's band
    (``other >= leader exp(-h)``): the ranking of the two is within the model's uncertainty."""
    if other <= 0:
        return math.inf, False
    return leader / other - 1.0, other >= leader * math.exp(-leader_half_width)


def safe_order(values, half_widths, extrapolated) -> tuple[list[int], list[tuple[int, int]]]:
    """The ranking with the safe default (issue 21 item 5), for plans given best first by their central
    ``values``: an extrapolated plan never ranks above a covered one (``extrapolated[i]`` falsy) whose
    value lies inside its band (``value >= its value exp(-h)``: its lead is within the uncertainty).
    Otherwise the order is kept. Returns (indices in the new order, [(covered, extrapolated)] for each
    covered plan ranked above an extrapolated one that led it)."""
    remaining = list(range(len(values)))
    order, promoted = [], []

    def inside(c, r):   # covered c lies inside extrapolated r's band
        return bool(extrapolated[r]) and not extrapolated[c] and values[c] >= values[r] * math.exp(-half_widths[r])

    while remaining:   # the best plan no covered plan still to place lies inside the band of
        pick = next((r for r in remaining if not any(inside(c, r) for c in remaining)), remaining[0])
        promoted += [(pick, r) for r in remaining[:remaining.index(pick)] if inside(pick, r)]
        order.append(pick)
        remaining.remove(pick)
    return order, promoted
