"""predict(): the Python API and the `topoplan predict` command."""

import json

import pytest

import planner
import topologies
from planner.cli import main
from planner.model.flops import flops_per_token


def test_api_returns_consistent_figures():
    model = planner.load_model("deepseek-v3")
    cluster = topologies.load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    training = planner.Training(seq_len=4096, global_batch=4096, precision="mxfp8", stack="megatron-26.08")
    # the 26.08 recipe dispatches with HybridEP (flex); ParallelConfig's default (None) is the stack's
    cfg = planner.ParallelConfig(pp=2, vpp=8, ep=32, dispatcher="flex-hybridep")
    p = planner.predict(model, cluster, cfg, training)
    default = planner.predict(model, cluster, planner.ParallelConfig(pp=2, vpp=8, ep=32), training)
    assert planner.ParallelConfig().dispatcher is None
    assert default.config.dispatcher == "flex-hybridep" and default.to_dict()["dispatcher"] == "flex-hybridep"
    assert default.step_time_s == p.step_time_s
    nccl = planner.predict(model, cluster, planner.ParallelConfig(pp=2, vpp=8, ep=32, dispatcher="alltoall"), training)
    assert nccl.config.dispatcher == "alltoall" and nccl.to_dict()["dispatcher"] == "alltoall"
    assert nccl.breakdown["ep_a2a"] > p.breakdown["ep_a2a"]
    assert p.world == 256 and p.fits and not p.violations
    assert p.tokens_per_s == pytest.approx(4096 * 4096 / p.step_time_s)
    assert p.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_s / 256)
    assert p.tflops_per_gpu == pytest.approx(p.tokens_per_s_per_gpu * flops_per_token(model, 4096) / 1e12)
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s)
    d = p.to_dict()
    for key in ("tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s", "memory_gib_per_gpu", "fits", "breakdown"):
        assert key in d
    json.dumps(d)
    # the published run (Megatron-Bridge 26.08, 1,635-1,648 TFLOP/s per GPU) within 5%
    assert 1635 * 0.95 <= p.tflops_per_gpu <= 1648 * 1.05


def test_legacy_formula_for_the_26_04_stack():
    model = planner.load_model("gpt-oss-120b")
    cluster = topologies.load_cluster("gb200-nvl72", gpus=64)
    cfg = planner.ParallelConfig(ep=64, mbs=4)
    old = planner.predict(model, cluster, cfg, planner.Training(global_batch=1280, stack="megatron-26.04"))
    assert old.tflops_per_gpu == pytest.approx(
        old.tokens_per_s_per_gpu * flops_per_token(model, 4096, formula="legacy") / 1e12)


def test_broken_rule_is_listed_not_raised():
    model = planner.load_model("deepseek-v3")
    cluster = topologies.load_cluster("gb300-nvl72", gpus=256, usable_per_domain=64)
    p = planner.predict(model, cluster, planner.ParallelConfig(pp=2, ep=48),
                        planner.Training(global_batch=4096, precision="mxfp8"))
    assert not p.fits and any(v.rule == "experts_div_ep" for v in p.violations)


def _run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


BASE = ["predict", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "256", "--precision", "mxfp8",
        "--gbs", "4096"]


def test_cli_json(capsys):
    code, out, _ = _run(BASE + ["--pp", "2", "--vpp", "8", "--ep", "32", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert d["fits"] is True and d["tflops_per_gpu"] > 1000
    assert set(d["breakdown"]) >= {"compute", "tp_comm", "ep_a2a", "pp_bubble", "pp_p2p", "dp_comm", "cp_comm",
                                   "optimizer", "imbalance", "other"}


def test_cli_broken_rule_exits_2_with_one_line(capsys):
    code, out, err = _run(BASE + ["--pp", "2", "--ep", "48"], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0 and "expert" in err.lower()


def test_cli_does_not_fit_exits_3(capsys):
    """Issue 11 item 8: the prediction is still shown (the JSON with fits false), the exit code is 3
    (infeasible) with one line on stderr that gives the shortfall."""
    args = ["predict", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "16", "--precision", "bf16",
            "--gbs", "64", "--ep", "16"]
    code, out, err = _run(args + ["--json"], capsys)
    d = json.loads(out)
    assert code == 3 and d["fits"] is False
    line = err.strip()
    assert "\n" not in line and "does not fit" in line and "TP1 PP1 EP16" in line
    usable = d["usable_gib"] if d.get("usable_gib") is not None else d["hbm_gib"]
    assert f"short by {d['memory_gib_per_gpu'] - usable:.1f} GiB" in line   # the hand subtraction
    code, out, err = _run(args, capsys)
    assert code == 3 and "does not fit" in out and err.strip().count("\n") == 0


def test_cli_human_output(capsys):
    code, out, _ = _run(BASE + ["--pp", "2", "--vpp", "8", "--ep", "32"], capsys)
    assert code == 0
    assert "model TFLOP/s per GPU" in out and "exposed EP all-to-all" in out and "memory per GPU" in out


def test_dispatcher_none_is_the_stack_default_and_bad_names_are_refused():
    cfg = planner.ParallelConfig(ep=8, mbs=4)
    assert cfg.dispatcher is None and "None" not in cfg.short()
    with pytest.raises(ValueError):
        planner.ParallelConfig(dispatcher="nccl-magic")
    model = planner.load_model("qwen3-30b-a3b")
    cluster = topologies.load_cluster("dgx-b300", gpus=8)
    training = planner.Training(seq_len=4096, global_batch=512, precision="mxfp8", stack="megatron-26.08")
    p = planner.predict(model, cluster, cfg, training)
    from planner.cost.profiles import load_profile

    assert p.config.dispatcher == load_profile("megatron-26.08").dispatcher == "flex-hybridep"
    explicit = planner.predict(model, cluster, cfg.model_copy(update={"dispatcher": "flex-hybridep"}), training)
    assert p.step_time_s == explicit.step_time_s
