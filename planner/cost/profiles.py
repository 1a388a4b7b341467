"""Stack profiles: the few efficiency parameters of one software stack, by GPU generation and precision.

A profile is a YAML file in ``planner/data/profiles/<name>.yaml`` (or any path). It names the stack,
the FLOP-counting convention its published "model TFLOP/s" use, the trainer and dispatcher defaults,
and a flat table of parameters. Every parameter has a value, bounds, a prior (the value a fit is
pulled towards when the data say little) and a source. Parameters may depend on the stack, the GPU
generation and the precision, never on a model or a measured row: the names below are the whole
vocabulary, and ``param(name, arch=..., precision=...)`` resolves the generation- or precision-specific
variant when the profile has one (``gemm.fp8@hopper`` overrides ``gemm.fp8`` on Hopper).

Parameter vocabulary (see docs/steptime.md for the equations):

- ``gemm.bf16``, ``gemm.fp8``, ``gemm.mxfp8`` (also fp8-block), ``gemm.nvfp4``: multiplier on the
  measured maximum achievable matmul fraction (MAMF, hardware.md s3) of the GPU at that precision.
- ``gemm.dim_half``: GEMM size (smallest of N, K on one GPU) at which a GEMM runs at half its
  large-shape efficiency (tile quantisation and arithmetic intensity of thin GEMMs).
- ``gemm.grouped_m_half``: tokens per expert at which a grouped expert GEMM runs at half speed
  (the small-M penalty of grouped GEMMs).
- ``attn.eff``: fraction of the BF16 dense peak reached by the fused attention core (forward+backward).
- ``mem.elementwise``: multiplier on the counted elementwise HBM traffic (norms, activations,
  residuals, RoPE, token permutation).
- ``mem.quant``: multiplier on the counted low-precision quantisation traffic.
- ``mem.hbm_eff``: achievable fraction of the HBM bandwidth.
- ``tp.overlap``, ``ep.overlap``, ``cp.overlap``, ``dp.overlap``, ``pp.overlap``: fraction of each
  communication term that the stack can hide behind independent compute (each capped by the compute
  actually available to hide it).
- ``ep.dispatch_bytes_fp8``: 1 when the dispatcher sends tokens in FP8 for low-precision runs.
- ``other.layer_us``: host and launch overhead per layer per micro-batch (microseconds).
- ``gpu.speed``: multiplier on all tensor-core work of a GPU generation (sustained clocks under the
  package power limit differ from the MAMF benchmark); used with an ``@arch`` qualifier.
- ``net.bw``: achieved scale-out bandwidth relative to the fabric model (0.74 of NIC line rate), for
  collectives that leave an NVLink domain; used with an ``@arch`` qualifier (the NIC generation
  comes with the GPU generation: CX7 400G on Hopper/B200/GB200, CX8 800G on B300/GB300).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from planner.errors import InputError, not_utf8, pydantic_message
from planner.io import read_yaml
from planner.trainers import DEFAULT, TRAINERS

PROFILE_DIR = Path(__file__).resolve().parents[1] / "data" / "profiles"
# The measured Megatron-Bridge runs the megatron-* profiles are fitted to (provenance per row in its
# `source` column and in planner/data/profiles/README.md).
CALIBRATION_CSV = PROFILE_DIR / "calibration.csv"
DEFAULT_STACK = TRAINERS[DEFAULT].default_stack   # what a plan is priced with unless it names a stack

PARAM_NAMES = (
    "gemm.bf16", "gemm.fp8", "gemm.mxfp8", "gemm.nvfp4", "gemm.dim_half", "gemm.grouped_m_half",
    "attn.eff", "mem.elementwise", "mem.quant", "mem.hbm_eff",
    "tp.overlap", "ep.overlap", "cp.overlap", "dp.overlap", "pp.overlap",
    "ep.dispatch_bytes_fp8", "other.layer_us", "gpu.speed", "net.bw", "dp.grad_bytes",
    "host.launch_us",
)
# Parameters added after profiles were first shipped: a profile file without them takes this value.
OPTIONAL_DEFAULTS = {"dp.grad_bytes": 2.0, "host.launch_us": 25.0}
# ... or the value of this other parameter (an eager recipe costs what the profile's rows cost).
OPTIONAL_FALLBACKS = {"mem.elementwise_eager": "mem.elementwise"}
# every parameter name in file order: an optional one right after the one it falls back to
_ORDER = tuple(x for n in PARAM_NAMES for x in (n, *(k for k, v in OPTIONAL_FALLBACKS.items() if v == n)))
ARCHS = ("hopper", "blackwell", "blackwell-ultra")
PRECISION_KEYS = ("bf16", "fp8", "fp8-block", "mxfp8", "nvfp4")
MAX_PARAMS = 40   # the shipped ones hold 30; calibrate may add per-generation variants (docs/calibration.md)


class Param(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float
    min: float
    max: float
    prior: float | None = Field(None, description="value a fit is pulled towards (default: value)")
    fit: bool = Field(True, description="calibrate may move it")
    source: str = Field(..., min_length=3, description="where the value or its prior comes from")

    @model_validator(mode="after")
    def _bounds(self):
        if not self.min <= self.value <= self.max:
            raise ValueError(f"value {self.value} outside [{self.min}, {self.max}]")
        return self


class MemoryFit(BaseModel):
    """The memory model's reserve terms fitted to measured peaks (issue 13: ``topoplan calibrate`` on
    runs whose logs print memory; ``planner.calibration.memfit``); absent = the defaults of
    ``planner.cost.memory`` (RESERVE_GIB, FRAGMENTATION)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reserve_gib: float = Field(..., ge=0.0, le=64.0, description="GiB per GPU outside the modelled tensors")
    fragmentation: float = Field(..., ge=0.0, le=1.0, description="allocator overhead per GiB of activations")
    runs: int = Field(0, ge=0, description="measured peaks the values were fitted to")
    source: str = Field("", description="where the measured peaks came from")


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    trainer: str = DEFAULT
    flops_formula: str = Field("current", description="'current' or 'legacy' (Megatron-Bridge <= 26.04)")
    dispatcher: str = Field("alltoall", description="MoE dispatcher the stack's recipes use")
    fit_rows: str = Field("", description="rows the parameters were fitted to (file and stack)")
    memory: MemoryFit | None = Field(None, description="fitted memory reserve terms (None: the model's defaults)")
    params: dict[str, Param]

    @model_validator(mode="after")
    def _names(self):
        if len(self.params) > MAX_PARAMS:
            raise ValueError(f"{len(self.params)} parameters; a profile has at most {MAX_PARAMS}")
        for key in self.params:
            base, _, qual = key.partition("@")
            if base not in PARAM_NAMES and base not in OPTIONAL_FALLBACKS:
                raise ValueError(f"unknown parameter {key!r}; known: {', '.join(PARAM_NAMES + tuple(OPTIONAL_FALLBACKS))}")
            if qual and qual not in ARCHS and qual not in PRECISION_KEYS:
                raise ValueError(f"parameter {key!r}: qualifier must be a GPU arch ({', '.join(ARCHS)})")
        missing = [n for n in PARAM_NAMES if n not in self.params and n not in OPTIONAL_DEFAULTS]
        if missing:
            raise ValueError(f"missing parameter {missing[0]!r}")
        return self

    def param(self, name: str, arch: str | None = None) -> float:
        """Value of ``name``, using the ``name@arch`` variant when the profile has one."""
        if arch is not None:
            p = self.params.get(f"{name}@{arch}")
            if p is not None:
                return p.value
        p = self.params.get(name)
        if p is None and name in OPTIONAL_FALLBACKS:
            return self.param(OPTIONAL_FALLBACKS[name], arch)
        return OPTIONAL_DEFAULTS[name] if p is None and name in OPTIONAL_DEFAULTS else self.params[name].value

    def values(self, arch: str | None = None) -> dict[str, float]:
        return {n: self.param(n, arch) for n in PARAM_NAMES}

    def with_values(self, values: dict[str, float]) -> "Profile":
        """A copy with some parameter values replaced (keys as in ``params``)."""
        new = dict(self.params)
        for k, v in values.items():
            p = new[k]
            new[k] = p.model_copy(update={"value": float(min(max(v, p.min), p.max))})
        return self.model_copy(update={"params": new})

    @property
    def key(self) -> tuple:
        """Hashable identity for memoisation."""
        return (self.name, tuple(sorted((k, p.value) for k, p in self.params.items())))


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _version(name: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"megatron-(\d{2})\.(\d{2})(?:\.\d+)?", name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def resolve_name(name: str) -> str:
    """A shipped profile name for ``name``: itself when shipped; for another Megatron container
    release ``megatron-YY.MM`` the first shipped Megatron profile at or after it (26.06 -> 26.08,
    25.11 -> 26.04: the same FLOP convention), else the newest; ``megatron`` -> the default."""
    name = name.lower()
    shipped = available()
    if name in shipped:
        return name
    if name in TRAINERS:   # a trainer's name: its default stack
        return TRAINERS[name].default_stack
    want = _version(name)
    if want is None:
        return name
    versions = sorted((v, n) for n in shipped if (v := _version(n)) is not None)
    later = [n for v, n in versions if v >= want]
    return later[0] if later else (versions[-1][1] if versions else name)


def parse_profile(text: str, source: str) -> Profile:
    try:
        doc = read_yaml(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a profile is a YAML mapping with name, params, ...")
    try:
        return Profile.model_validate(doc)
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, source)) from None


@lru_cache(maxsize=64)
def _load_cached(path: str, mtime: float) -> Profile:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc, "profile YAML") from None
    return parse_profile(text, path)


def load_profile(name_or_path: str | Path | None = None) -> Profile:
    """A shipped profile by name (``megatron-26.08``, ...) or a profile YAML file by path."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    name = str(name_or_path or DEFAULT_STACK)
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = PROFILE_DIR / f"{resolve_name(name)}.yaml"
    if not path.exists():
        raise InputError(f"unknown stack profile {name!r}; use one of {', '.join(available())} or a profile .yaml path")
    return _load_cached(str(path), path.stat().st_mtime)


def dump_profile(profile: Profile) -> str:
    """The profile as YAML text, one parameter per line with its source as a comment."""
    lines = [
        f"# Stack profile {profile.name}: efficiency parameters of the step-time model (docs/steptime.md).",
        "# Written by `topoplan calibrate`; each parameter keeps its bounds, prior and source.",
        f"name: {profile.name}",
        f"description: {json.dumps(profile.description)}",
        f"trainer: {profile.trainer}",
        f"flops_formula: {profile.flops_formula}",
        f"dispatcher: {profile.dispatcher}",
        f"fit_rows: {json.dumps(profile.fit_rows)}",
        *([f"memory: {{reserve_gib: {_num(profile.memory.reserve_gib)}, fragmentation: "
           f"{_num(profile.memory.fragmentation)}, runs: {profile.memory.runs}, source: "
           f"{json.dumps(profile.memory.source)}}}"] if profile.memory is not None else []),
        "params:",
    ]
    for key in sorted(profile.params, key=lambda k: (_ORDER.index(k.partition('@')[0]), k)):
        p = profile.params[key]
        prior = p.value if p.prior is None else p.prior
        src = json.dumps(p.source)
        fitted = f"fitted to {profile.fit_rows}; " if (p.fit and profile.fit_rows) else ""
        lines.append(f"  # {key}: {fitted}source: {p.source}")
        lines.append(f"  {key}: {{value: {_num(p.value)}, min: {_num(p.min)}, max: {_num(p.max)}, "
                     f"prior: {_num(prior)}, fit: {str(p.fit).lower()}, source: {src}}}")
    return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    return f"{x:.6g}"
