"""One prediction type (planner.cost.prediction.Prediction): predict returns it, plan.json holds its
document part, validate compares it with the measured run, and no second class describes a prediction.
Oracles: the formulas of its docstring by hand, predict called again on the plan's own layout, the
shipped JSON Schema, the source's class definitions."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

import planner
from planner.calibration.validate import compared, predict_case, read_rows, refusal, row_case
from planner.config import ParallelConfig, Training
from planner.cost.predict import predict
from planner.cost.prediction import PRICED, Prediction
from planner.cost.profiles import CALIBRATION_CSV, load_profile
from planner.model.flops import flops_per_token
from planner.search.document import SCHEMA_FILE, load_document
from topologies.loader import load_cluster
from source_ast import parse

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dense_plan():
    model = planner.load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", gpus=16)
    training = Training(seq_len=4096, global_batch=64)
    return model, cluster, training, planner.plan(model, cluster, training, top=2)


def test_the_figures_follow_from_the_step_time_by_hand():
    model = planner.load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100", gpus=16)
    training = Training(seq_len=4096, global_batch=128, precision="fp8")
    p = predict(model, cluster, ParallelConfig(tp=2, pp=1, ep=8, mbs=1), training)
    assert isinstance(p, Prediction) and p.world == 16 and p.violations == []
    tokens = 128 * 4096 / p.step_time_s
    fpt = flops_per_token(model, 4096, tp=2, formula=load_profile(training.stack).flops_formula)
    assert p.tokens_per_s == pytest.approx(tokens, rel=1e-12)
    assert p.tokens_per_s_per_gpu == pytest.approx(tokens / 16, rel=1e-12)
    assert p.tflops_per_gpu == pytest.approx(tokens / 16 * fpt / 1e12, rel=1e-12)
    h = p.band_half_width
    assert h > 0
    assert p.tflops_per_gpu_low == pytest.approx(p.tflops_per_gpu * math.exp(-h), rel=1e-12)
    assert p.tflops_per_gpu_high == pytest.approx(p.tflops_per_gpu * math.exp(h), rel=1e-12)
    assert p.fits == (p.memory_gib_per_gpu <= p.usable_gib)


def test_plan_json_holds_what_predict_returns_for_the_plans_layout(dense_plan):
    model, cluster, training, result = dense_plan
    doc = json.loads(json.dumps(result.to_dict()))      # as read back from a file
    for entry, written in zip(result.plans, doc["plans"]):
        again = predict(model, cluster, entry.config, training.model_copy(update={"global_batch": entry.gbs}),
                        placement=entry.placement)
        assert written["prediction"] == json.loads(json.dumps(again.document()))
    read = load_document(doc).plans[0].prediction
    assert isinstance(read, Prediction)
    assert read.document() == doc["plans"][0]["prediction"]
    assert read.config is None and read.placement is None and read.violations == []   # not in the document


def test_what_was_priced_stays_out_of_the_document_and_the_schema(dense_plan):
    p = dense_plan[3].plans[0].prediction
    schema = json.loads(SCHEMA_FILE.read_text())["$defs"]["Prediction"]
    assert set(p.document()) == set(schema["properties"])
    assert not set(PRICED) & set(p.document())
    assert schema["additionalProperties"] is False
    printed = p.to_dict()      # topoplan predict --json: the document part and what was priced
    assert set(printed) == set(p.document()) | set(PRICED) - {"details"} | {"dispatcher"}
    assert printed["config"]["tp"] == p.config.tp and printed["world"] == p.world
    with pytest.raises(Exception):
        p.tflops_per_gpu = 1.0   # frozen: a prediction is a value


def test_a_refused_layout_has_no_step_time_in_print():
    model = planner.load_model("llama3-8b")
    p = predict(model, load_cluster("dgx-h100", gpus=16), ParallelConfig(tp=3, pp=1, mbs=1),
                Training(seq_len=4096, global_batch=64))
    assert p.violations and p.step_time_s == float("inf") and not p.fits
    assert p.to_dict()["step_time_s"] is None


def test_a_validate_row_is_the_measured_run_beside_its_prediction():
    rows = read_rows(CALIBRATION_CSV)[:3]
    for row in rows:
        case = row_case(row)
        assert refusal(case) is None
        p = predict_case(case)
        out = compared(case, row, p)
        assert out["predicted_tflops_per_gpu"] == round(p.tflops_per_gpu, 1)
        assert out["predicted_tokens_per_s_per_gpu"] == round(p.tokens_per_s_per_gpu, 1)
        assert out["step_time_s"] == p.step_time_s and out["config"] == p.config.short()
        meas = float(row["model_tflops_per_gpu"])
        assert out["error_pct"] == round(100 * (p.tflops_per_gpu - meas) / meas, 2)
    refused = compared(case, row, None, "rule: message")
    assert refused["predicted_tflops_per_gpu"] is None and refused["refused"] == "rule: message"
    assert refused["breakdown"] == {} and refused["fits"] is None


# --- one type: no second class in the source describes a prediction -----------------------------------
SIGNATURE = {"tflops_per_gpu", "step_time_s", "memory_gib_per_gpu"}


def prediction_classes(source: str) -> list[str]:
    """Classes of ``source`` whose annotated fields hold a prediction's figures (SIGNATURE)."""
    out = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.ClassDef):
            fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            if SIGNATURE <= fields:
                out.append(node.name)
    return out


def test_one_class_describes_a_prediction():
    found = {}
    for pkg in ("planner", "solver", "topologies"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for name in prediction_classes(path.read_text()):
                found[f"{path.relative_to(ROOT)}:{name}"] = name
    assert list(found) == ["planner/cost/prediction.py:Prediction"]


@pytest.mark.parametrize("source", [
    # the document's copy the plan document had (PredictionPart)
    "class PredictionPart(_Strict):\n    tflops_per_gpu: float\n    step_time_s: float\n"
    "    memory_gib_per_gpu: float\n    fits: bool\n",
    # the dataclass predict returned
    "@dataclass\nclass Prediction:\n    tflops_per_gpu: float\n    tokens_per_s: float\n    step_time_s: float\n"
    "    memory_gib_per_gpu: float\n",
])
def test_a_second_prediction_class_is_found(source):
    """Mutants: the two classes this type replaced are each named."""
    assert prediction_classes(source)


def test_the_memory_warning_reads_the_prediction():
    """plan and predict warn, per plan, when the estimate fills more than 95% of HBM (76 of 80 GiB)."""
    from planner.cli.plan import memory_warnings

    base = predict(planner.load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8), ParallelConfig(tp=1, pp=1, mbs=1),
                   Training(seq_len=4096, global_batch=64))
    full, roomy = (base.model_copy(update={"memory_gib_per_gpu": g}) for g in (76.5, 75.5))
    lines = memory_warnings([("TP1 full", full), ("TP1 roomy", roomy), ("", full)], 80.0)
    assert len(lines) == 2 and lines[0].startswith("warning: TP1 full: 76.5 of 80 GiB HBM (95.6%)")
    assert lines[1].startswith("warning: 76.5 of 80 GiB")
