"""The hybrid families through megatron-core 0.19.2's own code (tests/trainers/megatron_check.py): the
emitted Megatron args of Qwen3-Next, Nemotron-H and DeepSeek-V3.2 pass ``parse_args`` / ``validate_args`` /
``TransformerConfig`` and the first step's schedule checks with TP, CP, EP and (virtual) pipelines (the
hybrid layer pattern carrying the split), and topoplan's FLOPs per token are megatron's own
``num_floating_point_operations`` where megatron prices the mixer, or differ from it by exactly what
megatron leaves out (Mamba's d_inner = 2h shortcut, DSA's sparsity and indexer), summed by hand here from
the JSON fields. The config fields themselves are read back by tests/test_emit_fidelity.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.config import ParallelConfig, Training
from planner.model.flops import flops_per_token
from planner.model.spec import load_model, spec_from_config
from planner.output.emit import emit_plan
from planner.trainers.megatron.readback import megatron_setup
from test_emit_trainers import _megatron_env, _run, mcore_dir  # noqa: F401 - mcore_dir is a fixture
from trainers.plans import hgx_cluster, plan_doc
from trainers.sites import bash_words

pytestmark = pytest.mark.trainers

CONFIGS = Path(__file__).parent / "data" / "configs"
SEQ = 4096
# name -> (config directory, layout, GPUs)
JOBS = {
    "qwen3-next": ("qwen3-next-80b-a3b-instruct", ParallelConfig(tp=2, pp=2, cp=2, ep=4, etp=1, mbs=1), 16),
    "nemotron-h-8b": ("nemotron-h-8b-base-8k", ParallelConfig(tp=2, pp=2, vpp=2, mbs=1), 16),
    "nemotron-h-47b": ("nemotron-h-47b-base-8k", ParallelConfig(tp=4, pp=2, mbs=1), 16),
    "nemotron-h-56b": ("nemotron-h-56b-base-8k", ParallelConfig(tp=2, pp=4, cp=2, mbs=1), 16),
    "nemotron-3-nano": ("nemotron-3-nano-30b-a3b", ParallelConfig(tp=2, pp=2, cp=2, ep=4, etp=1, mbs=1), 16),
    "deepseek-v3.2": ("deepseek-v3.2-exp", ParallelConfig(tp=2, pp=4, cp=2, ep=8, etp=1, mbs=1), 64),
}


def _cfg(d: str) -> dict:
    return json.loads((CONFIGS / d / "config.json").read_text())


@pytest.fixture(scope="module")
def checked(mcore_dir, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("hybrids-megatron")
    jobs, args = [], {}
    for name, (d, cfg, world) in JOBS.items():
        doc = plan_doc(str(CONFIGS / d / "config.json"), hgx_cluster("h100", world // 8), cfg,
                       Training(seq_len=SEQ, global_batch=64, precision="bf16", trainer="megatron"), world=world)
        out = tmp / name
        emit_plan(doc, ["megatron"], out)
        args[name] = bash_words(out / "megatron" / "args.txt")
        jobs.append({"id": name, "args": args[name], "env": _megatron_env(out), "sm": 90, "schedule": True})
    data = _run("megatron_check.py", jobs, tmp, str(mcore_dir))
    return {r["id"]: r for r in data["results"]}, args


@pytest.mark.parametrize("name", list(JOBS))
def test_megatron_core_builds_the_hybrid_layout(name, checked):
    results, args = checked
    r = results[name]
    assert r["ok"], f"megatron-core refused {name} at {r['stage']}: {r['error']}"
    d, cfg, world = JOBS[name]
    c = r["config"]
    assert (c["tensor_model_parallel_size"], c["pipeline_model_parallel_size"], c["context_parallel_size"]) == \
        (cfg.tp, cfg.pp, cfg.cp)
    assert (r["vpp"] or 1) == cfg.vpp
    # topoplan's own reader of the same args gives the layout back (the pattern's segments are the stages)
    back, _, _ = megatron_setup(args[name], load_model(CONFIGS / d / "config.json"), world)
    assert (back.tp, back.pp, back.vpp, back.cp, back.ep) == (cfg.tp, cfg.pp, cfg.vpp, cfg.cp, cfg.ep)


def _ours(d: str, tp: int) -> float:
    return flops_per_token(load_model(CONFIGS / d / "config.json"), SEQ, tp=tp)


@pytest.mark.parametrize("name", ["qwen3-next", "nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b"])
def test_flops_are_megatrons_own(name, checked):
    """Gated DeltaNet (transformer_flops' linear-attention term, the attention output gate) and Mamba-2
    with d_inner = 2h (hybrid_flops): the same count."""
    results, _ = checked
    d, cfg, _ = JOBS[name]
    assert _ours(d, cfg.tp) == pytest.approx(results[name]["flops_per_token"], rel=1e-9)


def test_nemotron_3_nano_differs_from_megatron_by_its_d_inner_shortcut(checked):
    """megatron-core's mamba_layer_flops writes d_inner = 2h (5376 for h = 2688); Nemotron 3 Nano's Mamba
    heads give 64 x 64 = 4096. Per Mamba layer and token megatron counts (2h - d)(6h + 7N) FLOPs more
    (in_proj 4h(2h - d), scan 7N(2h - d), out_proj 2h(2h - d)), times 3 for training."""
    results, _ = checked
    d, cfg, _ = JOBS["nemotron-3-nano"]
    n = _cfg(d)
    h, N = n["hidden_size"], n["ssm_state_size"]
    inner = n["mamba_num_heads"] * n["mamba_head_dim"]
    n_mamba = n["hybrid_override_pattern"].count("M")
    extra = 3 * n_mamba * (2 * h - inner) * (6 * h + 7 * N)
    assert results["nemotron-3-nano"]["flops_per_token"] - _ours(d, cfg.tp) == pytest.approx(extra, rel=1e-9)


def test_deepseek_v32_megatron_counts_dense_mla(checked):
    """megatron-core's FLOP count has no DSA term: it is DeepSeek-V3's dense MLA count, which topoplan gives
    for the same file without the indexer; topoplan's V3.2 figure adds the indexer and drops the skipped
    keys (tests/test_hybrids.py checks that difference by hand)."""
    results, _ = checked
    d, cfg, _ = JOBS["deepseek-v3.2"]
    dense = {k: v for k, v in _cfg(d).items() if not k.startswith("index_")}
    dense.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    assert flops_per_token(spec_from_config(dense), SEQ, tp=cfg.tp) == pytest.approx(
        results["deepseek-v3.2"]["flops_per_token"], rel=1e-9)
