"""validate: predicted against the published measurements in planner/data/profiles/calibration.csv
(NVIDIA's Megatron-Bridge performance summary tables, see planner/data/profiles/README.md)."""

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.calibration.validate import read_rows, validate_rows

CSV = Path(__file__).resolve().parents[1] / "planner" / "data" / "profiles" / "calibration.csv"


@pytest.fixture(scope="module")
def result():
    return validate_rows(read_rows(CSV), source=str(CSV))


def test_mape_targets(result):
    rows = result["rows"]
    assert len(rows) == 32
    assert result["mape_pct"] <= 10.0
    for stack in ("megatron-26.04", "megatron-26.08"):
        errs = [abs(r["error_pct"]) for r in rows if r["stack"] == stack]
        assert sum(errs) / len(errs) <= 10.0, stack
    within = [r for r in rows if abs(r["error_pct"]) <= 25.0]
    assert len(within) >= 31  # see docs/steptime.md for the one row outside (GPT-OSS on HGX B300)


# Published recipes that run without CUDA graphs / op fusion (planner/data/published_recipes.yaml records
# it for the rows of calibration.csv): mb234, Megatron-Bridge gpt_oss_workload_base_configs.py (B300, 26.06: CUDA graphs commented out);
# Kimi-K2 256 GB300 (26.06 table, not in calibration.csv, 1,099 TFLOP/s and 5,372 tokens/s per GPU:
# kimi_workload_base_configs.py, cuda_graph_scope=[], moe_a2a_overlap=False).
KIMI = dict(id="kimi-gb300", stack="megatron-26.08", model="kimi-k2", gpu="GB300", num_gpus="256", precision="mxfp8",
            seq_len="4096", gbs="4096", mbs="2", tp="1", pp="4", vpp="4", cp="1", ep="64", etp="", fsdp="",
            recompute="mla_up_proj", model_tflops_per_gpu="1099", tokens_per_s_per_gpu="5372")


def test_eager_recipes_with_their_regime():
    mb234 = next(r for r in read_rows(CSV) if r["id"] == "mb234")
    graphed = validate_rows([dict(r, cuda_graphs="true") for r in (mb234, KIMI)], source="test")["rows"]
    eager = validate_rows([mb234, dict(KIMI, cuda_graphs="false")], source="test")["rows"]  # mb234: recorded
    # as graph-captured recipes both are predicted far too fast; run eagerly, within 10%
    # (Kimi-K2 in tokens/s: its FLOP convention is the 26.06 table's)
    assert graphed[0]["error_pct"] > 25 and graphed[1]["predicted_tokens_per_s_per_gpu"] > 1.25 * 5372
    assert abs(eager[0]["error_pct"]) <= 10
    assert abs(eager[1]["predicted_tokens_per_s_per_gpu"] / 5372 - 1) <= 0.10


def test_headline_row_within_5_percent(result):
    head = next(r for r in result["rows"] if r["id"] == "mb276")
    assert abs(head["predicted_tflops_per_gpu"] - 1640) / 1640 <= 0.05
    assert head["fits"]


def test_every_row_fits_as_published(result):
    # the published runs ran, so the cheapest recompute that fits exists for every row
    assert all(r["fits"] for r in result["rows"])


BENCH_TABLES = sorted((Path(__file__).resolve().parents[1] / "bench" / "data").glob("*.csv"))


@pytest.mark.parametrize("table", BENCH_TABLES, ids=[p.name for p in BENCH_TABLES])
def test_every_benchmark_table_run_fits_as_published(table):
    # the measured runs of bench/data ran too: none is refused as not fitting with its recipe's
    # recompute (an empty recompute: the cheapest that fits, as validate prices it)
    from planner.calibration.validate import fits_as_run, predict_case, row_case

    rows = read_rows(table)
    assert rows
    cases = [row_case(r, source=table.name) for r in rows]
    assert not [c.id for c in cases if not fits_as_run(predict_case(c), c)]


def test_benchmark_tables_include_the_new_ones():
    names = {p.name for p in BENCH_TABLES}
    assert {"megatron-bridge-25.09.csv", "torchtitan-more.csv", "megatron-bridge-26.04-hgx-dsv3.csv"} <= names


def test_cli_json_schema(capsys, tmp_path):
    sub = tmp_path / "rows.csv"
    lines = CSV.read_text().splitlines()
    sub.write_text("\n".join([lines[0]] + [l for l in lines[1:] if l.startswith(("mb276", "mb282"))]) + "\n")
    code = main(["validate", str(sub), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"rows", "mape_pct"}
    assert [r["id"] for r in doc["rows"]] == ["mb276", "mb282"]  # file order
    for r in doc["rows"]:
        assert set(r) == {"id", "predicted_tflops_per_gpu", "predicted_tokens_per_s_per_gpu",
                          "measured_tflops_per_gpu", "error_pct", "fits", "refused"}
        assert r["refused"] is None   # both rows run (tests/test_refused_rows.py has refused ones)
        assert r["error_pct"] == pytest.approx(
            100 * (r["predicted_tflops_per_gpu"] - r["measured_tflops_per_gpu"]) / r["measured_tflops_per_gpu"], abs=0.1)


def test_cli_bad_csv(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,model\nx,deepseek-v3\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "missing column" in err and err.count("\n") == 1
    assert main(["validate", str(tmp_path / "nope.csv")]) == 2


def test_unknown_gpu_names_the_column(tmp_path, capsys):
    lines = CSV.read_text().splitlines()
    row = next(l for l in lines if l.startswith("mb282")).replace(",GB300,", ",TPUv5,")
    f = tmp_path / "r.csv"
    f.write_text(lines[0] + "\n" + row + "\n")
    assert main(["validate", str(f)]) == 2
    assert "gpu 'TPUv5'" in capsys.readouterr().err


def test_megatron_release_names_resolve_to_the_shipped_profiles():
    from planner.errors import InputError
    from planner.cost.profiles import load_profile, resolve_name

    assert resolve_name("megatron-26.06") == "megatron-26.08"      # the 26.06 rows are in the 26.08 fit
    assert resolve_name("megatron-26.04.01") == "megatron-26.04"
    assert resolve_name("megatron-25.11") == "megatron-26.04"      # legacy FLOP formula, like 26.04
    assert load_profile("megatron").name == "megatron-26.08"
    with pytest.raises(InputError, match="unknown stack profile 'nemo-1'"):
        load_profile("nemo-1")


def test_torchtitan_profile_on_its_published_rows():
    csv_path = Path(__file__).resolve().parents[1] / "planner" / "data" / "profiles" / "torchtitan-h100-2024-12.csv"
    res = validate_rows(read_rows(csv_path), source=str(csv_path))
    # tt1-tt8 compiled with torch.compile, ttx1/ttx2 eager (the column torch_compile says which)
    assert len(res["rows"]) == 10 and res["mape_pct"] <= 10.0
    assert sorted(r["torch_compile"] for r in read_rows(csv_path)) == ["false"] * 2 + ["true"] * 8
    assert all(abs(r["error_pct"]) <= 25.0 for r in res["rows"])


def test_optional_columns_dispatcher_and_etp_fallback():
    from planner.calibration.validate import row_case

    mb234 = next(r for r in read_rows(CSV) if r["id"] == "mb234")
    assert row_case(mb234).config.dispatcher == "flex-hybridep"          # the stack's dispatcher
    assert row_case(dict(mb234, dispatcher="alltoall")).config.dispatcher == "alltoall"
    # Qwen3-235B on 256 H100 as Megatron-Bridge's 26.02 table ran it: TP2 PP8 EP32 with ETP left out;
    # Megatron's default ETP = TP = 2 needs 2*32*8 = 512 GPUs, so the run set ETP = 1
    row = dict(mb234, model="qwen3-235b-a22b", gpu="H100", num_gpus="256", precision="fp8", gbs="8192", mbs="1",
               tp="2", pp="8", vpp="4", ep="32", etp="")
    assert row_case(row).config.etp == 1
    assert row_case(dict(row, ep="16")).config.etp is None                # 2*16*8 = 256: the default holds
    assert row_case(dict(row, etp="2", ep="16")).config.etp == 2
    from planner.errors import InputError

    with pytest.raises(InputError, match="mb234.*dispatcher"):
        row_case(dict(mb234, dispatcher="pigeon"))


def test_published_recipe_recompute_fills_an_empty_column_only():
    # mb196 (GPT-OSS-120B, 64 H100, 26.04.01): Megatron-Bridge v0.4.2's H100 preset recomputes layernorm and
    # the MoE activation and the library recipe runs eagerly with the NCCL all-to-all
    # (planner/data/published_recipes.yaml); the CSV leaves recompute empty, so the facts fill it
    from planner.calibration.validate import row_case

    mb196 = next(r for r in read_rows(CSV) if r["id"] == "mb196")
    assert not mb196["recompute"].strip()
    case = row_case(mb196)
    assert case.config.recompute_modules == ("layernorm", "moe_act")
    assert case.config.dispatcher == "alltoall" and not case.training.cuda_graphs
    # a row's own column wins; a row that only shares the id is not touched
    assert row_case(dict(mb196, recompute="none")).config.recompute == "none"
    other = row_case(dict(mb196, gpu="H200"))
    assert other.config.recompute_modules != ("layernorm", "moe_act") and other.training.cuda_graphs


def _bench_row(table: str, rid: str) -> tuple[str, str]:
    path = Path(__file__).resolve().parents[1] / "bench" / "data" / table
    lines = path.read_text().splitlines()
    return lines[0], next(l for l in lines if l.startswith(rid + ","))


def test_mtp_layers_column_overrides_the_config(tmp_path, capsys):
    """A published DeepSeek-V3 run 'w/o MTP' (the 25.11 table's GB300 rows) is priced without the MTP layer the
    config has (num_nextn_predict_layers = 1): one MoE layer and its output head (at most 1.5 layers' work) fewer.
    The step is shorter by at least half a layer of 62 and by at most 1.5 layers on the last of the pp x vpp
    virtual stages of 61 / (pp vpp) layers, which paces the pipeline; a negative depth is refused with the column
    named."""
    import csv
    import io

    from planner.calibration.validate import predict_case, row_case

    head, line = _bench_row("megatron-bridge-25.11.csv", "gb300-dsv3-bf16")
    row = next(csv.DictReader(io.StringIO(head + "\n" + line + "\n")))
    assert row["mtp_layers"] == "0"
    without = row_case(row)
    with_mtp = row_case(dict(row, mtp_layers=""))
    assert without.model.mtp_layers == 0 and with_mtp.model.mtp_layers == 1
    t0, t1 = predict_case(without).step_time_s, predict_case(with_mtp).step_time_s
    stages = without.config.pp * without.config.vpp
    assert 1 + 0.5 / 62 < t1 / t0 < 1 + 1.5 * stages / 61
    f = tmp_path / "neg.csv"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(row), lineterminator="\n")
    w.writeheader()
    w.writerow(dict(row, mtp_layers="-1"))
    f.write_text(buf.getvalue())
    assert main(["validate", str(f)]) == 2
    assert "'mtp_layers'" in capsys.readouterr().err
