"""planner/search/space.py: the rule tables over a few variables agree with planner.rules on full layouts.

Oracle: ``planner.rules.violations`` evaluated on the whole ParallelConfig with the world size
tp*cp*pp*dp. Property: for random assignments of every variable, "every rule table allows its
projection" iff "violations() is empty" (structural canonical-form constraints aside).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st
from space_layouts import allowed, drawn_layouts

from planner import rules
from planner.trainers import TRAINERS, get_trainer
from planner.config import Training
from planner.search.space import (RULE_VARS, VARIABLES, build_space, gbs_candidates, gpd_candidates,
                           rule_tables, split_layers)


def _model(layers, heads, kv, experts):
    return SimpleNamespace(num_layers=layers, num_attention_heads=heads, num_kv_heads=kv,
                           num_experts=experts, mtp_layers=0, is_moe=experts > 0,
                           attention="gqa")


def test_every_rule_has_a_variable_map():
    assert {r.name for t in TRAINERS.values() for r in t.rules} <= set(RULE_VARS)
    for vars_ in RULE_VARS.values():
        assert set(vars_) <= set(VARIABLES)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 20), heads=st.sampled_from([4, 6, 8, 12]), experts=st.sampled_from([0, 4, 6, 8]),
       gpus=st.sampled_from([8, 12, 16, 24]), trainer=st.sampled_from(["megatron", "torchtitan"]),
       seq=st.sampled_from([6, 8, 12, 4096]), gbs=st.sampled_from([6, 8, 16, 24]), data=st.data())
def test_rule_tables_equal_rules_on_full_layouts(layers, heads, experts, gpus, trainer, seq, gbs, data):
    model = _model(layers, heads, heads // 2 if heads % 2 == 0 else heads, experts)
    training = Training(seq_len=seq, global_batch=gbs, trainer=trainer)
    space = build_space(model, training, gpus, [8] * (gpus // 8 or 1), trainer=trainer,
                        gbs_range=(gbs // 2, gbs * 2) if data.draw(st.booleans()) else None)
    tables = rule_tables(space, model, training)
    for idx, cfg, world, tr in drawn_layouts(space, training, data, 25):
        want = not rules.violations(model, cfg, tr, world, trainer)
        assert allowed(tables, idx) == want, (cfg, world, tr.global_batch,
                                              rules.violations(model, cfg, tr, world, trainer))


def test_split_layers_reproduces_nvidia_layouts():
    # DeepSeek-V3, 61 layers: PP8 "Et*8|(t*8|)*6t*5mL" = first 8, last 5 (split 1)
    assert split_layers(61, 8, 1, 1) == (8, 5)
    # PP4 VPP4 (GB200 recipe) "[E+t*4]+[t*4]*14+[t,m,L]": 16 stages of 4, last 1
    assert split_layers(61, 4, 4, 1) == (4, 1)
    # an even split has no light last stage
    assert split_layers(64, 8, 1, 1) is None
    assert split_layers(61, 1, 1, 1) is None
    assert split_layers(61, 2, 1, 0) == (None, None)


def test_candidate_helpers_by_hand():
    assert gbs_candidates(4096, None) == [4096]
    assert gbs_candidates(4096, (1000, 5000)) == [1000, 1024, 1280, 1536, 2048, 2560, 3072, 4096, 5000]
    assert gpd_candidates([72, 72]) == [None, 64]
    assert gpd_candidates([8, 8]) == [None]


def test_schedule_tables_by_closed_form():
    """The micro-batch tables admit exactly the tuples the schedules run (M = gbs / (mbs * dp)):
    megatron interleaved: M >= PP and M % PP == 0 (N = PP); torchtitan 1F1B: M >= PP,
    Interleaved1F1B: M % max(1, M // PP) == 0. Layouts whose M is not whole are left to gbs_div_mbs_dp."""
    model = _model(24, 8, 8, 0)
    for trainer in ("megatron", "torchtitan"):
        training = Training(global_batch=24, trainer=trainer)
        space = build_space(model, training, 64, [8] * 8, trainer=trainer, gbs_range=(8, 48))
        name = {"megatron": "megatron_interleaved_microbatches", "torchtitan": "torchtitan_pipeline_microbatches"}
        (_, vars_, allowed), = [t for t in zip_tables(space, model, training) if t[0] == name[trainer]]
        vals = space.values
        got = {tuple(vals[v][i] for v, i in zip(vars_, idx)) for idx in allowed}
        assert vars_ == ("pp", "vpp", "dp", "mbs", "gbs")
        want = set()
        for pp in vals["pp"]:
            for vpp in vals["vpp"]:
                if vpp > 1 and pp < 2:
                    continue
                for dp in vals["dp"]:
                    for mbs in vals["mbs"]:
                        for gbs in vals["gbs"]:
                            ok = True
                            if gbs % (mbs * dp) == 0 and pp > 1:
                                m = gbs // (mbs * dp)
                                if trainer == "megatron":
                                    ok = vpp == 1 or (m >= pp and m % pp == 0)
                                else:
                                    ok = m >= pp if vpp == 1 else m % max(1, m // pp) == 0
                            if ok:
                                want.add((pp, vpp, dp, mbs, gbs))
        assert got == want
        assert len(want) < len(vals["pp"]) * len(vals["vpp"]) * len(vals["dp"]) * len(vals["mbs"]) * len(vals["gbs"])


def zip_tables(space, model, training):
    """(rule name, variables, allowed) in the order rule_tables builds them."""
    names = [r.name for r in get_trainer(space.trainer).rules]
    return [(n, v, a) for n, (v, a) in zip(names, rule_tables(space, model, training))]


# Rule.applies: the recipe settings a rule reads only when asked for explicitly (megatron's RECIPE_RULES)
_EXPLICIT = {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True, "tp_comm_overlap": True,
             "moe_router_enable_expert_bias": True, "fp8_param_gather": True, "cuda_graph_impl": "transformer_engine"}


@settings(max_examples=12, deadline=None)
@given(setting=st.sampled_from([None, *_EXPLICIT]), model_name=st.sampled_from(["deepseek-v3", "qwen3-30b-a3b"]),
       data=st.data())
def test_rule_tables_with_explicit_recipe_settings(setting, model_name, data):
    """With a setting asked for explicitly (its rules read the layout) and with every setting on auto
    (those rules' walks build no layout), the tables still agree with ``rules.violations`` on random
    full layouts of a real model; and a rule that does not apply passes every layout."""
    from planner.config import Recipe
    from planner.model.spec import load_model
    model = load_model(model_name)
    recipe = Recipe(**({setting: _EXPLICIT[setting]} if setting else {}))
    training = Training(seq_len=4096, global_batch=512, precision="fp8", recipe=recipe)
    space = build_space(model, training, 64, [8] * 8, trainer="megatron", total_params=1e12)
    tables = rule_tables(space, model, training)
    for idx, cfg, world, tr in drawn_layouts(space, training, data, 40):
        viol = rules.violations(model, cfg, tr, world, "megatron")
        assert allowed(tables, idx) == (not viol), (cfg, world, viol)
        for rule in get_trainer("megatron").rules:
            if rule.applies is not None and not rule.applies(model, tr):
                assert rule.check(model, cfg, tr, world) is None


def test_explicit_setting_refuses_layouts_auto_allows():
    """By hand: EP overlap asked for explicitly refuses pp > 1 without vpp (megatron-core 0.19.2
    transformer_config.py's assertion, ``_a2a_overlap_problem``); on auto the same layout passes."""
    from planner.config import ParallelConfig, Recipe
    from planner.model.spec import load_model
    model = load_model("deepseek-v3")
    cfg = ParallelConfig(tp=1, pp=4, vpp=1, ep=8)
    auto = Training(seq_len=4096, global_batch=512)
    asked = auto.model_copy(update={"recipe": Recipe(overlap_moe_expert_parallel_comm=True)})
    rule = next(r for r in get_trainer("megatron").rules if r.name == "moe_a2a_overlap_layout")
    assert rule.check(model, cfg, auto, 256) is None
    assert "virtual_pipeline_model_parallel_size" in rule.check(model, cfg, asked, 256)
