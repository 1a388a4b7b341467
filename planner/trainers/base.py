"""What a trainer is to the rest of topoplan: one :class:`Trainer` object per trainer package.

The object is plain data (names, default stack, the recipe knobs it has, how its step is priced, which
layouts the search offers it) plus the trainer's heavier parts, loaded by module name on first use so
that this vocabulary layer imports none of them (docs/architecture.md, "Trainers as packages"):

=========  =====================================  =================================================
part       module                                 layer (tests/test_layers.py)
=========  =====================================  =================================================
recipe     ``planner.trainers.<name>.recipe``     vocabulary: its Recipe fields and their off values
rules      ``planner.trainers.<name>.rules``      vocabulary: RULES, effective_recipe
families   ``planner.trainers.<name>.families``   vocabulary: the model families it cannot build
emit       ``planner.trainers.<name>.emit``       output: ``files(ctx)`` for each emitter it owns
readback   ``planner.trainers.<name>.readback``   output: launch files back into a layout
logs       ``planner.trainers.<name>.logs``       cost: the rank-log parser (detect, parse)
=========  =====================================  =================================================

A caller asks for a part only from a layer at or below the part's own (the emitters from the output
layer, the log parser from calibration); ``tests/test_trainers.py`` checks each part's layer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Literal

# How the trainer fuses the elementwise work of a layer, which the step time prices
# (``planner.cost.steptime.recipe_pricing``): Transformer Engine under CUDA graphs (Megatron),
# torch.compile of the blocks (TorchTitan), XLA (MaxText: always fused).
Fusion = Literal["cuda_graphs", "torch_compile", "xla"]


@dataclass(frozen=True)
class Pricing:
    """The pricing regime: what the cost model reads of the trainer (docs/steptime.md, docs/memory.md)."""

    grad_bytes: float        # bytes per gradient element (Megatron-Bridge recipes: bf16 gradients)
    master_weights: bool     # BF16 weights with FP32 master copies in the optimizer (else FP32 weights)
    fusion: Fusion
    host_floor: bool         # the CPU launch floor of terms/host.py (its call counts are Megatron's)
    graph_buffers: bool      # per-layer CUDA graphs keep static buffers (planner.cost.memory.cuda_graph_bytes)

    def fused(self, recipe, cuda_graphs: bool) -> bool:
        """Whether the layer's elementwise work runs fused for an effective ``recipe``: under CUDA graphs
        (Megatron), with torch.compile of the blocks (TorchTitan, whose CUDA graphs are not priced), always
        under XLA (MaxText, whose eager factor equals the fused one: ``Training.cuda_graphs`` as given)."""
        if self.fusion == "cuda_graphs":
            return recipe.cuda_graph_impl != "none"
        if self.fusion == "torch_compile":
            return bool(recipe.torch_compile)
        return cuda_graphs


@dataclass(frozen=True)
class Search:
    """Which layouts the search offers the trainer (planner.search.space)."""

    selective_recompute: bool      # Megatron's --recompute-modules beyond core_attn
    flex_dispatchers: bool         # DeepEP / HybridEP token dispatchers
    expert_tp: bool                # an expert tensor-parallel degree apart from TP (etp=1 offered)
    fsdp: tuple[bool, ...]         # FSDP values offered
    equal_slices: bool             # every NVLink domain gets the same GPUs (MaxText's mesh)


@dataclass(frozen=True)
class Launch:
    """How slurm/task.sh and the Kubernetes pods start one emitter's files (planner.output.emit.slurm, k8s);
    the command line itself is the emitter module's ``task_command(ctx)``."""

    home: tuple[str, str] | None = None   # (variable naming its installation, what that is); None: a package
    per_host: bool = False                # one process per host (JAX), not one per GPU; no torchrun
    mock_data: str = ""                   # the argument that selects synthetic data, when it needs one
    node_env: str = ""                    # shell that a per-host process needs before it starts


@dataclass(frozen=True)
class Trainer:
    name: str                                  # Training.trainer, plan.json training.trainer
    title: str                                 # for messages: "Megatron-LM"
    default_stack: str                         # the stack profile it is priced with by default
    knobs: tuple[str, ...]                     # planner.config.Recipe fields it has
    pricing: Pricing
    search: Search
    emitters: dict[str, str]                   # --trainer/--emit name -> module of the package ("emit")
    refuse_recipe: Callable[[object], str | None] = field(repr=False)   # a Recipe it cannot run, or None
    parts: tuple[str, ...] = ("rules", "emit", "logs")
    aliases: dict[str, str] = field(default_factory=dict)   # other spellings of its emitters on --trainer
    launch: dict[str, Launch] = field(default_factory=dict)  # emitter -> how Slurm / k8s start its files
    # the planner.config.Recipe fields it owns: name -> (type, pydantic Field), from its ``recipe`` module
    recipe_fields: dict = field(default_factory=dict, repr=False)
    recipe_off: dict = field(default_factory=dict, repr=False)   # each of those fields as a trainer without it runs

    @property
    def package(self) -> str:
        return f"planner.trainers.{self.name}"

    def part(self, name: str) -> ModuleType:
        """The package's module ``name`` (loaded on first use; KeyError for a part it does not have)."""
        if name not in self.parts and name not in self.emitters.values():
            raise KeyError(f"trainer {self.name} has no part {name!r}")
        return importlib.import_module(f"{self.package}.{name}")

    # -- rules and recipe (vocabulary) --------------------------------------------------------
    @property
    def rules(self) -> tuple:
        """Every rule (planner.rules.Rule) the trainer checks, shared ones first."""
        return self.part("rules").RULES

    def effective_recipe(self, model, config, training):
        """The recipe as the trainer runs ``config`` (``planner.rules.effective_recipe``)."""
        return self.part("rules").effective_recipe(model, config, training)

    def has(self, knob: str) -> bool:
        return knob in self.knobs

    def cannot_build(self, model, seq_len: int = 0) -> str | None:
        """Why the trainer cannot build ``model``'s family as its config says (its ``families`` part), or None."""
        return self.part("families").why_not(model, seq_len) if "families" in self.parts else None

    # -- launch files (output) -----------------------------------------------------------------
    def emitter(self, name: str | None = None) -> ModuleType:
        """The module that writes emitter ``name``'s files (default: the trainer's own)."""
        return self.part(self.emitters[name or self.name])

    def emit(self, ctx, name: str | None = None) -> dict[str, str]:
        return self.emitter(name).files(ctx)

    def read_back(self, path, model, world=None, *, stack=None):
        """Its emitted files at ``path`` -> (ParallelConfig, Training, order)."""
        return self.part("readback").read(path, model, world, stack=stack)

    # -- logs (calibration) --------------------------------------------------------------------
    @property
    def logs(self) -> ModuleType:
        return self.part("logs")

    def parse_log(self, text: str, source: str) -> dict:
        return self.logs.parse(text, source)


def no_layer_offload(recipe, trainer: str) -> str | None:
    """The refusal of Megatron's layer-wise activation offloading by a trainer that has none."""
    if recipe.cpu_offload_layers:
        return (f"recipe.cpu_offload_layers={recipe.cpu_offload_layers}: {trainer} has no layer-wise activation "
                "offloading to the CPU (Megatron's --cpu-offloading-num-layers); leave it unset")
    return None


def no_optimizer_offload(recipe, trainer: str, own: str) -> str | None:
    """The refusal of Megatron's optimizer CPU offload (``Recipe.optimizer_offload_fraction``) by a trainer
    whose own offload (``own``: what it is and why topoplan does not price it) is another setting."""
    if recipe.optimizer_offload_fraction or recipe.overlap_cpu_optimizer_d2h_h2d:
        return (f"recipe.optimizer_offload_fraction={recipe.optimizer_offload_fraction}: {trainer} has no "
                f"counterpart of Megatron's --optimizer-cpu-offload ({own}); leave it unset or plan for megatron")
    return None


def foreign_knob(field_name: str, value, owner: str, flag: str, trainer: str, why: str) -> str:
    """The refusal of a recipe setting another trainer owns (config.Training names the field)."""
    return (f"recipe.{field_name}={value}: {owner}'s {flag} has no {trainer} counterpart ({why}); leave it unset")
