"""Every terminal view renders at 80 and at 160 columns without a truncated figure or name.

Rich shortens a cell it cannot fit with "…"; the views must instead wrap prose between words, move
columns to a second line or drop a column whose figures are printed elsewhere. Each test renders a
view through the real CLI entry point (``planner.cli.main``, with ``COLUMNS`` set, as a terminal of
that width does) or through the view's own function on a ``rich`` Console of that width, and checks
that no "…" appears and that the figures the user came for (each TFLOP/s, layout, error %, model
name, option name) appear whole, taking them from the command's ``--json`` output or the inputs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from planner.cli import main

WIDTHS = (80, 160)
CSV = Path(__file__).resolve().parents[1] / "planner" / "data" / "profiles" / "calibration.csv"
PLAN = ["plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "256", "--precision", "mxfp8",
        "--seq-len", "4096", "--gbs", "4096"]


def run(capsys, monkeypatch, width, *argv):
    monkeypatch.setenv("COLUMNS", str(width))
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def check_lines(out: str, width: int) -> None:
    assert "…" not in out, next(line for line in out.splitlines() if "…" in line)
    too_long = [line for line in out.splitlines() if len(line.rstrip()) > width]
    assert not too_long, too_long[:3]


def render(renderable, width: int) -> str:
    con = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(renderable)
    return con.export_text()


def tokens_in(text: str, out: str) -> bool:
    """Every word of ``text`` appears whole in ``out`` (a cell may wrap between words)."""
    return all(re.search(r"(?<!\S)" + re.escape(t) + r"(?!\S)", out) for t in text.split())


# ------------------------------------------------------------------------------------------- --help

def _command_paths():
    import typer

    from planner.cli import _register, app

    _register()
    paths = [([], typer.main.get_command(app))]
    k = 0
    while k < len(paths):
        pre, cmd = paths[k]
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            paths.append((pre + [name], sub))
        k += 1
    return paths


@pytest.mark.parametrize("width", WIDTHS)
def test_help_of_every_command_shows_every_option_name_whole(capsys, monkeypatch, width):
    paths = _command_paths()
    assert len(paths) > 15   # the root, each command, each group's commands
    for path, cmd in paths:
        rc, out, _ = run(capsys, monkeypatch, width, *path, "--help")
        assert rc == 0, path
        check_lines(out, width)
        for param in cmd.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("-"):
                    assert re.search(re.escape(opt) + r"(?![\w-])", out), (path, opt)


# ------------------------------------------------------------------------------------------- plan

def _memo(monkeypatch, owner, name: str, key) -> None:
    """``owner.name`` replaced for this test by a memo of it keyed by ``key(*args, **kwargs)`` (the
    store lives for the process). The views below print the same request at two widths and as JSON:
    the work behind them (a plan, a fit) is deterministic and runs once; these tests check the views."""
    real = getattr(owner, name)
    store = _STORES.setdefault((id(real), name), {})

    def memo(*args, **kwargs):
        k = key(*args, **kwargs)
        if k not in store:
            store[k] = real(*args, **kwargs)
        return store[k]

    monkeypatch.setattr(owner, name, memo)


_STORES: dict = {}


def _plan_key(model, job, training, **kw):
    return (model.name, job.cluster.name, job.cluster.num_gpus, job.gpus, job.per_domain,
            training.model_dump_json(), repr(sorted(kw.items())))


@pytest.fixture
def plan_once(monkeypatch):
    import planner.cli.plan as cli_plan

    _memo(monkeypatch, cli_plan, "plan", _plan_key)


@pytest.fixture(scope="module")
def plan_json():
    import contextlib
    import io

    import planner.cli.plan as cli_plan

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.MonkeyPatch.context() as mp:
        _memo(mp, cli_plan, "plan", _plan_key)
        assert main([*PLAN, "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_view_shows_every_figure_whole(capsys, monkeypatch, width, plan_json, plan_once):
    from planner.output.explain import domain_names_of, plan_labels

    rc, out, _ = run(capsys, monkeypatch, width, *PLAN)
    assert rc == 0
    check_lines(out, width)
    plans = plan_json["plans"]
    for entry, label in zip(plans, plan_labels(plans)):
        p = entry["prediction"]
        assert f"{p['tflops_per_gpu']:,.0f}" in out
        assert f"{p['tokens_per_s_per_gpu']:,.0f}" in out
        assert f"{p['tflops_per_gpu_low']:,.0f}-{p['tflops_per_gpu_high']:,.0f}" in out
        assert label in out   # whole, on one line, in the plan's title "#k <layout>"
    # racks by the cluster's own names, not numbered from 0
    assert domain_names_of(plan_json)[0] == "gb300-r01"
    assert "gb300-r" in out and "racks 0-" not in out
    # the solver summary once, plainly (no scientific notation)
    assert out.count("solver:") == 1 and "objective tokens_per_s" not in out
    assert not re.search(r"\d\.\d+e[+-]\d\d", out)
    assert f"{plan_json['solver']['objective']:,.0f}" in out


@pytest.mark.parametrize("width", WIDTHS)
def test_plans_table_keeps_long_layouts_and_figures_whole(width):
    from test_report import plan_doc

    from planner.output.explain import plans_table

    doc = plan_doc()
    doc["plans"][0]["config"]["recompute"] = "mla_up_proj+moe_act+core_attn"
    for e in doc["plans"]:
        e["prediction"]["tflops_per_gpu"] = 12345.6
    out = render(plans_table(doc, width=width), width)
    check_lines(out, width)
    assert out.count("12,346") == 3
    assert "RC:mla_up_proj+moe_act+core_attn" in out
    assert tokens_in("TP1 PP2 VPP8 EP32 MBS1", out)


# ------------------------------------------------------------------------------------------- scale

@pytest.mark.parametrize("width", WIDTHS)
def test_scale_table_figures_and_layouts_whole(width):
    from planner.cli.plan import scale_table

    rows = [{"gpus": n, "world": n, "layout": f"TP1 PP4 VPP4 EP64 DP{n // 4} MBS1 RC:mla_up_proj+moe_act",
             "tokens_per_s": 6012.5 * n, "tflops_per_gpu": 1570.4 - n / 100, "retention": 1 - n / 1e5,
             "status": "OPTIMAL", "wall_s": 12.34} for n in (256, 1024, 16384)]
    out = render(scale_table(rows, width), width)
    check_lines(out, width)
    for r in rows:
        assert f"{r['tokens_per_s']:,.0f}" in out and f"{r['tflops_per_gpu']:,.0f}" in out
        assert f"{100 * r['retention']:.1f}%" in out
        assert tokens_in(r["layout"], out)
    if width == 160:
        assert rows[0]["layout"] in out   # whole on one line when there is room


# ------------------------------------------------------------------------------------------- validate

@pytest.fixture(scope="module")
def validated():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["validate", str(CSV), "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.parametrize("width", WIDTHS)
def test_validate_shows_every_error_and_model_whole_and_names_the_worst_row(capsys, monkeypatch, width,
                                                                           validated):
    import csv

    rc, out, _ = run(capsys, monkeypatch, width, "validate", CSV)
    assert rc == 0
    check_lines(out, width)
    rows = list(csv.DictReader(CSV.open()))
    for r in rows:
        assert r["id"] in out
        assert re.search(r"(?<![\w.-])" + re.escape(r["model"]) + r"(?![\w.-])", out), r["model"]
    for r in validated["rows"]:
        assert f"{r['predicted_tflops_per_gpu']:,.0f}" in out
        if r["error_pct"] is not None:
            assert f"{r['error_pct']:+.1f}%" in out, r["id"]
    worst = max((r for r in validated["rows"] if r["error_pct"] is not None), key=lambda r: abs(r["error_pct"]))
    mape = " ".join(out[out.index("MAPE"):].split())
    assert f"worst row {worst['id']}" in mape and f"{worst['error_pct']:+.1f}%" in mape


# ------------------------------------------------------------------------------------------- predict

@pytest.mark.parametrize("width", WIDTHS)
def test_predict_names_terms_in_prose_as_the_bar_does(capsys, monkeypatch, width):
    from planner.output.explain import MEMORY_LABELS, TERM_LABELS

    argv = ["predict", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--gpus", "256", "--precision",
            "mxfp8", "--gbs", "4096", "--pp", "2", "--vpp", "8", "--ep", "32"]
    rc, out, _ = run(capsys, monkeypatch, width, *argv)
    assert rc == 0
    check_lines(out, width)
    rc, js, _ = run(capsys, monkeypatch, width, *argv, "--json")
    d = json.loads(js)
    pred = d.get("prediction", d)
    assert f"{pred['tflops_per_gpu']:,.0f}" in out
    for key in pred["breakdown"]:
        assert TERM_LABELS[key] in out
        if "_" in key:
            assert key not in out   # the JSON keys stay in --json
    for key in (pred.get("memory") or {}):
        assert MEMORY_LABELS[key] in out


# ------------------------------------------------------------------------------------------- catalogs

@pytest.mark.parametrize("width", WIDTHS)
def test_models_and_topology_views(capsys, monkeypatch, width):
    from planner.model.spec import catalog
    from topologies.presets import PRESETS

    rc, out, _ = run(capsys, monkeypatch, width, "models", "list")
    assert rc == 0 and "…" not in out
    for name in catalog():
        assert re.search(r"(?m)^" + re.escape(name) + r"\s", out), name
    rc, out, _ = run(capsys, monkeypatch, width, "models", "show", "deepseek-v3")
    assert rc == 0 and "…" not in out and "259.99" in out
    rc, out, _ = run(capsys, monkeypatch, width, "topology", "list")
    assert rc == 0
    check_lines(out, width)
    for name in PRESETS:
        assert name in out
    assert "DeepSeek-style" in out
    rc, out, _ = run(capsys, monkeypatch, width, "topology", "show", "gb300-nvl72", "--gpus", "288")
    assert rc == 0
    check_lines(out, width)
    assert "oversubscription" in out and "4608 GPUs" in out


@pytest.mark.parametrize("width", WIDTHS)
def test_trial_table_keeps_names_and_figures(width):
    from planner.cli.trial import trial_table

    doc = {"trials": [
        {"id": "trial-01-TP1-PP2-VPP8-EP32-MBS1-RC-mla_up_proj", "label": "TP1 PP2 VPP8 EP32 MBS1 RC:mla_up_proj",
         "compare": False, "predicted_tflops_per_gpu": 1561.24, "measured_tflops_per_gpu": 1419.31,
         "error_pct": 10.0, "iters_used": 15, "refitted_tflops_per_gpu": 1422.0, "refitted_error_pct": 0.19},
        {"id": "trial-02-TP1-PP4", "label": "TP1 PP4 EP8 MBS1", "compare": True, "predicted_tflops_per_gpu": 999.0}]}
    out = render(trial_table(doc, width), width)
    check_lines(out, width)
    for fig in ("1,561.2", "1,419.3", "+10.0%", "1,422.0", "+0.2%", "999.0", "no log"):
        assert fig in out
    assert ("trial-01-TP1-PP2-VPP8-EP32-MBS1-RC-mla_up_proj" if width == 160 else "trial-01") in out
    assert tokens_in("TP1 PP2 VPP8 EP32 MBS1 RC:mla_up_proj (compare)", out)


_CALIBRATED: dict = {}


@pytest.fixture
def fit_once(monkeypatch):
    """The fit (~2 CPU s) once per process; tests/test_calibrate.py checks the fit itself."""
    import planner.calibration.calibrate as cal

    _memo(monkeypatch, cal, "calibrate_rows", lambda rows, stack, **kw: (
        stack, repr(rows), repr(sorted((k, v) for k, v in kw.items() if k != "progress"))))


@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_names_its_worst_row_and_every_fitted_value(capsys, monkeypatch, width, tmp_path, fit_once):
    argv = ["calibrate", CSV, "--stack", "megatron-26.04", "-o", tmp_path / "fit.yaml"]
    rc, out, _ = run(capsys, monkeypatch, width, *argv)
    assert rc == 0 and "…" not in out
    if "json" not in _CALIBRATED:     # the fit is deterministic: its JSON once per process (a fit is ~2 CPU s)
        rc, js, _ = run(capsys, monkeypatch, width, *argv[:-1], tmp_path / "fit2.yaml", "--json")
        assert rc == 0
        _CALIBRATED["json"] = js
    d = json.loads(_CALIBRATED["json"])
    first = out.splitlines()[0]
    assert f"MAPE {d['mape_pct']:.2f}%" in first and "worst row mb" in first
    assert f"{d['max_abs_error_pct']:.1f}%" in first
    for name, value in d["params"].items():
        assert re.search(re.escape(name) + r"\s+" + re.escape(f"{value:.4g}"), out), name
