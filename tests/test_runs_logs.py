"""Trainer logs as measured runs (planner.calibration.runs): the readers against the trainers' own format
strings and code, the warm-up and median by hand, the CSV ``log`` column, and one-line errors."""

from __future__ import annotations

import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import types
from pathlib import Path

import pytest
from cli_run import run_cli

from planner.calibration.runs import read_log, rows_from_logs, run_row, warmup_iters
from planner.calibration.validate import read_rows, row_case
from planner.trainers.megatron import logs as mreader
from planner.errors import InputError

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "trainers"


def _mcore() -> Path:
    d = Path(os.environ.get("TOPOPLAN_MCORE_DIR") or REPO / ".cache" / "megatron-core-0.19.2")
    if not (d / "megatron" / "training" / "training.py").exists():
        pytest.skip("megatron-core 0.19.2 is fetched by tests/test_emit_trainers.py (marker trainers)")
    return d


# --- the format strings, built exactly as megatron-core 0.19.2 builds them ------------------------------
def megatron_iteration(it, total, consumed, ms, tflops, gbs):
    # training.py training_log, the lines quoted in planner/trainers/megatron/logs.py
    log_string = " [2026-01-01 00:00:00.000000]"
    log_string += ' iteration {:8d}/{:8d} |'.format(it, total)
    log_string += ' consumed samples: {:12d} |'.format(consumed)
    log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(ms)
    log_string += f' throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |'
    log_string += f' learning rate: {1e-4:.6E} |'
    log_string += f' global batch size: {gbs:5d} |'
    log_string += ' number of skipped iterations: {:3d} |'.format(0)
    return log_string


def megatron_memory(rank, it, alloc, max_alloc, reserved, max_reserved):
    mega_bytes = 1.0
    string = f'(after {it} iterations)' + ' memory (MB)'
    string += f" | allocated: {alloc / mega_bytes:.2f}"
    string += f" | max allocated: {max_alloc / mega_bytes:.2f}"
    string += f" | reserved: {reserved / mega_bytes:.2f}"
    string += f" | max reserved: {max_reserved / mega_bytes:.2f}"
    return "[Rank {}] {}".format(rank, string)


def test_quoted_format_strings_are_megatrons():
    """Every format string the reader quotes occurs verbatim in megatron-core 0.19.2's source."""
    d = _mcore() / "megatron" / "training"
    src = "\n".join((d / f).read_text() for f in ("training.py", "arguments.py", "utils/common_utils.py"))
    quoted = [ln.strip() for ln in inspect.getsource(mreader).split('"""')[1].splitlines()
              if ln.startswith("      ") and ln.strip()]
    assert len(quoted) >= 14
    for q in quoted:
        assert q in src, q


def test_quoted_format_strings_are_torchtitans():
    from planner.trainers.torchtitan import logs as treader
    import torchtitan

    root = Path(torchtitan.__file__).parent
    src = "\n".join((root / f).read_text() for f in ("components/metrics.py", "distributed/parallel_dims.py",
                                                     "trainer.py"))
    quoted = [ln.strip() for ln in inspect.getsource(treader).split('"""')[1].splitlines()
              if ln.startswith("      ") and ln.strip()]
    assert len(quoted) >= 10
    for q in quoted:
        assert q in src, q


def _torchtitan_line(step, mem_gib, tps, tflops, mfu, color):
    """The step line torchtitan 0.3.0 prints: its own f-string, evaluated from its source."""
    import torchtitan.components.metrics as metrics

    src = inspect.getsource(metrics.MetricsProcessor.log)
    call = src[src.index('mfu_str = f"'):src.index("self.ntokens_since_last_log = 0")]
    fstring = call[call.index("logger.info(") + len("logger.info("):call.rindex(")")]
    stats = types.SimpleNamespace(max_reserved_gib=mem_gib, max_reserved_pct=100 * mem_gib / 80)
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    return eval("(" + fstring.strip() + ")", {}, dict(color=color, step=step, global_avg_loss=7.5, grad_norm=1.25,  # noqa: S307
                                  device_mem_stats=stats, tps=tps, tflops=tflops, mfu_str=mfu_str))


@pytest.mark.slow
@pytest.mark.parametrize("colored", [False, True])
def test_torchtitan_steps_from_its_own_format(tmp_path, colored):
    from torchtitan.tools.utils import Color, NoColor

    tps = [900.0, 3000.0, 4100.0, 4000.0, 3900.0, 4050.0, 3950.0, 4200.0, 4000.0, 3980.0]
    lines = ["[titan] 2026 - root - INFO - CUDA capacity: NVIDIA H100 80GB HBM3 with 79.11GiB memory",
             "[titan] 2026 - root - INFO - Building device mesh with parallelism: pp=1, dp_replicate=1, "
             "dp_shard=8, cp=1, tp=1, ep=1"]
    for i, t in enumerate(tps, 1):
        lines.append("[titan] 2026 - root - INFO - " + _torchtitan_line(i, 40.0 + i, t, t * 0.3, 30.0,
                                                                        Color if colored else NoColor))
    f = tmp_path / "titan.log"
    f.write_text("\n".join(lines) + "\n")
    run = read_log(f)
    skip = warmup_iters(10)
    assert skip == 2
    assert run.trainer == "torchtitan" and run.gpu == "H100" and run.iters_used == 8
    assert run.tokens_per_s_per_gpu == statistics.median(tps[skip:])
    assert run.peak_reserved_gib == pytest.approx(50.0)
    assert run.fields["num_gpus"] == 8 and run.fields["fsdp"] == 1 and run.fields["precision"] == "bf16"


def _megatron_text(times, mem=(), gbs=256, total=None, args=""):
    total = total or len(times)
    lines = [args] if args else []
    for i, ms in enumerate(times, 1):
        lines.append(megatron_iteration(i, total, i * gbs, ms, 400.0 * 1000 / ms, gbs))
    lines += [megatron_memory(*m) for m in mem]
    return "\n".join(lines) + "\n"


def test_megatron_warmup_median_and_memory(tmp_path):
    times = [9000.0, 1400.0, 1010.0, 990.0, 1000.0, 1200.0, 995.0, 1005.0, 1003.0, 998.0, 1001.0, 1002.0]
    mem = [(0, 1, 10.0, 20000.0, 30000.0, 30720.0), (4, 1, 10.0, 25000.0, 30000.0, 35840.0),
           (0, 2, 10.0, 30000.0, 40000.0, 40960.0), (4, 2, 10.0, 38000.0, 40000.0, 46080.0)]
    f = tmp_path / "rank0.log"
    f.write_text(_megatron_text(times, mem))
    run = read_log(f)
    # by hand: 12 iterations, warm-up max(2, ceil(12/5)) = 3, median of iterations 4..12
    assert run.iters_skipped == 3 and run.iters_used == 9
    assert run.step_s == pytest.approx(sorted(times[3:])[4] / 1000)
    # the latest report (after 2 iterations), worst rank: 38000 MB allocated, 46080 MB reserved
    assert run.peak_allocated_gib == pytest.approx(38000 / 1024)
    assert run.peak_reserved_gib == pytest.approx(45.0)
    row = run_row(run, {"model": "llama3-8b", "gpu": "H100", "num_gpus": "8", "seq_len": "8192",
                        "precision": "bf16", "stack": "megatron-26.08"})
    assert float(row["tokens_per_s_per_gpu"]) == pytest.approx(256 * 8192 / run.step_s / 8, rel=1e-3)
    from planner.model.flops import flops_per_token
    from planner.model.spec import load_model

    fpt = flops_per_token(load_model("llama3-8b"), 8192, tp=1, formula="current")
    assert float(row["model_tflops_per_gpu"]) == pytest.approx(float(row["tokens_per_s_per_gpu"]) * fpt / 1e12,
                                                               abs=0.06)


def test_too_few_iterations_and_bad_lines_name_the_file_and_line(tmp_path):
    f = tmp_path / "short.log"
    f.write_text(_megatron_text([1000.0] * 4))
    with pytest.raises(InputError, match=r"short.log: 2 iteration lines after the 2-iteration warm-up"):
        read_log(f)
    bad = tmp_path / "bad.log"
    text = _megatron_text([1000.0] * 10).splitlines()
    text[4] = text[4].replace("elapsed time per iteration (ms): 1000.0", "elapsed time per iteration (ms) 1000")
    bad.write_text("\n".join(text))
    with pytest.raises(InputError, match=r"bad.log:5: cannot read Megatron's iteration line"):
        read_log(bad)
    other = tmp_path / "notes.log"
    other.write_text("hello\n")
    with pytest.raises(InputError, match="not a Megatron, TorchTitan or MaxText log"):
        read_log(other)


def test_cli_refuses_a_bad_log_in_one_line(tmp_path):
    bad = tmp_path / "bad.log"
    text = _megatron_text([1000.0] * 10).splitlines()
    text[2] = text[2].split(" elapsed")[0]
    bad.write_text("\n".join(text))
    p = run_cli("validate", bad, "--model", "llama3-8b", "--cluster", "dgx-h100", cwd=REPO,
                env={"TOPOPLAN_NO_PROGRESS": "1"})
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "bad.log:3:" in p.stderr and "Traceback" not in p.stderr


ARGS_BLOCK = """------------------------ arguments ------------------------
  context_parallel_size ........................... 2
  cuda_graph_impl ................................. none
  expert_model_parallel_size ...................... 1
  fp8 ............................................. e4m3
  fp8_recipe ...................................... blockwise
  global_batch_size ............................... 256
  hidden_size ..................................... 4096
  micro_batch_size ................................ 1
  num_attention_heads ............................. 32
  num_experts ..................................... None
  num_layers ...................................... 32
  pipeline_model_parallel_size .................... 2
  recompute_granularity ........................... selective
  recompute_modules ............................... ['core_attn', 'mlp']
  seq_length ...................................... 8192
  tensor_model_parallel_size ...................... 2
  virtual_pipeline_model_parallel_size ............ 4
  world_size ...................................... 32
-------------------- end of arguments ---------------------"""


def test_megatron_arguments_give_the_row(tmp_path):
    f = tmp_path / "run.log"
    f.write_text(_megatron_text([1000.0] * 10, args=ARGS_BLOCK))
    run = read_log(f)
    assert run.fields == {"tp": 2, "pp": 2, "vpp": 4, "cp": 2, "ep": 1, "mbs": 1, "gbs": 256, "seq_len": 8192,
                          "num_gpus": 32, "precision": "fp8-block", "recompute": "core_attn+mlp", "fsdp": 0,
                          "cuda_graphs": "false"}
    rows = rows_from_logs([tmp_path], cluster="dgx-h100")
    assert rows[0]["model"] in ("llama3-8b", "llama3.1-8b") and rows[0]["gpu"] == "H100"
    # per-tensor FP8: the recipe the log names, megatron-core's default (delayed) when it names none; the
    # row's recipe then prices delayed scaling's amax all-reduce (planner/cost/terms/fp8_scaling.py)
    for line, want in (("  fp8_recipe ...................................... tensorwise", "tensorwise"), ("", "delayed")):
        h = tmp_path / want / "run.log"
        h.parent.mkdir()
        h.write_text(_megatron_text([1000.0] * 10, args=ARGS_BLOCK.replace(
            "  fp8_recipe ...................................... blockwise", line)))
        assert read_log(h).fields["fp8_recipe"] == want and read_log(h).fields["precision"] == "fp8"
        (row,) = rows_from_logs([h], cluster="dgx-h100")
        assert row_case(row).training.recipe.fp8_recipe == want
    # an unknown shape asks for --model
    g = tmp_path / "odd" / "run.log"
    g.parent.mkdir()
    g.write_text(_megatron_text([1000.0] * 10, args=ARGS_BLOCK.replace("4096", "4000")))
    with pytest.raises(InputError, match=r"give --model"):
        run_row(read_log(g), {"gpu": "H100"})


def test_csv_log_column_minimal_and_row_wins(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text(_megatron_text([1000.0] * 10, args=ARGS_BLOCK))
    csv_path = tmp_path / "runs.csv"
    csv_path.write_text("id,stack,model,gpu,num_gpus,log,precision\n"
                        "a,megatron-26.08,llama3-8b,H100,32,logs/a.log,\n"
                        "b,megatron-26.08,llama3-8b,H100,32,logs/a.log,bf16\n")
    rows = read_rows(csv_path)
    assert [r["precision"] for r in rows] == ["fp8-block", "bf16"]   # empty cell: the log's; else the row's
    assert rows[0]["tp"] == "2" and rows[0]["iters_used"] == "8"
    assert float(rows[0]["tokens_per_s_per_gpu"]) == pytest.approx(256 * 8192 / 1.0 / 32, rel=1e-3)
    bad = tmp_path / "bad.csv"
    bad.write_text("id,stack,model,gpu,log\na,megatron-26.08,llama3-8b,H100,logs/a.log\n")
    with pytest.raises(InputError, match=r"bad.csv: missing column 'num_gpus'"):
        read_rows(bad)


@pytest.mark.trainers
def test_megatron_print_args_output_reads_back(tmp_path):
    """megatron-core's own parse_args / validate_args / _print_args on emitted launch files; the
    reader gets the layout, batch, precision and recompute the files set."""
    from planner.output.emit import emit_plan
    from trainers.plans import hgx_cluster, plan_doc
    from trainers.sites import bash_words
    from planner.config import ParallelConfig, Training
    from planner.model.spec import load_model

    mcore = _mcore()
    cases = {
        "dense": ("llama3-8b", ParallelConfig(tp=2, pp=2, vpp=2, cp=1, mbs=1, recompute="core_attn"),
                  Training(seq_len=4096, global_batch=64, precision="fp8")),
        "moe": ("qwen3-30b-a3b", ParallelConfig(tp=1, pp=1, ep=8, mbs=2, recompute="full"),
                Training(seq_len=4096, global_batch=64, precision="bf16")),
    }
    jobs = []
    for name, (model, cfg, tr) in cases.items():
        doc = plan_doc(model, hgx_cluster("h100", 2), cfg, tr)
        out = tmp_path / name
        emit_plan(doc, ["megatron"], out)
        env = dict(line[7:].split("=", 1) for line in (out / "megatron" / "env.sh").read_text().splitlines()
                   if line.startswith("export "))
        jobs.append({"id": name, "args": bash_words(out / "megatron" / "args.txt"), "env": env})
    script = (
        "import contextlib, io, json, os, sys\n"
        f"sys.path.insert(0, {str(HARNESS)!r})\n"
        "import megatron_check\n"
        "from megatron.training.arguments import _print_args, parse_args, validate_args\n"
        "res, (jobs_path, out_path) = {}, sys.argv[1:3]\n"
        "for job in json.load(open(jobs_path)):\n"
        "    os.environ.update({'RANK': '0', 'LOCAL_RANK': '0', **job['env']})\n"
        "    sys.argv = ['pretrain_gpt.py', *job['args']]\n"
        "    args = parse_args(); validate_args(args)\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        _print_args('arguments', args)\n"
        "    res[job['id']] = buf.getvalue()\n"
        "json.dump(res, open(out_path, 'w'))\n")
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mcore), str(HARNESS)])}
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path / "jobs.json"), str(tmp_path / "out.json")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    printed = json.loads((tmp_path / "out.json").read_text())
    for name, (model, cfg, tr) in cases.items():
        text = printed[name]
        assert text.startswith("------------------------ arguments ------------------------")
        f = tmp_path / f"{name}.log"
        f.write_text(text + _megatron_text([1000.0] * 10, gbs=tr.global_batch))
        run = read_log(f)
        fl = run.fields
        assert (fl["tp"], fl["pp"], fl["vpp"], fl["ep"], fl["mbs"], fl["gbs"], fl["seq_len"], fl["num_gpus"]) == (
            cfg.tp, cfg.pp, cfg.vpp, cfg.ep, cfg.mbs, tr.global_batch, tr.seq_len, 16)
        assert fl["precision"] == tr.precision and fl["recompute"] == cfg.recompute
        assert run_row(run, {"gpu": "H100"})["model"].startswith(model.split("-")[0])


# --- memory: measured peaks fit the reserve terms (planner.calibration.memfit) -----------------------------
def _mem_rows():
    base = {"stack": "megatron-26.08", "model": "llama3-8b", "gpu": "H100", "num_gpus": "8", "precision": "bf16",
            "seq_len": "8192", "gbs": "64", "tp": "1", "pp": "1", "vpp": "1", "cp": "1", "ep": "1", "etp": "",
            "fsdp": "", "recompute": "none", "tokens_per_s_per_gpu": "10000", "model_tflops_per_gpu": "500"}
    return [dict(base, id=f"m{mbs}-{tp}", mbs=str(mbs), tp=str(tp)) for mbs, tp in ((1, 1), (1, 2), (2, 2))]


def _split(row, profile):
    from planner.calibration.validate import predict_case, row_case

    comp = predict_case(row_case(row, profile=profile), profile).memory
    return sum(v for k, v in comp.items() if k != "reserve"), comp["activations"] + comp["expert_imbalance"] + comp["logits"]


def test_memory_fit_recovers_reserve_and_fragmentation():
    from planner.cost.predict import predict
    from planner.cost.profiles import dump_profile, load_profile, parse_profile
    from planner.calibration.memfit import fit_memory
    from planner.calibration.validate import row_case

    prof = load_profile("megatron-26.08")
    rows = []
    for r in _mem_rows():
        modelled, acts = _split(r, prof)
        rows.append(dict(r, device_used_gib=f"{modelled + 6.0 + 0.25 * acts:.4f}"))
    acts_seen = {round(_split(r, prof)[1], 2) for r in rows}
    assert len(acts_seen) == 3          # the runs differ in activation size: both terms are identified
    fit = fit_memory(rows, prof)
    assert fit.runs == 3
    assert fit.reserve_gib == pytest.approx(6.0, abs=0.15) and fit.fragmentation == pytest.approx(0.25, abs=0.01)
    fitted = prof.model_copy(update={"memory": fit})
    assert parse_profile(dump_profile(fitted), "x.yaml").memory == fit       # the YAML keeps it
    for r in rows:   # predict uses it: the measured peak back within 0.15 GiB
        c = row_case(r, profile=fitted)
        p = predict(c.model, c.cluster, c.config, c.training, profile=fitted)
        assert p.memory_gib_per_gpu == pytest.approx(float(r["device_used_gib"]), abs=0.15)
        assert p.memory["reserve"] == pytest.approx(fit.reserve_gib + fit.fragmentation * _split(r, prof)[1])


def test_memory_fit_from_max_reserved_and_without_memory():
    from planner.cost.profiles import load_profile
    from planner.calibration.memfit import NON_ALLOCATOR_GIB, fit_memory, measured_peak_gib

    assert measured_peak_gib({"peak_reserved_gib": "40.0"}) == 40.0 + NON_ALLOCATOR_GIB
    assert measured_peak_gib({"peak_reserved_gib": "40.0", "device_used_gib": "45.5"}) == 45.5
    prof = load_profile("megatron-26.08")
    assert fit_memory(_mem_rows(), prof) is None        # no run printed memory: the defaults stay
    one = _mem_rows()[0]
    modelled, acts = _split(one, prof)
    fit = fit_memory([dict(one, device_used_gib=str(modelled + 10.0))], prof)
    # one run fixes the sum only: reserve + fragmentation * activations = 10 GiB
    assert fit.reserve_gib + fit.fragmentation * acts == pytest.approx(10.0, abs=0.1)


def test_plan_keeps_the_fitted_reserve():
    import planner
    import topologies
    from planner.cost.profiles import MemoryFit, load_profile

    model = planner.load_model("llama3-8b")
    cluster = topologies.load_cluster("dgx-h100", gpus=8)
    tr = planner.Training(seq_len=8192, global_batch=64, precision="bf16", stack="megatron-26.08")
    prof = load_profile("megatron-26.08")
    big = prof.model_copy(update={"memory": MemoryFit(reserve_gib=40.0, fragmentation=0.05)})
    plain = planner.plan(model, cluster, tr, top=1, profile=prof).to_dict()["plans"][0]["prediction"]
    tight = planner.plan(model, cluster, tr, top=1, profile=big).to_dict()["plans"][0]["prediction"]
    assert tight["memory"]["reserve"] >= 40.0 and tight["memory_gib_per_gpu"] <= tight["usable_gib"]
    assert plain["memory"]["reserve"] < tight["memory"]["reserve"] - 30.0


@pytest.mark.slow
def test_calibrate_from_a_known_stack(tmp_path):
    from planner.calibration.priors import base_profile, start_profile
    from planner.cost.profiles import load_profile

    start = load_profile("megatron-26.04")
    p = start_profile("my-new-stack", start)
    assert p.name == "my-new-stack" and p.flops_formula == base_profile("my-new-stack").flops_formula
    assert all(p.params[k].prior == start.params[k].value and p.params[k].value == start.params[k].value
               for k in start.params)
    out = tmp_path / "fitted.yaml"
    r = run_cli("calibrate", REPO / "examples" / "logs" / "runs.csv", "--stack", "my-megatron", "--from",
                "megatron-26.04", "-o", out, "--json", cwd=tmp_path, env={"TOPOPLAN_NO_PROGRESS": "1"})
    assert r.returncode == 0, r.stderr
    fitted = load_profile(str(out))
    assert fitted.name == "my-megatron" and "megatron-26.04's value" in fitted.params["gemm.bf16"].source
    assert json.loads(r.stdout)["rows"] == 6 and json.loads(r.stdout)["memory"] is None   # the logs print no memory


def test_megatron_bridge_memory_report(tmp_path):
    """Megatron-Bridge's report (train_utils.training_log): GB of 1e9 bytes under memory_stats names."""
    lines = _megatron_text([1000.0] * 10).splitlines()
    for rank, peak in ((0, 50.25), (3, 61.5)):
        memory_string = "(after 2 iterations) memory (GB)"
        for metric, value in {"mem-allocated-bytes": 20.0, "mem-max-allocated-bytes": peak - 4.0,
                              "mem-reserved-bytes": 30.0, "mem-max-reserved-bytes": peak,
                              "mem-alloc-retires": 0}.items():
            memory_string += f" | {metric}: {value}"
        lines.append("[Rank {}] {}".format(rank, memory_string))
    f = tmp_path / "bridge.log"
    f.write_text("\n".join(lines) + "\n")
    run = read_log(f)
    assert run.peak_reserved_gib == pytest.approx(61.5e9 / 2**30)
    assert run.peak_allocated_gib == pytest.approx(57.5e9 / 2**30)


# --- a log of another model than --model / the CSV's model column (issue 23 item 4) ---------------------
def test_a_log_of_another_model_is_refused(tmp_path):
    # ARGS_BLOCK is Llama-3-8B's shape (32 layers, 4096 wide, 32 heads, dense): DeepSeek-V3 is not that model
    f = tmp_path / "run.log"
    f.write_text(_megatron_text([1000.0] * 10, args=ARGS_BLOCK))
    assert rows_from_logs([f], model="llama3-8b", cluster="dgx-h100")[0]["model"] == "llama3-8b"   # the control
    with pytest.raises(InputError) as err:
        rows_from_logs([f], model="deepseek-v3", cluster="dgx-h100")
    msg = str(err.value)
    assert "--model deepseek-v3" in msg and "num_layers 32 in the log, 61 in deepseek-v3" in msg and "\n" not in msg
    # the CSV's model column is checked the same way
    csv_path = tmp_path / "runs.csv"
    csv_path.write_text("id,stack,model,gpu,num_gpus,log\na,megatron-26.08,qwen3-30b-a3b,H100,32,run.log\n")
    with pytest.raises(InputError, match=r"runs.csv: row a: model qwen3-30b-a3b \(num_layers 32 in the log, 48"):
        read_rows(csv_path)


def test_calibrate_refuses_a_log_of_another_model(tmp_path):
    f = tmp_path / "run.log"
    f.write_text(_megatron_text([1000.0] * 10, args=ARGS_BLOCK))
    r = run_cli("calibrate", f, "--model", "deepseek-v3", "--cluster", "dgx-h100", "--stack", "megatron-26.08",
                "--out", tmp_path / "p.yaml")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("error: ") and "another model" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_maxtext_and_torchtitan_logs_say_their_model(tmp_path):
    from planner.calibration.runs import shape_mismatch
    from planner.model.flops import param_counts
    from planner.model.spec import load_model

    steps = "\n".join(f"completed step: {i}, seconds: 1.000, TFLOP/s/device: 400.000, Tokens/s/device: 8000.000"
                      for i in range(1, 11))
    params = ("Config param base_num_decoder_layers: 32\nConfig param base_emb_dim: 4096\n"
              "Config param base_num_query_heads: 32\nConfig param num_experts: 1\n")
    f = tmp_path / "mt.log"
    f.write_text(params + steps + "\n")
    run = read_log(f)
    # MaxText counts a dense model as num_experts 1, the spec as 0: Llama-3-8B's shape, not DeepSeek-V3's
    assert run.shape == {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_experts": 0}
    assert shape_mismatch(load_model("llama3-8b"), run.shape) is None
    assert shape_mismatch(load_model("deepseek-v3"), run.shape)
    n = param_counts(load_model("llama3-8b")).total
    assert shape_mismatch(load_model("llama3-8b"), {"params": n}) is None
    assert "70" in shape_mismatch(load_model("llama3-70b"), {"params": n})


def test_maxtext_log_reads_the_pipeline_repeats_as_vpp():
    from planner.trainers.maxtext.logs import row_fields
    base = {"ici_pipeline_parallelism": "4", "ici_tensor_parallelism": "8", "dcn_fsdp_parallelism": "2"}
    assert row_fields({"params": {**base, "num_pipeline_repeats": "4"}})["vpp"] == 4
    assert row_fields({"params": {**base, "num_pipeline_repeats": "-1"}})["vpp"] == 1
    no_pp = {**base, "ici_pipeline_parallelism": "1", "num_pipeline_repeats": "3"}
    assert row_fields({"params": no_pp})["vpp"] == 1 and row_fields({"params": no_pp})["pp"] == 1
