"""The rules every trainer shares, and the one door to each trainer's own.

Each rule is a named predicate over (model, layout, training, world size). Messages follow the
trainer's wording where it has one (megatron-core 0.19.2 ``validate_args`` / ``TransformerConfig`` /
``initialize_model_parallel``; torchtitan 0.3.0 ``ParallelDims``), with the numbers involved, so a
refusal reads like the trainer's own. The rules below hold for every trainer; each trainer package
(``planner.trainers.<name>.rules``) lists its own ``RULES`` (these first) and its ``effective_recipe``.
Sources: megatron-core 0.19.2 ``megatron/training/arguments.py::validate_args``,
``megatron/core/transformer/transformer_config.py`` and ``megatron/core/parallel_state.py::initialize_model_parallel``;
torchtitan 0.3.0 ``torchtitan/distributed/parallel_dims.py`` (``ParallelDims._validate``, ``build_mesh``).

The model only needs these attributes: ``num_layers``, ``num_attention_heads``, ``num_kv_heads``,
``num_experts`` (0 for dense) and ``mtp_layers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planner.config import ParallelConfig, Recipe, Training
from planner.errors import InputError
from planner.trainers import get_trainer


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str


@dataclass(frozen=True)
class Rule:
    """A trainer rule: ``fn(model, config, training, world)`` returns a message when the layout breaks
    it, None when it is satisfied. ``applies(model, training)`` (optional): the rule reads the layout
    only when it holds (a recipe setting asked for explicitly); otherwise every layout passes, and the
    search's rule tables (``planner.search.space.rule_tables``) allow every tuple without building one."""

    name: str
    fn: Callable[..., str | None]
    applies: Callable[..., bool] | None = None

    def check(self, model, config, training, world) -> str | None:
        if self.applies is not None and not self.applies(model, training):
            return None
        return self.fn(model, config, training, world)


def _world_div_model_parallel(m, c, t, world):
    mp = c.tp * c.pp * c.cp
    if world % mp:
        return f"world size ({world}) is not divisible by total_model_size (total_model_size={mp}) [tp*pp*cp]"


def _dp_matches(m, c, t, world):
    if c.dp is not None and c.tp * c.pp * c.cp * c.dp != world:
        return f"tp({c.tp}) * pp({c.pp}) * cp({c.cp}) * dp({c.dp}) != world size ({world})"


def _heads_div_tp(m, c, t, world):
    if m.num_attention_heads % c.tp:
        return f"num_attention_heads ({m.num_attention_heads}) must be a multiple of tensor_model_parallel_size ({c.tp})"


def _kv_heads_div_tp(m, c, t, world):
    if m.num_kv_heads % c.tp:
        return f"num_query_groups ({m.num_kv_heads}) must be a multiple of tensor_model_parallel_size ({c.tp})"


def _mixer_heads_div_tp(m, c, t, world):
    """Gated DeltaNet and Mamba-2 split their heads over TP and CP (megatron-core 0.19.2
    transformer_config.py:1375-1380 for GDN; ssm/mamba_mixer.py:260-268 and mamba_context_parallel.py:106
    for Mamba). Models without these mixers pass."""
    g, mb = getattr(m, "gdn", None), getattr(m, "mamba", None)
    if g is not None:
        for name, n in (("linear_num_key_heads", g.num_key_heads), ("linear_num_value_heads", g.num_value_heads)):
            if n % (c.tp * c.cp):
                return f"{name}={n} must be a multiple of tensor_model_parallel_size * context_parallel_size ({c.tp * c.cp})"
    if mb is not None:
        if mb.num_heads % (c.tp * c.cp):
            return f"nheads ({mb.num_heads}) must be evenly divisible by tp_size * cp_size ({c.tp * c.cp})"
        if mb.n_groups % c.tp:
            return f"ngroups ({mb.n_groups}) must be evenly divisible by tp_size ({c.tp})"
        local = mb.n_groups // c.tp
        if c.cp > 1 and (c.cp % local if local < c.cp else local % c.cp):
            return f"ngroups/tp_size ({local}) and cp_size ({c.cp}) must divide one another"


def _experts_div_ep(m, c, t, world):
    if c.ep > 1 and not m.num_experts:
        return f"expert_model_parallel_size ({c.ep}) > 1 needs a MoE model (num_moe_experts is not set)"
    if c.ep > 1 and m.num_experts % c.ep:
        return f"Number of experts ({m.num_experts}) should be a multiple of expert model parallel_size ({c.ep})"


def _pipeline_stages(m, c, t, world):
    stages = c.pp * c.vpp
    layers = m.num_layers
    # A Megatron layout may give the embedding and the loss a stage of their own
    # (E|(t|)*126L: Llama3.1-405B PP16 VPP8 in Megatron-Bridge 26.04-26.08), so up to layers + 2.
    if stages > layers + 2:
        return (f"pipeline stages pp*vpp ({c.pp}*{c.vpp}={stages}) exceed the decoder layers ({layers}) "
                f"plus the embedding and loss stages")
    if c.pp_first is not None or c.pp_last is not None:
        first = c.pp_first or 0
        last = c.pp_last or 0
        if c.pp < 2:
            return "pp_first/pp_last need pp >= 2"
        if first + last > layers:
            return f"pp_first ({first}) + pp_last ({last}) exceed the decoder layers ({layers})"


def _seq_div_cp(m, c, t, world):
    if c.cp > 1 and t.seq_len % (2 * c.cp):
        return f"seq_length ({t.seq_len}) must be divisible by 2 * context_parallel_size ({2 * c.cp})"


def _gbs_div(m, c, t, world):
    dp = c.dp_for(world) if world % c.model_parallel == 0 else None
    if dp and t.global_batch % (c.mbs * dp):
        return (f"global batch size ({t.global_batch}) is not divisible by micro batch size ({c.mbs}) "
                f"times data parallel size ({dp})")


def num_microbatches(c, t, world) -> int | None:
    """Micro-batches per step and pipeline, ``M = GBS / (MBS * DP)`` with ``DP = world / (tp*pp*cp)``:
    megatron-core's ConstantNumMicroBatchesCalculator and torchtitan's ``local_batch_size //
    pipeline_parallel_microbatch_size`` (local_batch_size = GBS / DP). None where it is not a whole
    number (rule ``gbs_div_mbs_dp`` refuses that layout)."""
    if world % c.model_parallel:
        return None
    dp = c.dp_for(world)
    if not dp or t.global_batch % (c.mbs * dp):
        return None
    return t.global_batch // (c.mbs * dp)


def aux_loss_free(model) -> bool:
    """The model routes with an aux-loss-free expert bias: its config's ``topk_method: noaux_tc`` with a
    sigmoid router (ModelSpec.expert_bias; DeepSeek-V3, Kimi-K2, GLM-4.5)."""
    return bool(getattr(model, "num_experts", 0)) and bool(getattr(model, "expert_bias", False))


def offload_layers(training) -> int:
    """Decoder layers whose activations Megatron offloads to the CPU (``Recipe.cpu_offload_layers``; 0 = off)."""
    return int(getattr(training.recipe, "cpu_offload_layers", None) or 0)


def optimizer_offload(training) -> float:
    """The share of the distributed optimizer's state Megatron keeps and updates on the CPU
    (``Recipe.optimizer_offload_fraction``, --optimizer-offload-fraction; 0.0 = off, None counts as off)."""
    return float(getattr(training.recipe, "optimizer_offload_fraction", None) or 0.0)


def optimizer_offload_overlap(training) -> bool:
    """Whether the offloaded optimizer overlaps its gradient copies, CPU step and parameter copies
    (``Recipe.overlap_cpu_optimizer_d2h_h2d``; None = on whenever the optimizer is offloaded, as
    megatron-core's docs recommend)."""
    v = getattr(training.recipe, "overlap_cpu_optimizer_d2h_h2d", None)
    return bool(optimizer_offload(training)) and (v is None or bool(v))


def quantised_params(recipe: Recipe) -> bool:
    """Whether the linear layers' parameters ARE their quantised tensors (FP8 or NVFP4 parameters: no BF16 weight,
    a low-precision parameter all-gather), read off an effective recipe (:func:`effective_recipe`). The one
    question memory, step time and the plan program ask; the two recipe settings exist apart because
    megatron-core and Megatron-Bridge spell them apart."""
    return bool(recipe.fp8_param_gather or recipe.fp4_param_gather)


# The rules every trainer checks, in groups so that a trainer's own rules on the same degrees can sit
# between them (the first broken rule is the one reported).
SHARED_DEGREES: tuple[Rule, ...] = (
    Rule("world_div_model_parallel", _world_div_model_parallel),
    Rule("dp_matches_world", _dp_matches),
    Rule("heads_div_tp", _heads_div_tp),
)
# TorchTitan's and MaxText's KV rule (Megatron has its own, planner.trainers.megatron.rules), and the
# experts rule every trainer checks after it
KV_HEADS_DIV_TP = Rule("kv_heads_div_tp", _kv_heads_div_tp)
EXPERTS_DIV_EP = Rule("experts_div_ep", _experts_div_ep)
MIXER_HEADS_DIV_TP_CP = Rule("mixer_heads_div_tp_cp", _mixer_heads_div_tp)   # GDN / Mamba heads, every trainer
# what every trainer checks right after its KV-groups rule
SHARED_HEADS_EXPERTS: tuple[Rule, ...] = (MIXER_HEADS_DIV_TP_CP, EXPERTS_DIV_EP)
SHARED_SCHEDULE: tuple[Rule, ...] = (
    Rule("pipeline_stages", _pipeline_stages),
    Rule("seq_div_2cp", _seq_div_cp),
    Rule("gbs_div_mbs_dp", _gbs_div),
)


def effective_recipe(model, config, training) -> Recipe:
    """The recipe as the trainer runs ``config``: every auto field resolved, knobs the trainer lacks
    off (False / none), settings the layout makes meaningless normalised (no MoE fusions on a dense
    model, no FSDP flavour without FSDP). Deterministic and idempotent: the effective recipe of a
    Training holding an effective recipe is itself. Explicit settings are kept as given (the rules
    refuse the layouts they do not fit). Each trainer's ``rules.effective_recipe`` decides."""
    return get_trainer(training.trainer).effective_recipe(model, config, training)




def violations(model, config: ParallelConfig, training: Training, world: int,
               trainer: str | None = None) -> list[Violation]:
    """Every rule of ``trainer`` (default: ``training.trainer``) that the layout breaks."""
    out = []
    for rule in get_trainer(trainer or training.trainer).rules:
        msg = rule.check(model, config, training, world)
        if msg:
            out.append(Violation(rule.name, msg))
    return out


def check(model, config: ParallelConfig, training: Training, world: int, trainer: str | None = None) -> None:
    """Raise ``InputError`` naming the first broken rule (exit code 2 on the CLI)."""
    v = violations(model, config, training, world, trainer)
    if v:
        raise InputError(f"{config.short()}: {v[0].message} (rule {v[0].rule})")
