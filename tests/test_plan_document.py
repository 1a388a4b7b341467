"""The plan document (plan.json) is one typed value: what the planner writes validates against the
shipped JSON Schema, reads back into ``PlanDocument`` and writes out again unchanged; ``emit`` reads
the same models; bad documents are refused with one line naming the field."""

from __future__ import annotations

import json
import typing

import pytest

import planner
from planner.config import TRAINERS, Training
from planner.errors import InputError
from planner.search import document as D
from topologies.loader import load_cluster


@pytest.fixture(scope="module")
def real_docs() -> list[dict]:
    """plan.json documents as the planner writes them: an MoE plan on HGX (Megatron), a dense plan
    for TorchTitan, and one where the solver chose the global batch."""
    out = []
    moe = planner.load_model("qwen3-30b-a3b")
    h100 = load_cluster("dgx-h100", gpus=16)
    out.append(planner.plan(moe, h100, Training(seq_len=4096, global_batch=64), top=3).to_dict())
    dense = planner.load_model("llama3-8b")
    out.append(planner.plan(dense, load_cluster("dgx-h100", gpus=8),
                            Training(seq_len=4096, global_batch=32, trainer="torchtitan", stack="torchtitan"),
                            top=2, trainer="torchtitan").to_dict())
    out.append(planner.plan(moe, h100, Training(seq_len=4096, global_batch=64), top=2,
                            gbs_range=(32, 128), objective="tflops-per-gpu").to_dict())
    return [json.loads(json.dumps(d)) for d in out]  # as read back from a file


def _validate_with_schema(doc: dict, schema: dict) -> None:
    try:
        import jsonschema
    except ImportError:  # the schema is generated from the model: pydantic validates the same contract
        D.PlanDocument.model_validate(doc)
        return
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_shipped_schema_is_the_generated_one():
    assert D.SCHEMA_FILE.read_text() == D.schema_text(), \
        f"planner/data/plan.schema.json is stale; regenerate it: {D.REGENERATE}"


def test_cli_prints_the_schema(capsys):
    from planner.cli import main

    assert main(["schema", "plan"]) == 0
    out = capsys.readouterr().out
    assert out == D.schema_text()
    schema = json.loads(out)
    props = schema["properties"]
    assert set(props) == {"version", "model", "cluster", "training", "plans", "solver", "header", "compare"}
    solver = schema["$defs"]["SolverPart"]["properties"]
    assert solver["method"]["enum"] == ["enumerate", "cp-sat", "exhaustive", "cp-sat-full"]


def test_literals_are_the_planners_vocabulary():
    from planner.cost.steptime import TERMS
    from planner.search.plan import METHODS

    # Term is Literal[TERMS] (planner.cost.prediction): the shipped schema must name the same terms
    shipped = json.loads(D.SCHEMA_FILE.read_text())["$defs"]["Prediction"]["properties"]["breakdown"]
    assert tuple(shipped["propertyNames"]["enum"]) == TERMS
    assert typing.get_args(D.Method) == METHODS
    assert typing.get_args(D.Trainer) == TRAINERS


def test_real_plans_round_trip_unchanged(real_docs):
    """plan -> JSON -> PlanDocument -> JSON is the identity, and the typed values are the planner's."""
    for doc in real_docs:
        model = D.PlanDocument.model_validate(doc)
        assert json.loads(json.dumps(model.dump())) == doc
        for entry, typed in zip(doc["plans"], model.plans):
            cfg = typed.config
            assert cfg.world == len(entry["placement"]["rank_to_gpu"])
            assert cfg.tp * cfg.cp * cfg.pp * cfg.dp == cfg.world
            assert cfg.parallel_config().edp_for(cfg.world) == cfg.edp
            assert sum(typed.prediction.breakdown.values()) == pytest.approx(typed.prediction.step_time_s)
    assert {d["training"]["trainer"] for d in real_docs} == {"megatron", "torchtitan"}
    assert {d["solver"]["objective_name"] for d in real_docs} == {"tokens_per_s", "tflops_per_gpu"}


def test_every_plan_json_the_planner_writes_validates(tmp_path, real_docs):
    """--save-plan, --out (emit's copy) and the API's to_dict() all validate against the shipped schema."""
    from planner.cli import main

    schema = json.loads(D.SCHEMA_FILE.read_text())
    for doc in real_docs:
        _validate_with_schema(doc, schema)
    saved, out = tmp_path / "plan.json", tmp_path / "launch"
    rc = main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "16", "--top", "2",
               "--save-plan", str(saved), "--emit", "megatron", "--out", str(out), "--json"])
    assert rc == 0
    for path in (saved, out / "plan.json"):
        _validate_with_schema(json.loads(path.read_text()), schema)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["plans"][0]["config"].update(tp=0), "plans.0.config.tp"),
    (lambda d: d["plans"][0]["prediction"]["breakdown"].update(pipeline_bubble=0.1), "plans.0.prediction.breakdown"),
    (lambda d: d["training"].update(trainer="nemo"), "training.trainer"),
    (lambda d: d["solver"].update(method="simplex"), "solver.method"),
    (lambda d: d["plans"][0]["placement"].update(color="red"), "plans.0.placement.color"),
    (lambda d: d.pop("cluster"), "cluster"),
])
def test_bad_documents_are_refused_naming_the_field(real_docs, edit, field):
    doc = json.loads(json.dumps(real_docs[0]))
    edit(doc)
    with pytest.raises(InputError) as exc:
        D.load_document(doc)
    msg = str(exc.value)
    assert f"field '{field}" in msg and "--save-plan" in msg and "\n" not in msg


def test_emit_reads_the_same_models(tmp_path, real_docs):
    """emit reads the document through the shared models: a bad field is refused before anything is
    written, naming the field."""
    from planner.output.emit import emit_plan, load_context

    doc = real_docs[0]
    ctx = load_context(doc, 1)
    assert ctx.config.short() == doc["plans"][1]["label"]
    assert ctx.world == doc["plans"][1]["config"]["world"]
    assert (ctx.dp, ctx.edp) == (doc["plans"][1]["config"]["dp"], doc["plans"][1]["config"]["edp"])
    bad = json.loads(json.dumps(doc))
    bad["training"]["seq_len"] = -1
    with pytest.raises(InputError, match="field 'training.seq_len'"):
        emit_plan(bad, ["megatron"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_plan_result_gives_the_typed_document():
    res = planner.plan(planner.load_model("llama3-8b"), load_cluster("dgx-h100", gpus=8),
                       Training(seq_len=4096, global_batch=16), top=1)
    doc = res.document()
    assert isinstance(doc, D.PlanDocument)
    assert doc.plans[0].config.parallel_config() == res.plans[0].config.model_copy(update={"etp": res.plans[0].config.etp_eff})
    assert doc.dump() == json.loads(json.dumps(res.to_dict()))


@pytest.mark.slow
@pytest.mark.parametrize("script", ["launcher_api.py", "llama405b_h100_torchtitan.py", "slurm_topology_plan.py"])
def test_the_examples_plan_json_validates(tmp_path, script):
    """The examples write plan.json through emit: those documents validate against the shipped schema."""
    import os
    import subprocess
    import sys

    root = D.SCHEMA_FILE.parents[2]
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(root / "examples" / script), "--out", str(out)], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path, env={**os.environ, "TOPOPLAN_NO_PROGRESS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    found = list(out.rglob("plan.json"))
    assert found
    schema = json.loads(D.SCHEMA_FILE.read_text())
    for path in found:
        _validate_with_schema(json.loads(path.read_text()), schema)
