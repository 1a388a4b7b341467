"""Megatron's optimizer CPU offload (``Recipe.optimizer_offload_fraction``: --optimizer-cpu-offload
--optimizer-offload-fraction, with --use-precision-aware-optimizer).

Oracles: the step term and the memory worked by hand (Llama 3 8B's 8,030,261,248 parameters, Meta's model
card count; 12 B of optimizer state and 18 B of host memory per offloaded parameter, written out from
megatron-core's HybridDeviceOptimizer), megatron-core's own argument checks (the ``trainers`` tests in
tests/test_emit_trainers.py build OptimizerConfig from the emitted args), the program against ``predict``,
and hypothesis for the rule that a model which fits without the offload never gets it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roundtrip_check import assert_round_trip

from planner.cli import main
from planner.config import ParallelConfig, Training
from planner.cost.memory import GIB, memory_per_gpu
from planner.cost.predict import predict
from planner.cost.terms import cpu_optimizer as CPU
from planner.errors import InfeasibleError
from planner.model.spec import load_model
from planner.rules import effective_recipe, violations
from planner.search.plan import plan
from topologies.gpus import get_gpu
from topologies.loader import load_cluster

LLAMA3_8B = 8_030_261_248   # Meta's Llama 3 8B model card (embedding and output head untied)


def _tr(f=None, **kw):
    return Training(seq_len=4096, global_batch=64, precision=kw.pop("precision", "bf16"),
                    recipe={"optimizer_offload_fraction": f, **kw.pop("recipe", {})}, **kw)


# --- the step term, by hand ----------------------------------------------------------------------------

def test_cpu_optimizer_seconds_by_hand():
    n = 1e9
    d2h = n * 2 / 64e9            # BF16 gradients over PCIe Gen5 x16, 64 GB/s per direction
    h2d = n * 2 / 64e9            # BF16 parameters back
    adam = n / 0.65e9             # NeMo RL #3628: 0.65e9 parameters per second on the host
    assert CPU.cpu_optimizer_time(n, 2.0, 64.0, overlap=False) == pytest.approx(d2h + adam + h2d)
    assert CPU.cpu_optimizer_time(n, 2.0, 64.0, overlap=True) == pytest.approx(adam)
    # a link slow enough that the copies bound the overlapped step
    assert CPU.cpu_optimizer_time(n, 4.0, 1.0, overlap=True) == pytest.approx(n * 4 / 1e9)
    assert CPU.cpu_optimizer_time(0.0, 2.0, 64.0, overlap=False) == 0.0


@pytest.mark.parametrize("f, overlap", [(0.5, None), (1.0, False), (0.25, True)])
def test_predict_prices_the_host_step_by_hand(f, overlap):
    """Llama 3 8B, DP8 on one HGX H100 node: each rank updates f x 8.03e9 / 8 parameters on the CPU."""
    m, cl = load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8)
    rec = {} if overlap is None else {"overlap_cpu_optimizer_d2h_h2d": overlap}
    p = predict(m, cl, ParallelConfig(), _tr(f, recipe=rec))
    n = f * LLAMA3_8B / 8
    adam, copies = n / 0.65e9, n * 2 / 64e9 + n * 2 / 64e9
    want = adam if overlap in (None, True) else adam + copies
    assert p.breakdown["cpu_optimizer"] == pytest.approx(want, rel=1e-9)
    off = predict(m, cl, ParallelConfig(), _tr(None))
    assert off.breakdown["cpu_optimizer"] == 0.0
    assert "optimizer CPU offload" in p.extrapolated and "optimizer-offload" in p.regime
    assert off.extrapolated is None or "optimizer CPU offload" not in off.extrapolated


# --- memory, by hand -----------------------------------------------------------------------------------

@pytest.mark.parametrize("f", [0.25, 0.5, 1.0])
def test_memory_moves_the_optimizer_share_to_the_host(f):
    m, gpu = load_model("llama3-8b"), get_gpu("h100")
    base = memory_per_gpu(m, ParallelConfig(), _tr(None), 8, gpu)
    est = memory_per_gpu(m, ParallelConfig(), _tr(f), 8, gpu)
    b, e = base.components, est.components
    assert e["optimizer"] == pytest.approx((1 - f) * b["optimizer"], rel=1e-12)
    for k in ("weights", "grads", "activations", "logits"):
        assert e[k] == b[k]
    # 12 B of GPU optimizer state per parameter of the shard without offload; 18 B per offloaded one on the host
    shard = b["optimizer"] * GIB / 12.0
    assert shard == pytest.approx(LLAMA3_8B / 8, rel=0.01)   # Megatron pads the vocabulary: within 1%
    assert est.per_stage[0].host == pytest.approx(18.0 * f * shard / GIB, rel=1e-12)
    assert est.host_gib_per_node == pytest.approx(8 * est.per_stage[0].host)
    assert est.host_usable_gib == pytest.approx(0.8 * 2000e9 / GIB)
    assert base.host_gib_per_node == 0.0 and base.host_usable_gib is None


def test_host_memory_is_a_limit():
    m = load_model("llama3-8b")
    small = get_gpu("h100").model_copy(update={"host_memory_gb": 100.0})   # 80 GB usable < 8 x 18 x 1e9 B
    est = memory_per_gpu(m, ParallelConfig(), _tr(1.0), 8, small)
    assert est.peak_gib < 60 and not est.host_fits and not est.fits(76.0)
    assert memory_per_gpu(m, ParallelConfig(), _tr(1.0), 8, get_gpu("h100")).fits(76.0)


# --- rules ---------------------------------------------------------------------------------------------

def test_rules_of_the_offload():
    m = load_model("deepseek-v3")
    cfg = ParallelConfig(tp=4, pp=2, ep=32, etp=1)
    # FSDP: topoplan offloads only under the distributed optimizer
    v = violations(m, cfg.model_copy(update={"fsdp": True}), _tr(1.0), 64)
    assert [x.rule for x in v] == ["optimizer_offload_layout"] and "distributed optimizer" in v[0].message
    assert not violations(m, cfg, _tr(1.0), 64)
    # FP8 parameters: auto off with the offload (megatron-core needs the delayed recipe), on without it
    assert effective_recipe(m, cfg, _tr(None, precision="fp8")).fp8_param_gather is True
    rec = effective_recipe(m, cfg, _tr(1.0, precision="fp8"))
    assert rec.fp8_param_gather is False and rec.optimizer_offload_fraction == 1.0
    assert rec.overlap_cpu_optimizer_d2h_h2d is True
    assert effective_recipe(m, cfg, _tr(0.0)).overlap_cpu_optimizer_d2h_h2d is False


@pytest.mark.parametrize("trainer, words", [("torchtitan", "training.enable_cpu_offload"),
                                            ("maxtext", "optimizer_memory_host_offload")])
def test_other_trainers_refuse_it_in_one_line(trainer, words):
    with pytest.raises(ValueError, match="no counterpart of Megatron's --optimizer-cpu-offload") as exc:
        _tr(0.5, trainer=trainer)
    assert words in str(exc.value)
    assert _tr(0.0, trainer=trainer).recipe.optimizer_offload_fraction == 0.0   # 0 = off: nothing to refuse


# --- the search ----------------------------------------------------------------------------------------

def test_plan_offloads_only_to_fit_and_the_program_is_predict(monkeypatch):
    """Llama 3 70B on 8 H100: nothing fits without the offload; plan takes the smallest fraction that fits
    (0.5 cannot: its even split already needs more than HBM), says why, and its program equals predict.
    The control: a slower host moves the step and the program follows."""
    m, cl = load_model("llama3-70b"), load_cluster("dgx-h100", gpus=8)
    tr = Training(seq_len=4096, global_batch=64, precision="bf16")
    with pytest.raises(InfeasibleError, match="no layout fits"):
        plan(m, cl, _tr(0.0), top=1)
    res = plan(m, cl, tr, top=3)
    assert res.training.recipe.optimizer_offload_fraction == 0.75
    assert res.solver["optimizer_offload"]["needed_to_fit"] and "no layout fits" in res.solver["optimizer_offload"]["without"]
    assert any("needed to fit" in n for n in res.solver["notes"])
    for e in res.plans:
        assert e.prediction.breakdown["cpu_optimizer"] > 0
        assert e.program_step_s == pytest.approx(e.prediction.step_time_s, rel=1e-6)
    best = res.plans[0]
    monkeypatch.setattr(CPU, "CPU_ADAM_PARAMS_PER_S", CPU.CPU_ADAM_PARAMS_PER_S / 4)
    slow = plan(m, cl, tr, top=1)
    assert slow.plans[0].program_step_s == pytest.approx(slow.plans[0].prediction.step_time_s, rel=1e-6)
    again = predict(m, cl, best.config, res.training, placement=best.placement)
    assert again.step_time_s > best.prediction.step_time_s + 1.0


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["llama3-8b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b"]),
       where=st.sampled_from([("dgx-h100", 8), ("dgx-h100", 16), ("dgx-b200", 8), ("gb200-nvl72", 8)]),
       gbs=st.sampled_from([64, 256]))
def test_a_model_that_fits_without_offload_never_gets_it(model, where, gbs):
    m, cl = load_model(model), load_cluster(where[0], gpus=where[1])
    tr = Training(seq_len=4096, global_batch=gbs, precision="bf16")
    try:
        forced_off = plan(m, cl, tr.model_copy(
            update={"recipe": tr.recipe.model_copy(update={"optimizer_offload_fraction": 0.0})}), top=1)
    except InfeasibleError:
        return   # it does not fit without the offload: not this rule's case
    res = plan(m, cl, tr, top=3)
    assert res.training.recipe.optimizer_offload_fraction is None and "optimizer_offload" not in res.solver
    assert all(e.prediction.breakdown["cpu_optimizer"] == 0.0 for e in res.plans)
    assert res.plans[0].label == forced_off.plans[0].label


# --- the command line ----------------------------------------------------------------------------------

def test_cli_emits_the_offload_and_refuses_when_forced_off(tmp_path, capsys):
    base = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64", "--top", "1"]
    assert main(base + ["--emit", "megatron", "--out", str(tmp_path / "o")]) == 0
    args = (tmp_path / "o" / "megatron" / "args.txt").read_text().split()
    assert {"--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d"} <= set(args)
    assert args[args.index("--optimizer-offload-fraction") + 1] == "0.75"
    capsys.readouterr()
    assert main(base + ["--optimizer-offload-fraction", "0"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: llama3-70b on 8 H100 GPUs: no layout fits") and "\n" not in err


@pytest.mark.slow
@pytest.mark.parametrize("model", ["deepseek-v3", "tests/data/configs/deepseek-v3.2-exp/config.json"])
def test_671b_models_plan_on_64_h100_with_the_offload(model, tmp_path, capsys):
    """The issue's case: DeepSeek-V3 and V3.2 (671B) need 168 GB per GPU of model state on 64 H100 without
    the offload; with it they plan, and the emitted args carry it (megatron-core accepts them:
    tests/test_emit_trainers.py, deepseek-v3@64xH100-offload)."""
    base = ["plan", "--model", model, "--cluster", "dgx-h100", "--gpus", "64", "--gbs", "1024", "--top", "1"]
    assert main(base + ["--emit", "megatron", "--out", str(tmp_path / "o")]) == 0
    assert "--optimizer-cpu-offload" in (tmp_path / "o" / "megatron" / "args.txt").read_text()
    capsys.readouterr()
    assert main(base + ["--optimizer-offload-fraction", "0"]) == 3


@pytest.mark.slow
def test_kimi_k2_on_64_h100_overflows_the_host():
    """Kimi-K2 (1,026B) on 64 H100: 16e9 parameters per GPU; fully offloaded, a node's 8 ranks hold
    8 x 18 B x 16e9 = 2.3 TB of optimizer state, over a DGX H100's 2 TB; any smaller fraction leaves
    more than HBM on the GPU. So it is refused, saying so (128 GPUs fit)."""
    m, cl = load_model("kimi-k2"), load_cluster("dgx-h100", gpus=64)
    with pytest.raises(InfeasibleError, match="host memory per node"):
        plan(m, cl, Training(seq_len=4096, global_batch=1024, precision="bf16"), top=1)


def test_the_offload_plan_reads_back_from_its_args(tmp_path):
    """plan -> megatron/args.txt -> read back: the same layout, the offload recipe as it runs, the same figures."""
    res = plan(load_model("llama3-70b"), load_cluster("dgx-h100", gpus=8),
               Training(seq_len=4096, global_batch=64, precision="bf16"), top=2)
    doc = res.to_dict()
    for i in range(len(doc["plans"])):
        assert_round_trip(doc, i)


def test_predict_names_the_host_when_only_the_host_overflows(capsys):
    """Kimi-K2 on 64 H100, TP4 PP2 EP32 with full recompute and the whole optimizer on the host: 73.7 GiB per
    GPU fits HBM, but 8 ranks x 18 B x ~16e9 parameters overflow the node's 2 TB: exit 3 naming the host.
    DeepSeek-V3's same layout fits both (exit 0) and shows the host's Adam step."""
    base = ["predict", "--cluster", "dgx-h100", "--gpus", "64", "--gbs", "1024", "--tp", "4", "--pp", "2",
            "--ep", "32", "--etp", "1", "--recompute", "full", "--optimizer-offload-fraction", "1"]
    assert main(base + ["--model", "kimi-k2"]) == 3
    err = capsys.readouterr().err.strip()
    assert "fits in 76.0 GiB usable" in err and "host memory" in err and "\n" not in err
    assert main(base + ["--model", "deepseek-v3"]) == 0
    assert "CPU optimizer (offload)" in capsys.readouterr().out


def test_a_cluster_file_sets_its_nodes_host_memory():
    """A cluster whose nodes hold 150 GB: host_memory_gb in the cluster file is the limit (120 GB usable < 8 ranks
    x 18 B x 1.0e9 parameters = 145 GB for Llama 3 8B fully offloaded); the catalog's DGX figure is not."""
    from topologies.cluster import Cluster

    dgx = load_cluster("dgx-h100", gpus=8)
    small = Cluster.model_validate({**dgx.model_dump(mode="json"), "host_memory_gb": 150})
    assert (dgx.gpu_spec.host_memory_gb, small.gpu_spec.host_memory_gb) == (2000.0, 150.0)
    m, cfg = load_model("llama3-8b"), ParallelConfig(recompute="full")
    assert predict(m, dgx, cfg, _tr(1.0)).fits
    p = predict(m, small, cfg, _tr(1.0))   # the same HBM, the host over its 120 GB
    assert not p.fits and p.memory_gib_per_gpu == predict(m, dgx, cfg, _tr(1.0)).memory_gib_per_gpu
    assert predict(m, small, cfg, _tr(0.25)).fits   # 8 x 18 x 0.25 x 1e9 B = 36 GB
    # the prediction carries the node's host memory (plan.json, the terminal), as the estimate counts it
    est = memory_per_gpu(m, cfg, _tr(1.0), 8, small.gpu_spec)
    assert (p.host_gib_per_node, p.host_usable_gib) == (est.host_gib_per_node, est.host_usable_gib)
    assert p.host_usable_gib == pytest.approx(0.8 * 150e9 / GIB) and p.host_gib_per_node > p.host_usable_gib
    assert predict(m, dgx, cfg, _tr(None)).host_gib_per_node is None


def test_a_measured_run_with_the_offload_can_be_recorded():
    """calibration CSVs take an optimizer_offload_fraction column: the row is priced with the host's Adam step
    (a measured run with it is what the cpu_optimizer term lacks); a value outside 0..1 is one line naming it."""
    import csv

    from planner.calibration.validate import predict_case, row_case
    from planner.cost.profiles import CALIBRATION_CSV
    from planner.errors import InputError

    row = next(r for r in csv.DictReader(open(CALIBRATION_CSV)) if r["id"] == "mb201")   # Qwen3-30B-A3B, 16 H100
    case = row_case(dict(row, optimizer_offload_fraction="0.5"))
    assert case.training.recipe.optimizer_offload_fraction == 0.5
    assert predict_case(case).breakdown["cpu_optimizer"] > 0
    assert row_case(dict(row, optimizer_offload_fraction="")).training.recipe.optimizer_offload_fraction is None
    with pytest.raises(InputError, match="column 'optimizer_offload_fraction' = '1.5'"):
        row_case(dict(row, optimizer_offload_fraction="1.5"))
