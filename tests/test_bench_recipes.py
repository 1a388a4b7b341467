"""The regime columns of the published tables in bench/data agree with the settings their `recipe`
column quotes from the Megatron-Bridge source (issue 21: the never-fitted tables are the proxy for
hidden runs, so a column that drops a quoted setting prices a run that never ran).

Oracle: the recipe text, which quotes the preset as written in the source (`recompute_modules=[...]`,
`moe_flex_dispatcher_backend='...'`, `cuda_graph_scope=[...]`, `moe_a2a_overlap=True|False`, and a
closing "Recompute: none." where the text shows the quoted modules inert). A text may quote
several presets (the release's and the commit's that ran); the column must be one of the quoted values.
Only rows whose regime is traced (`cuda_graphs` filled) are checked."""
import csv
import re
from pathlib import Path

import pytest

TABLES = sorted((Path(__file__).resolve().parents[1] / "bench" / "data").glob("megatron-bridge-*.csv"))

_RC = re.compile(r"recompute_modules=\[([^\]]*)\]")
_RC_NONE = re.compile(r"Recompute: none\b")
_BACKEND = re.compile(r"moe_flex_dispatcher_backend=['\"](\w+)['\"]")
_SCOPE = re.compile(r"cuda_graph_scope=\[([^\]]*)\]")
_A2A = re.compile(r"moe_a2a_overlap=(True|False)")


def _modules(text: str) -> str:
    return "+".join(m.strip().strip("'\"") for m in text.split(",") if m.strip())


def quoted(recipe: str) -> dict[str, set[str]]:
    """The regime values a recipe text quotes, as the table's columns spell them."""
    return {
        "recompute": {_modules(m) for m in _RC.findall(recipe)} | ({"none"} if _RC_NONE.search(recipe) else set()),
        "dispatcher": {f"flex-{b}" for b in _BACKEND.findall(recipe)},
        "cuda_graph_scope": {_modules(m) for m in _SCOPE.findall(recipe)},
        "overlap_moe_expert_parallel_comm": {v.lower() for v in _A2A.findall(recipe)},
    }


def disagreements(row: dict) -> list[str]:
    """Columns whose value is not among the values the row's recipe text quotes."""
    q = quoted(row.get("recipe") or "")
    out = []
    for col, values in q.items():
        have = (row.get(col) or "").strip()
        if col == "cuda_graph_scope" and (row.get("cuda_graphs") or "").strip() != "true":
            continue   # a quoted scope is inert without graphs (cuda_graph_impl 'none')
        if values and have not in values:
            out.append(f"{col}={have!r} not in {sorted(values)}")
    return out


def _traced(path):
    with open(path, newline="") as fh:
        return [r for r in csv.DictReader(fh) if (r.get("cuda_graphs") or "").strip() and r.get("recipe")]


@pytest.mark.parametrize("table", TABLES, ids=[p.name for p in TABLES])
def test_traced_columns_match_the_quoted_recipe(table):
    bad = {r["id"]: d for r in _traced(table) if (d := disagreements(r))}
    assert not bad


def test_the_check_catches_a_dropped_setting():
    # b200-dsv3 of the 25.11 table as it was before: the text quotes the preset's recompute, the column was empty
    row = {"id": "x", "cuda_graphs": "false", "recompute": "", "dispatcher": "alltoall",
           "overlap_moe_expert_parallel_comm": "false",
           "recipe": "DEEPSEEK_V3_B200_FP8_MX_BASE_CONFIG: moe_a2a_overlap=False, recompute_modules=['mla_up_proj']"}
    assert disagreements(row) == ["recompute='' not in ['mla_up_proj']"]
    assert disagreements(dict(row, recompute="mla_up_proj")) == []
    # a flex backend the preset names but the column drops, and an overlap the column gets wrong
    row = {"cuda_graphs": "true", "cuda_graph_scope": "moe_router+moe_preprocess", "dispatcher": "alltoall",
           "overlap_moe_expert_parallel_comm": "false",
           "recipe": "moe_flex_dispatcher_backend='hybridep', cuda_graph_scope=['moe_router','moe_preprocess'], "
                     "moe_a2a_overlap=True"}
    assert len(disagreements(row)) == 2


def test_traced_hgx_moe_rows_are_covered():
    # the B200/B300 MoE rows of both tables are traced (issue 21 proxy): none left to the stack's default regime
    ids = {r["id"] for t in TABLES if t.name in ("megatron-bridge-26.02.csv", "megatron-bridge-25.11.csv")
           for r in _traced(t)}
    assert {"dsv3-b300", "dsv3-b200", "oss-b300", "oss-b200", "q30-b300", "q30-b200", "q235-b300", "q235-b200",
            "b200-dsv3", "b200-oss", "b200-q30", "b200-q235"} <= ids
