"""Trainers as packages (planner/trainers/, issue 22 item 3): each trainer's knowledge lives in its package and
the rest of the code asks the Trainer object.

Oracles: the source itself (no trainer name outside planner/trainers/, by AST; the mutants show the counter
sees a branch on a trainer), the rule table of planner/rules.py before the split (written out below, which
rule each trainer checked, in order), megatron-core's and torchtitan's knobs as the Recipe names them (a
setting the trainer lacks is off in its effective recipe), and a counter on the effective recipe (resolved
once per predict).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Recipe, Training
from planner.cost.placement import group_shapes
from planner.cost.predict import predict
from planner.cost.profiles import load_profile
from planner.cost.steptime import step_time
from planner.errors import InputError
from planner.model.spec import load_model
from planner.output.emit import ALL, EMITTERS
from planner.trainers import (EMITTER_OWNER, LAUNCH, NAMES, RECIPE_FIELDS, RECIPE_OFF, TRAINERS, get_trainer, needs_equal_slices,
                              owner_of)
from planner.trainers.base import Pricing
from test_layers import TRAINER_PARTS, layer_of
from topologies.loader import load_cluster
from source_ast import parse

ROOT = Path(__file__).resolve().parents[1]
TRAINER_WORDS = frozenset(NAMES) | frozenset(EMITTER_OWNER)   # megatron, torchtitan, maxtext, bridge

# Trainer-looking names allowed outside planner/trainers/, with why they stay: none (the registry and the
# CLI's choice lists are built from planner.trainers.NAMES and EMITTER_OWNER).
ALLOWED: dict[tuple[str, str], int] = {}


def trainer_names(source: str) -> list[tuple[int, str]]:
    """Every string constant of ``source`` that is a trainer or emitter name (a branch such as ``trainer ==
    "maxtext"`` or a table keyed by trainer), with its line. Docstrings and comments do not count."""
    return [(n.lineno, n.value) for n in ast.walk(parse(source))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in TRAINER_WORDS]


def names_outside_the_packages() -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for pkg in ("planner", "solver", "topologies"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("planner/trainers/"):
                continue
            for _, name in trainer_names(path.read_text()):
                out[(rel, name)] = out.get((rel, name), 0) + 1
    return out


def test_no_trainer_is_named_outside_its_package():
    assert names_outside_the_packages() == ALLOWED


@pytest.mark.parametrize("source", [
    'def f(training):\n    if training.trainer == "maxtext":\n        return 1\n',
    'STACKS = {"megatron": "megatron-26.08"}\n',
    'def g(t):\n    return t in ("megatron", "bridge")\n',
])
def test_the_counter_sees_a_branch_on_a_trainer(source):
    """Mutants: the branches and tables this issue removed are counted."""
    assert trainer_names(source)


def test_the_counter_ignores_docstrings_and_other_words():
    assert trainer_names('"""Megatron, torchtitan and maxtext files."""\nX = "megatron-26.08"\n') == []


# -- the registry -------------------------------------------------------------------------------------

def test_registry_names_every_trainer_and_refuses_others():
    assert NAMES == ("megatron", "torchtitan", "maxtext")
    assert get_trainer(None) is get_trainer("megatron") is TRAINERS["megatron"]
    with pytest.raises(InputError, match="unknown trainer 'deepspeed'; use one of megatron, torchtitan, maxtext"):
        get_trainer("deepspeed")


def test_every_emitter_a_trainer_owns_is_offered_and_launchable():
    assert [e for e in EMITTERS if owner_of(e)] == ["megatron", "bridge", "torchtitan", "maxtext"]
    assert owner_of("bridge") is get_trainer("megatron") and owner_of("slurm") is None
    assert set(EMITTER_OWNER) <= set(ALL) and set(LAUNCH) == set(EMITTER_OWNER)


def test_equal_slices_follow_the_trainers_that_run_the_plan():
    assert needs_equal_slices("maxtext", []) and not needs_equal_slices("megatron", ["megatron", "slurm"])
    assert needs_equal_slices("megatron", ["maxtext"]) and needs_equal_slices("torchtitan", ["all"])


# The rule table of planner/rules.py before the split (RULES + RECIPE_RULES, with their trainers, as main had
# it at the merges: Megatron's own KV rule from cf3f023, the GDN/Mamba heads rule from 9ef013a), in order.
OLD_RULES = [
    ("world_div_model_parallel", "mtx"), ("dp_matches_world", "mtx"), ("heads_div_tp", "mtx"),
    ("kv_heads_div_tp", "tx"), ("kv_heads_tp_megatron", "m"), ("mixer_heads_div_tp_cp", "mtx"), ("experts_div_ep", "mtx"), ("expert_grid_div_world", "m"), ("etp_only_for_moe", "m"),
    ("pipeline_stages", "mtx"), ("seq_div_2cp", "mtx"), ("gbs_div_mbs_dp", "mtx"), ("torchtitan_no_etp", "t"),
    ("torchtitan_ep_divides", "t"), ("moe_bias_needs_etp1", "m"), ("maxtext_ep_divides_dp", "x"),
    ("megatron_interleaved_microbatches", "m"), ("torchtitan_pipeline_microbatches", "t"),
    ("fp8_param_gather_recipe", "m"), ("fp4_param_gather_recipe", "m"), ("cpu_offloading_layout", "m"),
    ("optimizer_offload_layout", "m"),   # added with the optimizer CPU offload (after the split)
    ("maxtext_pipeline_layout", "x"),    # added with MaxText's pipeline keys (after the split)
    ("cuda_graphs_vs_recompute", "mt"), ("cuda_graph_modules", "m"), ("moe_a2a_overlap_layout", "m"),
    ("delay_wgrad_needs_a2a_overlap", "m"), ("tp_comm_overlap_needs_sp", "m"),
    ("expert_bias_needs_sigmoid_router", "m"), ("torch_fsdp2_layout", "m"), ("fp8_recipe_precision", "m"),
]


@pytest.mark.parametrize("name", NAMES)
def test_each_trainer_checks_the_rules_it_checked_before_in_that_order(name):
    """Which rule reports first is what a user reads, so the order within a trainer is kept too."""
    letter = {"megatron": "m", "torchtitan": "t", "maxtext": "x"}[name]
    want = [r for r, who in OLD_RULES if letter in who]
    assert [r.name for r in get_trainer(name).rules] == want


@pytest.mark.parametrize("name", NAMES)
def test_parts_sit_in_their_layer_and_have_their_functions(name):
    """The Trainer object loads its parts by name (no import statement the layer check reads), so each part
    is checked here: it exists, sits in its layer (tests/test_layers.py), and has what callers ask of it."""
    want = {"recipe": ("FIELDS",), "rules": ("RULES", "effective_recipe"), "families": ("why_not", "TITLES"),
            "emit": ("files", "task_env", "task_command", "for_trial"), "bridge": ("files", "task_env", "task_command",
                                                                                  "for_trial", "unlaunchable"),
            "readback": ("claims", "read"), "logs": ("detect", "parse", "run_fields")}
    t = get_trainer(name)
    for part in t.parts:
        mod = t.part(part)
        assert mod.__name__ == f"planner.trainers.{name}.{part}"
        assert layer_of(mod.__name__) == TRAINER_PARTS[part]
        assert [f for f in want[part] if not hasattr(mod, f)] == [], (name, part)
    assert set(t.emitters.values()) <= set(t.parts)
    with pytest.raises(KeyError):
        t.part("pricing")


# -- the recipe: each trainer resolves its own; knobs it lacks are off ----------------------------------

OFF = {"cuda_graph_impl": "none", "cuda_graph_modules": (), "overlap_moe_expert_parallel_comm": False,
       "delay_wgrad_compute": False, "tp_comm_overlap": False, "moe_permute_fusion": False, "moe_router_fusion": False,
       "cross_entropy_loss_fusion": False, "moe_router_enable_expert_bias": False, "fsdp_impl": "megatron",
       "cpu_offload_layers": None, "fp8_param_gather": False, "fp4_param_gather": False, "torch_compile": None,
       "optimizer_offload_fraction": None, "overlap_cpu_optimizer_d2h_h2d": False, "fp8_recipe": None}


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(NAMES), model=st.sampled_from(["deepseek-v3", "llama3-8b", "qwen3-30b-a3b"]),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 8]),
       fsdp=st.booleans(), recompute=st.sampled_from(["none", "full", "moe_act"]),
       precision=st.sampled_from(["bf16", "fp8", "mxfp8", "nvfp4"]))
def test_a_trainer_runs_without_the_knobs_it_lacks(name, model, tp, pp, ep, fsdp, recompute, precision):
    m = load_model(model)
    cfg = ParallelConfig(tp=tp, pp=pp, ep=ep if m.num_experts else 1, fsdp=fsdp, recompute=recompute)
    tr = Training(global_batch=256, trainer=name, precision=precision)
    rec = get_trainer(name).effective_recipe(m, cfg, tr)
    off = {k: v for k, v in OFF.items() if k not in get_trainer(name).knobs}
    assert {k: getattr(rec, k) for k in off} == off
    assert rec.cuda_graph_impl is not None   # auto is always resolved


def test_recipe_fields_are_every_knob():
    """Every knob a trainer names is a Recipe field, and every Recipe field is some trainer's knob; Recipe is
    assembled from the fields each package declares (a package's own fields are among its knobs)."""
    knobs = {k for t in TRAINERS.values() for k in t.knobs}
    assert knobs == set(Recipe.model_fields) == set(OFF)
    assert list(Recipe.model_fields) == list(RECIPE_FIELDS)
    assert all(set(t.recipe_fields) <= set(t.knobs) for t in TRAINERS.values())
    assert RECIPE_OFF == OFF   # each owner's "off" values, as written out above
    assert Recipe(cuda_graph_modules="moe_router,attn").cuda_graph_modules == ("attn", "moe_router")
    with pytest.raises(ValueError, match="unknown CUDA graph module 'mlpp'"):
        Recipe(cuda_graph_modules=["mlpp"])


@pytest.mark.parametrize("name, recipe, words", [
    ("torchtitan", {"cpu_offload_layers": 2}, "torchtitan has no layer-wise activation offloading"),
    ("maxtext", {"fp8_param_gather": True}, "Megatron's --fp8-param-gather has no maxtext counterpart"),
    ("megatron", {"torch_compile": True}, "TorchTitan's model compile has no megatron counterpart"),
    ("maxtext", {"fp4_param_gather": True}, "Megatron's --fp4-param-gather has no maxtext counterpart"),
])
def test_a_trainer_refuses_another_trainers_knob(name, recipe, words):
    with pytest.raises(ValueError, match=words):
        Training(global_batch=8, trainer=name, recipe=recipe)
    assert get_trainer(name).refuse_recipe(Recipe()) is None


def test_pricing_fusion_by_hand():
    rec = Recipe(cuda_graph_impl="none", torch_compile=True)
    regime = dict(grad_bytes=2.0, master_weights=True, host_floor=False, graph_buffers=False)
    assert Pricing(fusion="cuda_graphs", **regime).fused(rec, True) is False
    assert Pricing(fusion="torch_compile", **regime).fused(rec, False) is True
    assert Pricing(fusion="xla", **regime).fused(rec, False) is False
    assert [t.pricing.grad_bytes for t in TRAINERS.values()] == [2.0, 4.0, 4.0]


# -- the effective recipe is resolved once per predict ---------------------------------------------------

@pytest.mark.parametrize("name, model, cfg", [
    ("megatron", "qwen3-30b-a3b", ParallelConfig(tp=2, pp=2, ep=8, mbs=1)),
    ("torchtitan", "llama3-8b", ParallelConfig(tp=2, fsdp=True)),
])
def test_predict_resolves_the_recipe_once(monkeypatch, name, model, cfg):
    m, cluster = load_model(model), load_cluster("dgx-h100", gpus=32)
    tr = Training(global_batch=256, trainer=name, precision="fp8")
    rules = importlib.import_module(f"planner.trainers.{name}.rules")
    real, calls = rules.effective_recipe, []

    def counted(*args):
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(rules, "effective_recipe", counted)
    p = predict(m, cluster, cfg, tr)
    assert p.step_time_s > 0 and len(calls) == 1
    # what was passed down prices as the step time resolving it itself would
    monkeypatch.setattr(rules, "effective_recipe", real)
    again = step_time(m, cluster, p.config, tr, p.world, p.placement, load_profile(tr.stack),
                      group_shapes(cluster, p.config, p.placement))
    assert again.step_time_s == pytest.approx(p.step_time_s, rel=1e-12)
