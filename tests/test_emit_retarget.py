"""``topoplan emit --trainer X`` on a plan made for another trainer (issue 23 item 3): the files are those
of the plan as X runs it, checked against X's rules, or a one-line refusal naming the rule.

Oracle for the refusal: megatron-core 0.19.2 ``TransformerConfig.__post_init__`` refuses full recompute
with a CUDA graph other than full_iteration ("full recompute is only supported with full iteration CUDA
graph."), while TorchTitan runs full activation checkpointing with graphs (its ``_validate_cuda_graphs``
checks only PP and the all-to-all EP dispatcher)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from planner.config import ParallelConfig, Training
from planner.output.emit import for_trainer, load_context, render_files
from planner.trainers.megatron.emit import megatron_args
from planner.rules import effective_recipe
from cli_run import run_cli
from trainers.plans import hgx_cluster, plan_doc

TITAN = Training(seq_len=8192, global_batch=64, precision="bf16", trainer="torchtitan")


def _cli(*args, cwd):
    return run_cli(*args, cwd=cwd)


def test_mcore_source_says_what_the_rule_says():
    # the rule's message is megatron-core's own assertion text
    mcore = Path(os.environ.get("TOPOPLAN_MCORE_DIR", ""))
    src = mcore / "megatron/core/transformer/transformer_config.py"
    if src.is_file():
        assert "full recompute is only supported with full iteration CUDA graph." in src.read_text()


def _pairs(args: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in args:
        if a.startswith("--"):
            key = a
            out[key] = []
        else:
            out[key].append(a)
    return out


def test_torchtitan_full_recompute_plan_runs_under_megatrons_rule():
    # auto graphs: TorchTitan captures them with full recompute; Megatron, by the same auto setting, does not
    doc = plan_doc("llama3-8b", hgx_cluster("h100", 1), ParallelConfig(dp=8, recompute="full"), TITAN)
    pairs = _pairs(megatron_args(for_trainer(load_context(doc, 0), "megatron")))
    assert pairs["--recompute-granularity"] == ["full"]
    assert pairs.get("--cuda-graph-impl", ["none"]) in (["none"], ["full_iteration"])


def test_torchtitan_full_recompute_plan_is_refused_for_megatron(tmp_path):
    te = TITAN.model_copy(update={"recipe": TITAN.recipe.model_copy(update={"cuda_graph_impl": "transformer_engine"})})
    doc = plan_doc("llama3-8b", hgx_cluster("h100", 1), ParallelConfig(dp=8, recompute="full"), te)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    ok = _cli("emit", str(plan), "--trainer", "torchtitan", "--out", str(tmp_path / "tt"), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr          # the control: TorchTitan takes the plan as made
    r = _cli("emit", str(plan), "--trainer", "megatron", "--out", str(tmp_path / "mg"), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert "--trainer megatron" in err and "cuda_graphs_vs_recompute" in err and "torchtitan" in err
    assert not (tmp_path / "mg").exists()


def test_torchtitan_plan_emitted_for_megatron_gets_megatrons_recipe():
    # no conflict: the Megatron files carry the recipe as Megatron resolves it (its CUDA graph scope),
    # not TorchTitan's (which has no graph modules)
    doc = plan_doc("llama3-8b", hgx_cluster("h100", 1), ParallelConfig(dp=8), TITAN)
    ctx = load_context(doc, 0)
    files = render_files(ctx, ["megatron"])
    mega = effective_recipe(ctx.model, ctx.config, TITAN.model_copy(update={"trainer": "megatron"}))
    assert mega.cuda_graph_modules                 # Megatron scopes its graphs; TorchTitan's recipe has none
    args = next(t for p, t in files.items() if p.endswith("args.txt"))
    assert "--cuda-graph-modules " + " ".join(mega.cuda_graph_modules) in args.replace(" \\\n", " ")
    assert "--cuda-graph-modules" not in " ".join(megatron_args(ctx))   # today's bug: TorchTitan's recipe
