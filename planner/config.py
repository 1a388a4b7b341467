"""The parallel layout and the training setup: small validated values shared by every module.

``ParallelConfig`` holds the degrees a user (or the solver) chooses. Data parallelism is derived
from the world size: ``dp = world / (tp * cp * pp)`` and, on Megatron's expert grid (MoE parallel
folding), ``edp = world / (etp * ep * pp)``. The trainers' divisibility rules live in
``planner.rules``; this module only checks what makes a value meaningless on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from planner.trainers import DEFAULT, NAMES, RECIPE_FIELDS, TRAINERS as _BY_NAME, get_trainer

PRECISIONS = ("bf16", "fp8", "fp8-block", "mxfp8", "nvfp4")
Precision = Literal["bf16", "fp8", "fp8-block", "mxfp8", "nvfp4"]

# Megatron's --recompute-modules vocabulary (megatron-core 0.19.2).
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe", "moe_act", "layernorm", "shared_experts")
DISPATCHERS = ("alltoall", "allgather", "flex-deepep", "flex-hybridep")
TRAINERS = NAMES   # the trainer packages (planner.trainers); each owns its rules, recipe and files

# -- memory headroom (issue 11 item 6) -------------------------------------------------------------
# The share of HBM a plan leaves free for what planner.cost.memory does not model (docs/memory.md).
DEFAULT_HEADROOM = "5%"


def parse_headroom(text: str) -> tuple[float, float]:
    """``"5%"`` -> (0.05, 0), ``"8GiB"`` -> (0, 8), ``"5%,4GiB"`` -> (0.05, 4) (the larger applies),
    ``"0"`` -> (0, 0). Raises ValueError naming the accepted forms."""
    share, gib = 0.0, 0.0
    parts = [p.strip() for p in str(text).replace(" ", "").lower().split(",") if p.strip()]
    if not parts:
        raise ValueError("--memory-headroom is empty; use a share of HBM like 5%, GiB like 8GiB, or both: 5%,4GiB")
    for p in parts:
        try:
            if p.endswith("%"):
                v = float(p[:-1]) / 100.0
                share = max(share, v)
            elif p.endswith("gib") or p.endswith("gb"):
                v = float(p[:-3] if p.endswith("gib") else p[:-2])
                gib = max(gib, v)
            elif float(p) == 0.0:
                v = 0.0
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"--memory-headroom {text!r}: use a share of HBM like 5%, GiB like 8GiB, "
                             "or both: 5%,4GiB (the larger applies); 0 for none") from None
        if v < 0:
            raise ValueError(f"--memory-headroom {text!r}: a share or GiB cannot be negative")
    if share >= 1.0:
        raise ValueError(f"--memory-headroom {text!r}: the share must be in [0%, 100%) and the GiB >= 0")
    return share, gib


@lru_cache(maxsize=1024)   # pure; the search builds thousands of ParallelConfigs from a few strings
def normalize_recompute(value: str) -> str:
    """Canonical recompute string: ``none``, ``full`` or a sorted ``+``-joined module list.

    Accepts ``none``, ``full``, ``selective`` (Megatron's default selective set: ``core_attn``) and
    module lists separated by ``,`` ``+`` or spaces, e.g. ``mla_up_proj,moe_act``.
    """
    v = (value or "none").strip().lower()
    if v in ("", "none", "no", "off"):
        return "none"
    if v == "full":
        return "full"
    if v == "selective":
        return "core_attn"
    parts = sorted({p for p in v.replace(",", " ").replace("+", " ").split() if p})
    bad = [p for p in parts if p not in RECOMPUTE_MODULES]
    if bad:
        raise ValueError(
            f"unknown recompute module {bad[0]!r}; use none, full, selective or modules from "
            + ", ".join(RECOMPUTE_MODULES)
        )
    return "+".join(parts)


def data_parallel(world: int, tp: int, cp: int, pp: int) -> int:
    """Data parallel degree on the attention grid, world / (tp * cp * pp): the one formula
    (``ParallelConfig.dp_for`` and the rank-order strides, ``planner.cost.placement.axis_strides``)."""
    return world // (tp * cp * pp)


def expert_data_parallel(world: int, etp: int, ep: int, pp: int) -> int:
    """Expert data parallel degree on Megatron's expert grid, world / (etp * ep * pp)."""
    return world // (etp * ep * pp)


class ParallelConfig(BaseModel):
    """One parallel layout. ``etp`` None means the trainer default (Megatron: ETP = TP).

    ``dp`` None means "all the GPUs the cluster offers": dp = world / (tp*cp*pp). ``pp_first`` /
    ``pp_last`` are the decoder layers on the first / last pipeline stage when the split is uneven
    (Megatron's pipeline layout); None lets the pipeline module balance them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(1, ge=1, description="tensor parallel degree")
    pp: int = Field(1, ge=1, description="pipeline parallel degree")
    vpp: int = Field(1, ge=1, description="virtual pipeline stages per pipeline rank (1 = none)")
    cp: int = Field(1, ge=1, description="context parallel degree")
    ep: int = Field(1, ge=1, description="expert parallel degree")
    etp: int | None = Field(None, ge=1, description="expert tensor parallel degree (None = TP)")
    dp: int | None = Field(None, ge=1, description="data parallel degree (None = derived from world size)")
    mbs: int = Field(1, ge=1, description="micro-batch size")
    fsdp: bool = Field(False, description="fully sharded data parallel instead of the distributed optimizer")
    recompute: str = Field("none", description="none | full | '+'-joined selective modules")
    dispatcher: str | None = Field(None, description="MoE token dispatcher: " + ", ".join(DISPATCHERS)
                                   + " (None = the stack profile's default)")
    pp_first: int | None = Field(None, ge=0, description="decoder layers on the first pipeline stage")
    pp_last: int | None = Field(None, ge=0, description="decoder layers on the last pipeline stage")

    @field_validator("recompute", mode="before")
    @classmethod
    def _recompute(cls, v):
        return normalize_recompute(str(v))

    @field_validator("dispatcher")
    @classmethod
    def _dispatcher(cls, v):
        if v is not None and v not in DISPATCHERS:
            raise ValueError(f"unknown dispatcher {v!r}; use one of {', '.join(DISPATCHERS)}")
        return v

    @model_validator(mode="after")
    def _vpp(self):
        if self.vpp > 1 and self.pp < 2:
            raise ValueError(f"vpp={self.vpp} needs pp >= 2 (virtual stages interleave over pipeline ranks)")
        return self

    @property
    def etp_eff(self) -> int:
        """Expert tensor parallel degree as the trainer applies it (Megatron default ETP = TP)."""
        return self.tp if self.etp is None else self.etp

    @property
    def model_parallel(self) -> int:
        """GPUs in one model replica of the attention grid: tp * cp * pp."""
        return self.tp * self.cp * self.pp

    def world(self, default_world: int | None = None) -> int:
        """World size: tp*cp*pp*dp when dp is set, else ``default_world``."""
        if self.dp is not None:
            return self.model_parallel * self.dp
        if default_world is None:
            raise ValueError("dp is not set and no world size was given")
        return default_world

    def dp_for(self, world: int) -> int:
        """Data parallel degree on the attention grid: world / (tp * cp * pp). The one formula (with
        ``edp_for``); ``on(world)`` checks that the grids fill the world."""
        return data_parallel(world, self.tp, self.cp, self.pp)

    def edp_for(self, world: int) -> int:
        """Expert data parallel degree on Megatron's expert grid: world / (etp * ep * pp)."""
        return expert_data_parallel(world, self.etp_eff, self.ep, self.pp)

    def on(self, world: int) -> "Layout":
        """This layout on ``world`` GPUs, with its derived degrees (ValueError if a grid does not fill
        the world exactly, or ``dp`` is set and disagrees)."""
        return Layout(self, world)

    @property
    def recompute_modules(self) -> tuple[str, ...]:
        if self.recompute in ("none", "full"):
            return ()
        return tuple(self.recompute.split("+"))

    def short(self) -> str:
        """Compact label, e.g. ``TP1 PP2 VPP8 EP32 MBS1``."""
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        if self.vpp > 1:
            parts.append(f"VPP{self.vpp}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"ETP{self.etp}")
        if self.dp is not None:
            parts.append(f"DP{self.dp}")
        if self.fsdp:
            parts.append("FSDP")
        parts.append(f"MBS{self.mbs}")
        if self.recompute != "none":
            parts.append(f"RC:{self.recompute}")
        return " ".join(parts)


@lru_cache(maxsize=16384, typed=True)
def parallel_config(tp: int, pp: int, vpp: int, cp: int, ep: int, etp: int | None, dp: int | None, mbs: int,
                    fsdp: bool, recompute: str, dispatcher: str | None, pp_first: int | None,
                    pp_last: int | None) -> ParallelConfig:
    """``ParallelConfig`` of these fields, validated once per distinct set: it is frozen, so one
    instance serves every caller. The search builds the same layouts over and over (every rule table,
    every plan of a scale sweep or of a refusal's GPU counts). ``typed``: ``1`` and ``True`` are
    different keys, so the cache returns what validation of these very values returns."""
    return ParallelConfig(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=dp, mbs=mbs, fsdp=fsdp,
                          recompute=recompute, dispatcher=dispatcher, pp_first=pp_first, pp_last=pp_last)


class RecipeBase(BaseModel):
    """The performance settings of a training recipe, named as Megatron-LM names them (megatron-core
    0.19.2 flags without the leading ``--``). Everything the step-time model prices is here, and each
    emitter writes exactly these settings (docs/emitters.md has the table of flags per trainer).

    ``None`` means *auto*: on wherever the trainer accepts it for the layout, off where one of its
    rules forbids it (``planner.rules.effective_recipe`` decides, deterministically, and the step
    time prices what it decides). An explicit ``True`` (or a graph implementation) is a requirement:
    a layout that the trainer would refuse with it breaks a rule (exit 2) and the search skips it.
    An explicit ``False`` switches it off everywhere. Defaults are what the recipes behind the
    profile's measurements used (NVIDIA's Megatron-Bridge 26.06-26.08 perf recipes; docs/steptime.md).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")


# The fields are declared by the trainer packages that own them (planner/trainers/<name>/recipe.py), in the
# order of the registry; this assembles them into one frozen model.
Recipe = create_model("Recipe", __base__=RecipeBase, __module__=__name__, __doc__=RecipeBase.__doc__,
                      **RECIPE_FIELDS)


@dataclass(frozen=True)
class Layout:
    """A ``ParallelConfig`` bound to the world it runs on, as torchtitan's ``ParallelDims``: one
    validated value that knows every degree. The attention grid is tp x cp x dp x pp and the expert
    grid (MoE parallel folding) etp x ep x edp x pp; both cover the world exactly."""

    config: ParallelConfig
    world: int

    def __post_init__(self):
        c, w = self.config, self.world
        if w < 1:
            raise ValueError(f"world size {w}: need at least one GPU")
        if w % c.model_parallel:
            raise ValueError(f"{w} GPUs are not divisible by tp*cp*pp = {c.model_parallel} ({c.short()})")
        if c.dp is not None and c.dp * c.model_parallel != w:
            raise ValueError(f"{c.short()} needs {c.dp * c.model_parallel} GPUs but the world has {w}")
        expert = c.etp_eff * c.ep * c.pp
        if w % expert:
            raise ValueError(f"{w} GPUs are not divisible by etp*ep*pp = {expert} ({c.short()})")

    @property
    def dp(self) -> int:
        return self.config.dp_for(self.world)

    @property
    def edp(self) -> int:
        return self.config.edp_for(self.world)

    @property
    def dense_replicas(self) -> int:
        """Ranks that hold the same dense weights (Megatron's dp-cp group): dp * cp."""
        return self.dp * self.config.cp


class Training(BaseModel):
    """The training setup a plan serves: sequence length, global batch (sequences), precision,
    software stack profile, the trainer the launch configs are for and its recipe settings.

    ``stack`` defaults to the trainer's own profile (``Trainer.default_stack``). ``cuda_graphs=False`` is
    the same as ``recipe.cuda_graph_impl="none"``; the two are kept consistent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: int = Field(4096, ge=1, description="sequence length in tokens")
    global_batch: int = Field(..., ge=1, description="global batch size in sequences")
    precision: Precision = Field("bf16", description="bf16 | fp8 | fp8-block | mxfp8 | nvfp4")
    stack: str = Field(get_trainer(DEFAULT).default_stack,
                       description="software stack profile name (default: the trainer's)")
    trainer: str = Field(DEFAULT, description=" | ".join(NAMES))
    cuda_graphs: bool = Field(True, description="the recipe captures CUDA graphs and fuses its elementwise "
                              "ops (NVIDIA's current Megatron-Bridge recipes); False: it runs eagerly, "
                              "priced with the profile's mem.elementwise_eager (= recipe.cuda_graph_impl none)")
    recipe: Recipe = Field(default_factory=Recipe, description="performance settings (planner.config.Recipe)")
    memory_headroom: str = Field(DEFAULT_HEADROOM, description="HBM a plan leaves free: a share like 5%, GiB "
                                 "like 8GiB, or both (5%,4GiB: the larger); planner.cost.memory.usable_hbm_gib")

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        trainer = data.get("trainer") or DEFAULT
        owner = _BY_NAME.get(trainer, get_trainer(DEFAULT))   # an unknown name is refused by _trainer below
        if data.get("stack") is None:
            data["stack"] = owner.default_stack
        recipe = data.get("recipe")
        if recipe is None:
            recipe = Recipe()
        elif isinstance(recipe, dict):
            recipe = Recipe.model_validate(recipe)
        impl = recipe.cuda_graph_impl
        if data.get("cuda_graphs") is False:
            if impl not in (None, "none"):
                raise ValueError(f"cuda_graphs=False contradicts recipe.cuda_graph_impl={impl!r}")
            recipe = recipe.model_copy(update={"cuda_graph_impl": "none"})
        elif impl == "none":
            data["cuda_graphs"] = False
        refusal = owner.refuse_recipe(recipe) if trainer in _BY_NAME else None
        if refusal:
            raise ValueError(refusal)
        data["recipe"] = recipe
        return data

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_case(cls, v):
        # "FP8", "MXFP8" are accepted as GPU names are: case does not matter
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("trainer")
    @classmethod
    def _trainer(cls, v):
        if v not in TRAINERS:
            raise ValueError(f"unknown trainer {v!r}; use one of {', '.join(TRAINERS)}")
        return v

    @field_validator("memory_headroom", mode="before")
    @classmethod
    def _headroom(cls, v):
        text = str(v).strip()
        parse_headroom(text)
        return text

    def headroom_gib(self, hbm_gib: float) -> float:
        """GiB of ``hbm_gib`` kept free: the larger of the share and the fixed amount."""
        share, gib = parse_headroom(self.memory_headroom)
        return max(share * hbm_gib, gib)
