"""Sense checks of plan / predict options (planner/cli/checks.py): errors name the option, warnings
say why and what to try. Oracles: the models' own config values (max_position_embeddings from
planner/data/models.json, as Hugging Face publishes them), primes and gcds worked by hand."""

import pytest

from planner.cli import main
from planner.cli.checks import FLAGS, flag_message, input_warnings, nearby_gbs
from planner.model.spec import load_model

# TP2: fits in memory up to 16k tokens (predict of a layout that does not fit exits 3)
PREDICT = ["predict", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "2", "--json"]
PLAN = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--top", "1", "--json"]


def _run(argv, capsys):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_model_context_from_config():
    # Hugging Face config.json values: Llama 3 8B 8192, DeepSeek-V3 163840, Qwen3-30B-A3B 40960
    assert load_model("llama3-8b").max_position_embeddings == 8192
    assert load_model("deepseek-v3").max_position_embeddings == 163840
    assert load_model("qwen3-30b-a3b").max_position_embeddings == 40960


def test_seq_len_beyond_context_warns(capsys):
    code, out, err = _run(PREDICT + ["--gbs", "64", "--seq-len", "16384"], capsys)
    assert code == 0 and out.startswith("{")
    assert err.startswith("warning: --seq-len 16384 is beyond llama3-8b's context of 8192 tokens")
    code, out, err = _run(PREDICT + ["--gbs", "64", "--seq-len", "8192"], capsys)
    assert code == 0 and "warning" not in err                     # at the context: no warning


@pytest.mark.parametrize("seq", ["1", "15"])
def test_seq_len_too_short_is_an_error(capsys, seq):
    code, out, err = _run(PREDICT + ["--gbs", "64", "--seq-len", seq], capsys)
    assert code == 2 and out == ""
    assert err == (f"error: --seq-len {seq}: shorter than 16 tokens, so a step is all fixed cost and no recipe "
                   "trains like that; give the training sequence length (e.g. 4096)\n")
    assert _run(PREDICT + ["--gbs", "64", "--seq-len", "16"], capsys)[0] == 0


def test_precision_any_case_and_errors_name_the_flag(capsys):
    from planner.config import Training

    assert Training(global_batch=1, precision="MXFP8").precision == "mxfp8"
    code, out, err = _run(PREDICT + ["--gbs", "64", "--precision", "FP8"], capsys)
    assert code == 0 and err == ""
    for argv in (PREDICT + ["--gbs", "64"], PLAN + ["--gbs", "64"]):
        code, out, err = _run(argv + ["--precision", "fp9"], capsys)
        assert code == 2 and out == ""
        assert err == "error: --precision 'fp9': use one of bf16, fp8, fp8-block, mxfp8, nvfp4\n"
    code, out, err = _run(PLAN + ["--gbs", "64", "--trainer", "deepspeed"], capsys)
    assert code == 2 and err.startswith("error: --trainer 'deepspeed': unknown trainer") and "field" not in err


def test_flag_table_covers_training_fields():
    from planner.config import ParallelConfig, Training

    assert {"seq_len", "global_batch", "precision", "trainer", "stack"} <= set(FLAGS)
    assert {"tp", "pp", "cp", "ep", "dp", "mbs"} <= set(FLAGS) & set(ParallelConfig.model_fields)
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as ei:
        Training(global_batch=0)
    assert flag_message(ei.value).startswith("--gbs 0: ")


@pytest.mark.parametrize("gbs,gpus,warned", [
    (4099, None, True),      # prime
    (4096, None, False),
    (97, 64, True),          # prime
    (2 * 3 * 5 * 7, 64, False),   # 210 shares 2 with 64: DP 2 possible
    (3 ** 5, 64, True),      # 243 is odd: coprime with 64 GPUs, only DP 1
    (3 ** 5, 24, False),     # but 3 divides 24
    (1, 8, False),
])
def test_gbs_warning_cases(gbs, gpus, warned):
    lines = input_warnings(load_model("llama3-8b"), seq_len=4096, gbs=gbs, gpus=gpus)
    assert bool(lines) == warned
    if warned:
        lo, hi = nearby_gbs(gbs, gpus)
        assert f"try --gbs {lo} or {hi}" in lines[0] and f"--gbs-range {lo}:{hi}" in lines[0]
        assert lo < gbs < hi or lo == gbs - gbs % (hi - lo)


def test_nearby_gbs_by_hand():
    assert nearby_gbs(4099, None) == (4096, 4352)      # step 256
    assert nearby_gbs(4099, 64) == (4096, 4160)        # step 64: divides the 64 GPUs
    assert nearby_gbs(97, 64) == (96, 112)             # step 16 (<= 97 / 4)
    assert nearby_gbs(243, 24) == (240, 248)           # step 8 divides 24
    for gbs in range(2, 3000, 7):
        lo, hi = nearby_gbs(gbs, 64)
        step = hi - lo
        assert lo % step == 0 and lo <= gbs < hi and 64 % step == 0


def test_plan_prime_gbs_warns_with_the_range_flag(capsys):
    assert main([*PLAN, "--gbs", "61"]) == 0
    err = capsys.readouterr().err
    assert ("warning: --gbs 61 is prime: a global batch must split evenly into micro-batches on every data-parallel "
            "rank, so only data parallelism 1 or 61 fits; try --gbs 56 or 64, or --gbs-range 56:64 to let the "
            "planner choose\n") in err
    # with --gbs-range the planner chooses: no warning
    assert main([*PLAN, "--gbs", "61", "--gbs-range", "32:64"]) == 0
    assert "warning: --gbs" not in capsys.readouterr().err
