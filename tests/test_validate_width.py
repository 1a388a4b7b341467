"""``validate`` at 80 columns keeps its ``fits`` column and its caption (issue 23 item 5), also when the
run ids are long (trial directories, log names) and the rows come from two stacks: before, rich cropped
the table at the right edge, losing ``error`` and ``fits`` and the caption's end. Oracle: the figures of
``validate --json`` for the same CSV, each found whole in the table (tests/test_terminal_width.py's checks)."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from test_terminal_width import check_lines, run, tokens_in

ROWS = ("id,stack,model,gpu,num_gpus,precision,seq_len,gbs,mbs,tp,pp,vpp,cp,ep,model_tflops_per_gpu\n"
        "trial-00-tp1-pp2-vpp8-ep32-mbs1,megatron-26.08,deepseek-v3,GB300,256,mxfp8,4096,4096,1,1,2,8,1,32,1600\n"
        "llama-run-with-a-long-name-01,megatron-26.04,llama3.1-405b,GB200,256,fp8,8192,2048,1,4,16,4,1,1,2100\n"
        "refused-row-with-a-long-id-02,megatron-26.08,llama3-8b,H100,8,bf16,8192,10,1,1,1,1,1,1,400\n")


@pytest.mark.parametrize("width", [80, 100])
def test_long_ids_keep_fits_and_caption(tmp_path, capsys, monkeypatch, width):
    csv = tmp_path / "runs.csv"
    csv.write_text(ROWS)
    monkeypatch.setenv("TOPOPLAN_NO_PROGRESS", "1")
    assert main(["validate", str(csv), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rc, out, _ = run(capsys, monkeypatch, width, "validate", csv)
    assert rc == 0
    check_lines(out, width)
    table = out.split("MAPE")[0]
    header = next(line for line in table.splitlines() if " prec " in line)
    assert header.split()[-1] == "fits" and "error" in header.split()
    assert tokens_in("pred, meas: model TFLOP/s per GPU; error: pred / meas - 1; fits: in HBM", table)
    for r in doc["rows"]:
        line = next(ln for ln in table.splitlines() if ln.startswith(r["id"]) or f" {r['id']} " in ln)
        if r["refused"]:
            assert line.rstrip().endswith("refused")
        else:
            assert f"{r['error_pct']:+.1f}%" in line and line.rstrip().endswith("yes")
