"""A measured row whose layout its trainer refuses (issue 23 item 4): validate shows it refused, naming the
rule, instead of "pred 0, fits yes"; calibrate never fits it. The rules are the trainers' own
(planner.rules: megatron-core's validate_args wording); the oracle for calibrate is the fit without the row."""

from __future__ import annotations


import pytest
from cli_run import run_cli

from planner.calibration.calibrate import calibrate_rows
from planner.calibration.validate import read_rows, validate_rows

HEAD = "id,stack,model,gpu,num_gpus,precision,seq_len,gbs,mbs,tp,pp,model_tflops_per_gpu\n"
GOOD = ["a,mine,llama3-8b,H100,8,bf16,8192,64,1,1,1,420\n", "b,mine,llama3-8b,H100,16,bf16,8192,128,1,2,1,380\n"]
# TP3 on 8 GPUs: megatron-core asserts world % (tp*pp*cp) == 0; today it was predicted 0 TFLOP/s and "fits"
TP3 = "bad,mine,llama3-8b,H100,8,bf16,8192,64,1,3,1,9000\n"
# GBS 10 on DP 8: megatron-core's microbatch calculator refuses it; today it was predicted as if it ran
GBS10 = "gbs,mine,llama3-8b,H100,8,bf16,8192,10,1,1,1,9000\n"


def _csv(tmp_path, *rows):
    p = tmp_path / "rows.csv"
    p.write_text(HEAD + "".join(rows))
    return p


def test_validate_names_the_broken_rule(tmp_path):
    res = validate_rows(read_rows(_csv(tmp_path, *GOOD, TP3, GBS10)), stack="megatron-26.08")
    by_id = {r["id"]: r for r in res["rows"]}
    assert by_id["bad"]["refused"].startswith("world_div_model_parallel: ")
    assert by_id["gbs"]["refused"].startswith("gbs_div_mbs_dp: ")
    for rid in ("bad", "gbs"):
        assert by_id[rid]["predicted_tflops_per_gpu"] is None and by_id[rid]["error_pct"] is None
        assert by_id[rid]["fits"] is None
    assert by_id["a"]["refused"] is None and by_id["a"]["predicted_tflops_per_gpu"] > 0
    good = validate_rows(read_rows(_csv(tmp_path, *GOOD)), stack="megatron-26.08")
    assert res["mape_pct"] == good["mape_pct"]      # refused rows count in no error figure


def test_validate_cli_shows_refused_with_the_rule(tmp_path):
    r = run_cli("validate", _csv(tmp_path, *GOOD, TP3), "--stack", "megatron-26.08", env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    assert "refused" in r.stdout and "rule world_div_model_parallel" in r.stdout
    bad_line = next(ln for ln in r.stdout.splitlines() if ln.startswith("bad "))
    assert " 0 " not in bad_line and "yes" not in bad_line


def test_calibrate_never_fits_a_refused_row(tmp_path):
    with_bad, info = calibrate_rows(read_rows(_csv(tmp_path, *GOOD, TP3, GBS10)), "mine", source="rows.csv")
    without, _ = calibrate_rows(read_rows(_csv(tmp_path, *GOOD)), "mine", source="rows.csv")
    assert info["rows"] == 2 and [x["id"] for x in info["refused"]] == ["bad", "gbs"]
    for key, p in with_bad.params.items():   # 9000 TFLOP/s rows would drag the fit if they were used
        assert p.value == pytest.approx(without.params[key].value), key
