"""TorchTitan 0.3.0's own rules and its effective recipe: no expert tensor parallelism, EP borrowing the
dp_shard x cp x tp ranks, the pipeline schedules its Trainer builds, CUDA graphs, and torch.compile of the model.
"""

from __future__ import annotations

from planner.config import Recipe
from planner.rules import KV_HEADS_DIV_TP, SHARED_DEGREES, SHARED_HEADS_EXPERTS, SHARED_SCHEDULE, Rule, num_microbatches
from planner.trainers import RECIPE_OFF
from planner.trainers.torchtitan import NAME


def torchtitan_schedule_problem(pp: int, vpp: int, m: int) -> str | None:
    """The pipeline-schedule constructors torchtitan 0.3.0 builds in Trainer.__init__ (torch
    ``torch.distributed.pipelining.schedules``), for the schedule topoplan emits: ``1F1B`` (vpp 1)
    needs M >= PP; ``Interleaved1F1B`` (vpp > 1) splits M into rounds = max(1, M // PP) and needs
    M % rounds == 0. (torchtitan only warns when M < PP * stages per rank.)"""
    if pp < 2:
        return None
    if vpp == 1:
        if m < pp:
            return (f"Number of microbatches ({m}) must be greater than or equal to the number of stages ({pp}) "
                    f"[1F1B; M = global batch / (micro batch * data parallel)]")
        return None
    rounds = max(1, m // pp)
    if m % rounds:
        return (f"Interleaved 1F1B requires the number of microbatches to be a multiple of the number of "
                f"rounds ({rounds}), but got {m} [rounds = max(1, M // pp={pp})]")
    return None


def _tt_schedule(m, c, t, world):
    mb = num_microbatches(c, t, world)
    if mb is None:
        return None
    msg = torchtitan_schedule_problem(c.pp, c.vpp, mb)
    if msg:
        msg += "; use a larger global batch, fewer data-parallel replicas or a smaller micro-batch"
    return msg


def _tt_no_etp(m, c, t, world):
    # torchtitan 0.3.0 has no expert tensor parallelism: with EP > 1 the EP mesh borrows the TP ranks
    # (efsdp = dp_shard * cp * tp / ep), so experts run unsharded, which is ETP = 1. A layout that
    # asks for experts sharded over TP (ETP = TP > 1, the Megatron default) is not what would run.
    if c.ep > 1 and c.etp_eff != 1:
        return (f"torchtitan has no expert tensor parallel degree: with ep={c.ep} experts run with etp=1, "
                f"not etp={c.etp_eff}; set etp=1")


def _tt_ep_divides(m, c, t, world):
    # ParallelDims.build_mesh: efsdp = dp_shard * cp * tp / ep must be a positive integer.
    if c.ep > 1:
        dp_shard = c.dp_for(world) if world % c.model_parallel == 0 else 0
        prod = dp_shard * c.cp * c.tp
        if prod == 0 or prod % c.ep:
            return (f"expert_parallel_degree ({c.ep}) must divide dp_shard({dp_shard}) * cp({c.cp}) * tp({c.tp}) "
                    f"= {prod}")



# TorchTitan 0.3.0 model compile (config.compile.enable and "model" in config.compile.components, the test its
# parallelize functions apply: models/llama3/parallelize.py:54-55). The catalog models whose registry function
# compiles the model: llama3_405b (models/llama3/config_registry.py:295-299, CompileConfig(enable=True,
# enable_async_tensor_parallel=True), default components ["model", "loss"]). llama3_8b, llama3_70b, qwen3_14b,
# qwen3_30b_a3b, gpt_oss_20b/120b keep the default CompileConfig(enable=False); deepseek_v3_671b compiles only the
# loss (deepseek_v3/config_registry.py:241). Every other model (a user's config.json, Qwen3-235B-A22B) starts from
# one of those uncompiled functions (planner.trainers.torchtitan.emit.BASE_CONFIG, USER_FAMILIES).
TORCHTITAN_COMPILED = frozenset({"llama3.1-405b"})


def torch_compile_on(m, c, t) -> bool:
    """Whether TorchTitan compiles the model's transformer blocks (``Recipe.torch_compile`` resolved: an
    explicit value as given, None as the model's TorchTitan 0.3.0 registry function). TorchTitan validates
    compile against no layout: only async TP (config/configs.py:303-310, CompileConfig.__post_init__) and
    memory-budget activation checkpointing (trainer.py:168-177) need it, and topoplan emits neither except the
    async TP llama3_405b's registry function carries, which the emitter switches off with compile. False for
    other trainers. The one resolution the step time and the TorchTitan emitter read."""
    if t.trainer != NAME:
        return False
    v = getattr(t.recipe, "torch_compile", None)
    if v is None:
        return m.name.lower() in TORCHTITAN_COMPILED
    return bool(v)


def graphs_problem(m, c, t, impl) -> str | None:
    """Why TorchTitan cannot capture CUDA graphs (training.disable_cuda_graphs false) for the layout."""
    if impl in (None, "none"):
        return None
    if c.pp > 1:
        return "CUDA graphs do not support pipeline parallelism yet. Set --training.disable_cuda_graphs."
    if m.num_experts and c.ep > 1:
        return "torchtitan CUDA graphs do not support the all-to-all EP dispatcher (set --training.disable_cuda_graphs)"
    return None


def graph_impl(m, c, t) -> str:
    """CUDA graphs as the layout runs them: an explicit impl stays (its rule judges it), auto is on where
    the layout allows graphs, else none (TorchTitan graphs the whole step: no modules)."""
    impl = t.recipe.cuda_graph_impl
    if impl is None:
        impl = "none" if graphs_problem(m, c, t, "transformer_engine") else "transformer_engine"
    return impl


def effective_recipe(model, config, training) -> Recipe:
    """The recipe as TorchTitan runs ``config`` (``planner.rules.effective_recipe``): its CUDA graphs and
    torch.compile resolved; Megatron's knobs off."""
    return Recipe(**{**RECIPE_OFF, "cuda_graph_impl": graph_impl(model, config, training),
                     "torch_compile": torch_compile_on(model, config, training)})


def _r_graphs(m, c, t, world):
    impl = t.recipe.cuda_graph_impl
    if impl not in (None, "none"):
        return graphs_problem(m, c, t, impl)


RULES: tuple[Rule, ...] = SHARED_DEGREES + (KV_HEADS_DIV_TP,) + SHARED_HEADS_EXPERTS + SHARED_SCHEDULE + (
    Rule("torchtitan_no_etp", _tt_no_etp),
    Rule("torchtitan_ep_divides", _tt_ep_divides),
    Rule("torchtitan_pipeline_microbatches", _tt_schedule),
    Rule("cuda_graphs_vs_recompute", _r_graphs),
)
