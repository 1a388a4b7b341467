"""The one result of pricing a layout: ``Prediction``.

``planner.cost.predict.predict`` returns it; the search keeps it on each plan (``PlanEntry.prediction``)
and plan.json holds its document part (``plans[i].prediction``, and ``compare.prediction`` for ``plan
--compare``); ``validate`` and ``calibrate`` compare it with a measured run (``planner.calibration``);
the report and ``explain`` read it back from plan.json. The step-time model's own composition
(``planner.cost.steptime.StepTime``: step time, breakdown, micro-batches) is an input to it, not a
second prediction.

Two groups of fields:

- **the document part** (written to plan.json and validated when a plan.json is read; the JSON Schema
  ``planner/data/plan.schema.json`` is generated from it): throughput, step time and its breakdown,
  memory, and the uncertainty band (``planner.cost.uncertainty``, docs/uncertainty.md)::

      tokens_per_s          = gbs * seq_len / step_time_s
      tokens_per_s_per_gpu  = tokens_per_s / world
      tflops_per_gpu        = tokens_per_s_per_gpu * flops_per_token / 1e12
      [tflops_per_gpu_low, tflops_per_gpu_high] = tflops_per_gpu * [exp(-h), exp(h)],  h = band_half_width

- **what was priced** (``config``, ``world``, ``placement``, ``violations``, ``stack``, ``details``):
  set by ``predict``, never written into plan.json (the document holds the layout and placement in
  parts of their own), absent (``None`` / empty) on a prediction read back from a document.

``document()`` is the document part as a dict; ``to_dict()`` is what ``topoplan predict --json``
prints (the document part, the priced layout and the broken rules).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from planner.config import ParallelConfig
from planner.cost.placement import Placement
from planner.cost.steptime import TERMS

# The step-time model's terms, named once (planner.cost.steptime.TERMS): the breakdown's keys
Term = Literal[TERMS]
# what was priced: not part of the document (excluded from dumps and from the JSON Schema)
PRICED = ("config", "world", "placement", "violations", "stack", "details")


def _priced(default=None, **kw):
    return Field(default, exclude=True, **kw)


class Prediction(BaseModel):
    """A layout's predicted throughput, step time, memory and uncertainty band (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    tflops_per_gpu: float = Field(description="model TFLOP/s per GPU (Megatron-Bridge FLOP convention of the stack)")
    tokens_per_s_per_gpu: float
    tokens_per_s: float = Field(description="the job's tokens per second: gbs * seq_len / step_time_s")
    step_time_s: float
    memory_gib_per_gpu: float = Field(description="peak GiB per GPU on the fullest pipeline stage")
    hbm_gib: float
    usable_gib: float | None = Field(None, description="HBM less Training.memory_headroom: what fits compares with")
    fits: bool
    breakdown: dict[Term, float] = Field(description="seconds per step-time term (they add up to step_time_s)")
    memory: dict[str, Any] = Field(description="GiB per memory component on the worst pipeline stage")
    tflops_per_gpu_low: float = 0.0
    tflops_per_gpu_high: float = 0.0
    regime: str = Field("", description="the features the band is keyed by, e.g. 'nvl72 moe ep-in-domain fp8'")
    extrapolated: str | None = Field(None, description="why no measured run covers the regime, or None")
    band_half_width: float = Field(0.0, description="h, in ln units: the band is [T exp(-h), T exp(h)]")
    band_runs: int = Field(0, description="measured runs behind h (0: the documented default)")
    host_gib_per_node: float | None = Field(None, description="host memory per node that Megatron's offloaded "
                                            "optimizer fills (GiB); None without the optimizer CPU offload")
    host_usable_gib: float | None = Field(None, description="the share of a node's host memory it may fill (GiB)")

    # what was priced (PRICED): set by predict, not in the document
    config: SkipJsonSchema[ParallelConfig | None] = _priced()
    world: SkipJsonSchema[int | None] = _priced()
    placement: SkipJsonSchema[Placement | None] = _priced()
    violations: SkipJsonSchema[list[Any]] = Field(default_factory=list, exclude=True)
    stack: SkipJsonSchema[str] = _priced("")
    details: SkipJsonSchema[dict[str, Any]] = Field(default_factory=dict, exclude=True)

    def document(self) -> dict:
        """The document part (plan.json ``plans[i].prediction``), as plain Python values."""
        return self.model_dump()

    def to_dict(self) -> dict:
        """``topoplan predict --json``: the document part, the priced layout, placement and broken rules."""
        d = self.document()
        if d["step_time_s"] == float("inf"):   # a layout a hard rule refuses has no step time
            d["step_time_s"] = None
        d.update({
            "config": None if self.config is None else self.config.model_dump(),
            "dispatcher": None if self.config is None else self.config.dispatcher,
            "world": self.world,
            "stack": self.stack,
            "placement": None if self.placement is None else {
                "order": self.placement.order, "gpus_per_domain": self.placement.gpus_per_domain,
                "rank_to_gpu": list(self.placement.rank_to_gpu)},
            "violations": [{"rule": v.rule, "message": v.message} for v in self.violations],
        })
        return d
