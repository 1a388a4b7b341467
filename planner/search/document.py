"""The plan document (``plan.json``): one typed value shared by ``plan`` (which writes it), ``emit``,
``report`` and ``explain`` (which read it).

``PlanResult.to_dict()`` writes the document; ``PlanDocument.model_validate(doc)`` reads one back
(``load_document`` turns a validation error into a one-line ``InputError`` naming the field), and
``PlanDocument.dump()`` gives the same JSON object again (``tests/test_plan_document.py`` checks the
round trip on real plans). The parts that have a model of their own elsewhere are that model: the
model spec is ``planner.model.spec.ModelSpec``, the cluster ``topologies.cluster.Cluster``, the
training setup ``planner.config.Training`` (with ``trainer`` narrowed to a ``Literal``). The JSON
Schema (``topoplan schema plan``) is generated from these classes and shipped as
``planner/data/plan.schema.json``; a test keeps the two equal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.config import ParallelConfig, Training
from planner.cost.prediction import Prediction, Term
from planner.cost.shape import LaunchShape
from planner.errors import InputError, not_utf8, pydantic_message
from planner.model.spec import ModelSpec, catalog, load_model
from planner.trainers import DEFAULT, NAMES
from topologies.cluster import Cluster

VERSION = 1
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "data" / "plan.schema.json"
REGENERATE = "topoplan schema plan > planner/data/plan.schema.json"

Trainer = Literal[NAMES]   # the trainer packages (planner.trainers)
Method = Literal["enumerate", "cp-sat", "exhaustive", "cp-sat-full"]
# The quantity the solver maximised: cluster tokens/s (--objective throughput), their lower
# uncertainty bound (robust), model TFLOP/s per GPU (tflops-per-gpu), or goodput tokens/s (goodput).
ObjectiveName = Literal["tokens_per_s", "tokens_per_s_low", "tflops_per_gpu", "goodput_tokens_per_s"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelPart(_Strict):
    name: str
    spec: ModelSpec


class TrainingPart(Training):
    """``planner.config.Training`` as the document holds it (the trainer one of three names)."""

    trainer: Trainer = Field(DEFAULT, description=" | ".join(NAMES))


class ConfigPart(_Strict):
    """The layout of one plan: the degrees (``ParallelConfig``) with the derived ``dp``, ``edp`` and
    ``world`` and the global batch the plan runs (``gbs``: the solver may choose it)."""

    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    vpp: int = Field(ge=1)
    cp: int = Field(ge=1)
    ep: int = Field(ge=1)
    etp: int = Field(ge=1, description="expert tensor parallel degree as applied (TP when the config left it open)")
    dp: int | None = Field(None, ge=1)
    mbs: int = Field(ge=1)
    gbs: int = Field(ge=1)
    fsdp: bool
    recompute: str
    dispatcher: str | None
    pp_first: int | None = Field(None, ge=0)
    pp_last: int | None = Field(None, ge=0)
    edp: int = Field(ge=1, description="expert data parallel degree: world / (etp * ep * pp)")
    world: int = Field(ge=1, description="GPUs the plan uses")

    def parallel_config(self) -> ParallelConfig:
        """The ``ParallelConfig`` of these degrees (derived fields left out)."""
        return ParallelConfig.model_validate({k: getattr(self, k) for k in ParallelConfig.model_fields})


class PlacementPart(_Strict):
    order: str
    gpus_per_domain: int | None
    rank_to_gpu: list[int] = Field(description="rank r runs on healthy GPU rank_to_gpu[r] (cluster.gpus() order)")
    hosts: list[str]
    local_ranks: list[int]
    domains: dict[str, int] = Field(description="NVLink domains the worst group of each axis spans")
    domains_used: int
    shape: LaunchShape | None = Field(None, description="what the plan needs from an allocation, independent of "
                                                        "host names (planner.cost.shape; absent in older plans)")


class GoodputPart(_Strict):
    """The plan's goodput (``planner.cost.goodput``, docs/resilience.md): tokens/s once failures,
    checkpoints and restarts are counted; every field follows from the others by the formulas there."""

    goodput_tokens_per_s: float = Field(description="tokens_per_s * effective_fraction")
    effective_fraction: float = Field(description="1 - checkpoint_share - failure_share (at least 0)")
    tokens_per_s: float
    interruptions_per_day: float = Field(description="expected job interruptions per day (86400 / mtbf_h / 3600)")
    mtbf_h: float
    checkpoint_gb: float = Field(description="weights and optimizer state written per checkpoint (1e9 bytes)")
    checkpoint_write_s: float = Field(description="checkpoint_gb / (storage GB/s per GPU * GPUs)")
    interval_s: float = Field(description="checkpoint interval (interval_rule: young | daly | fixed)")
    interval_rule: str
    restart_s: float
    repair_h: float
    lost_per_failure_s: float = Field(description="interval_s / 2 + restart_s + repair cost without a spare, per interruption")
    checkpoint_share: float = Field(description="checkpoint_write_s / interval_s")
    failure_share: float
    spare_hosts_per_domain: int = Field(description="whole spare hosts (trays) of the least-spared NVLink domain used")
    no_spare_share: float = Field(description="share of hardware interruptions that find no spare host")
    rates: str = Field(description="the failure-rate set (planner/data/failure_rates.yaml)")
    carried_over: bool = Field(description="the rates were observed on another GPU generation")
    assumed: list[str] = Field(description="inputs that are assumptions rather than published figures")


class PlanEntryPart(_Strict):
    label: str
    config: ConfigPart
    prediction: Prediction = Field(description="planner.cost.prediction.Prediction, its document part")
    placement: PlacementPart
    goodput: GoodputPart | None = None
    lead_over_next: float | None = None
    within_uncertainty: bool | None = None


class SolverPart(BaseModel):
    """How the plans were found: the result (status, objective, proven bound, gap, engine) and the
    search's diagnostics. Diagnostics a later version adds are kept as written (extra fields allowed
    here only)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    status: str = Field(description="OPTIMAL (proven) | FEASIBLE (time limit) | ...")
    wall_s: float
    objective: float = Field(description="the best plan's value of objective_name")
    objective_name: ObjectiveName
    bound: float | None = Field(description="proven bound on the objective")
    gap: float | None = None
    method: Method
    solve_s: float | None = None
    build_s: float | None = None
    evaluated_exactly: int | None = None
    cpsat_s: float | None = None
    bands: int | None = None
    statuses: list[str] | None = None
    memory_cuts: int | None = None
    layouts_in_space: float | None = None
    variables: int | None = None
    constraints: int | None = None
    program_vs_predict_max_rel_err: float | None = None
    min_world: int | None = None
    space: dict[str, list[Any]] | None = Field(None, description="the values each decision variable could take")
    layouts: list[list[int]] | None = Field(None, description="[pp, vpp, split] of each pipeline layout priced")
    notes: list[str] | None = None
    optimizer_offload: dict[str, Any] | None = Field(
        None, description="set when plan chose Megatron's optimizer CPU offload: fraction, needed_to_fit, and "
                          "without (why no layout fits without it)")


class HeaderPart(_Strict):
    """What the answer is for, as ``topoplan plan`` prints it above the plans (CLI documents only)."""

    stack: str
    trainer: Trainer
    model: str
    cluster: str
    gpus_offered: int | list[int] = Field(description="GPUs offered (scale: one count per size)")
    gpus_used: int | list[int] | None
    precision: str
    seq_len: int
    global_batch: int


class ComparedPart(_Strict):
    """``plan --compare LAYOUT``: that layout priced on the same job, and the best plan's lead over it."""

    label: str
    world: int
    prediction: dict[str, Any] = Field(description="the layout's Prediction (its document part; plans written "
                                                   "before it was hold a subset of its fields)")
    plan_lead: float
    within_uncertainty: bool


class PlanDocument(_Strict):
    """The plan.json document (docs/architecture.md, "The plan document")."""

    version: Literal[1] = VERSION
    model: ModelPart
    cluster: Cluster
    training: TrainingPart
    plans: list[PlanEntryPart]
    solver: SolverPart
    header: HeaderPart | None = None
    compare: ComparedPart | None = None

    def dump(self) -> dict:
        """The JSON object again (what was read is what is written)."""
        return self.model_dump(mode="json", exclude_unset=True)


def load_document(doc, what: str = "plan.json") -> PlanDocument:
    """``doc`` (a PlanDocument, a dict or a path to a JSON file) as a PlanDocument; InputError with one
    line naming the field otherwise."""
    if isinstance(doc, PlanDocument):
        return doc
    if isinstance(doc, (str, Path)):
        path = Path(doc)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise not_utf8(path, exc, "plan document") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a readable JSON plan document ({exc}); write one with "
                             "'topoplan plan --save-plan'") from None
        what = str(path)
    if not isinstance(doc, dict):
        raise InputError(f"{what}: the document must be a JSON object written by 'topoplan plan --save-plan'")
    if doc.get("version", VERSION) != VERSION:
        raise InputError(f"{what}: field 'version' is {doc.get('version')!r} but this topoplan reads version "
                         f"{VERSION}; write the plan again with 'topoplan plan --save-plan'")
    try:
        return PlanDocument.model_validate(doc)
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, what) + "; write the plan again with 'topoplan plan --save-plan'") from None


def plan_schema() -> dict:
    """The JSON Schema of the plan document (generated from ``PlanDocument``)."""
    schema = PlanDocument.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://github.com/topoplan/topoplan/planner/data/plan.schema.json"
    return schema


def schema_text() -> str:
    return json.dumps(plan_schema(), indent=1, sort_keys=True) + "\n"


# ------------------------------------------------------------------------------------------ scale
class ScaleRow(_Strict):
    """The best plan at one GPU count (``planner.search.plan.scale``)."""

    gpus: int = Field(ge=1, description="GPUs offered")
    world: int = Field(ge=1, description="GPUs the plan uses")
    layout: str
    gbs: int = Field(ge=1)
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    step_time_s: float
    breakdown: dict[Term, float]
    status: str
    wall_s: float
    retention: float = Field(description="TFLOP/s per GPU against the smallest size's")
    goodput_tokens_per_s: float | None = Field(None, description="tokens_per_s once failures are counted")
    effective_fraction: float | None = None
    interruptions_per_day: float | None = None
    goodput_retention: float | None = Field(None, description="goodput per GPU against the smallest size's")


class ScaleDocument(_Strict):
    """What ``topoplan scale --json`` prints (and ``--report`` draws)."""

    model: str
    cluster: str
    rows: list[ScaleRow] = Field(min_length=1)
    header: HeaderPart | None = None

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_unset=True)


def load_scale(doc, what: str = "scale document") -> ScaleDocument:
    """``doc`` as a ScaleDocument; InputError with one line naming the field otherwise."""
    if isinstance(doc, ScaleDocument):
        return doc
    if not isinstance(doc, dict):
        raise InputError(f"{what}: expected the JSON object 'topoplan scale --json' prints")
    try:
        return ScaleDocument.model_validate(doc)
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, what) + "; pass the output of 'topoplan scale --json'") from None


# ------------------------------------------------------------------------------------------ launch
class LaunchPlacement(BaseModel):
    """What the launch files need of a plan's placement."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    order: str = "tp-cp-ep-dp-pp"
    gpus_per_domain: int | None = None
    rank_to_gpu: list[int] = Field(min_length=1)
    hosts: list[str] | None = None
    local_ranks: list[int] | None = None
    shape: LaunchShape | None = None


class LaunchEntry(BaseModel):
    """What the launch files need of a plan entry: its degrees (``ParallelConfig``'s fields; the
    derived ``dp``/``edp``/``world`` are checked against the placement) and its placement."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    config: dict[str, Any]
    placement: LaunchPlacement


class LaunchDocument(BaseModel):
    """The part of a plan document that ``emit`` reads: every ``PlanDocument`` is one, and so is a
    document that carries a layout chosen by hand (no prediction, no solver)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal[1] = VERSION
    model: ModelPart
    cluster: Cluster
    training: TrainingPart
    plans: list[LaunchEntry]


def load_launch(doc, what: str = "plan.json") -> LaunchDocument:
    """``doc`` as a LaunchDocument; InputError with one line naming the field otherwise."""
    if isinstance(doc, PlanDocument):
        doc = doc.dump()
    if not isinstance(doc, dict):
        raise InputError(f"{what}: the document must be a JSON object written by 'topoplan plan --save-plan'")
    if doc.get("version", VERSION) != VERSION:
        raise InputError(f"{what}: field 'version' is {doc.get('version')!r} but this topoplan reads version "
                         f"{VERSION}; write the plan again with 'topoplan plan --save-plan'")
    if not isinstance(doc.get("plans"), list) or not doc["plans"]:
        raise InputError(f"{what}: field 'plans' is missing or empty; nothing to emit (write a plan that found a "
                         "feasible layout with 'topoplan plan --save-plan')")
    doc = _with_hyperparams(doc, what)
    try:
        return LaunchDocument.model_validate(doc)
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, what) + "; write the plan again with 'topoplan plan --save-plan'") from None


# ModelSpec fields a plan.json written before topoplan carried the config's hyperparameters lacks (issue 23)
HYPERPARAMS = ("rope_theta", "rope_scaling", "partial_rotary_factor", "norm_eps", "router_score", "expert_bias",
               "router_scale", "norm_topk_prob", "qk_l2_norm", "activation_clamp")


def _with_hyperparams(doc: dict, what: str) -> dict:
    """An older plan.json's model spec completed with its config's hyperparameters, read again from the
    catalog (by name) or the config.json it names; refused when neither is there (the defaults would
    train another model)."""
    spec = (doc.get("model") or {}).get("spec")
    if not isinstance(spec, dict) or "rope_theta" in spec:
        return doc
    name, source = str(spec.get("name", "")), str(spec.get("source", ""))
    if name in catalog():
        fresh = load_model(name)
    elif source and Path(source).is_file():
        fresh = load_model(source)
    else:
        raise InputError(f"{what}: field 'model.spec.rope_theta' is missing (written by an older topoplan) and "
                         f"{source or name!r} cannot be read again; write the plan again with 'topoplan plan "
                         "--save-plan' (its model then carries the config's rope base, norm eps and router)")
    extra = {k: v for k, v in fresh.model_dump(mode="json").items() if k in HYPERPARAMS}
    return {**doc, "model": {**doc["model"], "spec": {**spec, **extra}}}
