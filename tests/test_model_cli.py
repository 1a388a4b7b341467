"""`topoplan models list|show` through the real CLI entry point (planner.cli.main)."""

from __future__ import annotations

import json

from planner.cli import main
from planner.model.spec import catalog, catalog_entry


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_names_every_model(capsys):
    rc, out, _ = run(capsys, "models", "list")
    assert rc == 0
    for name in catalog():
        assert name in out
    rc, out, _ = run(capsys, "models", "list", "--json")
    rows = json.loads(out)
    assert [r["name"] for r in rows] == catalog()


def test_show_json_gives_params_and_flops(capsys):
    rc, out, _ = run(capsys, "models", "show", "deepseek-v3", "--json")
    assert rc == 0
    d = json.loads(out)  # pure JSON on stdout
    assert d["params_total"] == catalog_entry("deepseek-v3")["params_total_computed"]
    assert d["params_active"] == catalog_entry("deepseek-v3")["params_active_computed"]
    assert abs(d["gflop_per_token"] - 260.0) < 0.05 and d["seq_len"] == 4096
    assert d["spec"]["attention"] == "mla"


def test_show_text_and_config_file(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(catalog_entry("mixtral-8x7b")))
    rc, out, _ = run(capsys, "models", "show", str(p))
    assert rc == 0 and "46.70B total" in out and "12.88B with embeddings" in out and "79.71" in out


def test_show_refuses_with_one_line(capsys, tmp_path):
    rc, out, err = run(capsys, "models", "show", "not-a-model")
    assert rc == 2 and out == "" and err.startswith("error: unknown model") and err.count("\n") == 1
    p = tmp_path / "config.json"
    cfg = catalog_entry("qwen3-30b-a3b")
    cfg["num_experts_per_tok"] = 500
    p.write_text(json.dumps(cfg))
    rc, out, err = run(capsys, "models", "show", str(p))
    assert rc == 2 and "num_experts_per_tok" in err and str(p) in err
