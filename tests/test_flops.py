"""FLOPs per token against Megatron-Bridge's published throughput tables, the reference's per-term
breakdown, hand arithmetic and brute force; parameter counts against models.json.

The oracle is tests/data/reference/flops_per_token.md: implied GFLOP/token = model TFLOP/s/GPU /
tokens/s/GPU of the runs in Megatron-Bridge's docs/performance-summary.md and
docs/performance-summary-archive.md; the per-term breakdown re-implements Megatron-Bridge's
src/megatron/bridge/training/utils/flop_utils.py num_floating_point_operations (commit 067f987).

Run as a script to print the table: ``python tests/test_flops.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.model.flops import causal_context, flops_per_token, flops_terms, layer_costs, logits_flops, param_counts
from planner.model.spec import catalog, catalog_entry, load_model

FLOPS_MD = Path(__file__).resolve().parents[1] / "tests" / "data" / "reference" / "flops_per_token.md"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def published_rows() -> list[dict]:
    """The Results table of flops_per_token.md: rows with an implied GFLOP/token."""
    rows = []
    lines = FLOPS_MD.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| model | seq_len"))
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        model, seq, mtp, row, implied, _computed, _diff = _cells(ln)
        m = re.match(r"([\d.]+)", implied)
        if not m:
            continue
        rows.append(
            {
                "model": model,
                "seq_len": int(seq),
                "mtp": None if mtp in ("–", "-") else int(mtp),
                "tp": int(re.search(r"TP(\d+)", row).group(1)),
                "formula": "legacy" if "old formula" in row else "current",
                "implied": float(m.group(1)),
                "row": row,
            }
        )
    return rows


def breakdown_rows() -> list[dict]:
    lines = FLOPS_MD.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| model (seq) | MLP"))
    out = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        label, mlp, attn, mtp, logits, vpad = _cells(ln)
        name = label.split(" (")[0]
        inside = label[label.index("(") + 1 : label.rindex(")")]
        tpm = re.search(r"\bTP(\d+)", inside)
        tp = int(tpm.group(1)) if tpm else 1
        mtp_layers = 0 if "no MTP" in inside else None
        out.append(
            {
                "model": name,
                "seq_len": int(inside.split(",")[0]),
                "tp": tp,
                "mtp": mtp_layers,
                "mlp": float(mlp),
                "attention": float(attn),
                "mtp_term": float(mtp),
                "logits": float(logits),
                "padded_vocab": int(vpad),
            }
        )
    return out


def _model(name: str, mtp: int | None):
    m = load_model(name)
    if mtp is not None and mtp != m.mtp_layers:
        m = m.model_copy(update={"mtp_layers": mtp})
    return m


def test_reference_table_has_all_rows():
    rows = published_rows()
    # 13 rows carry an implied figure; a parser that finds none would make the next test vacuous.
    assert len(rows) == 13
    assert {r["model"] for r in rows} == {
        "llama3-8b", "llama3-70b", "llama3.1-405b", "deepseek-v3", "kimi-k2",
        "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b",
    }


@pytest.mark.parametrize("row", published_rows(), ids=lambda r: f"{r['model']}-{r['row'][:20]}")
def test_flops_match_published_within_half_percent(row):
    m = _model(row["model"], row["mtp"])
    got = flops_per_token(m, row["seq_len"], tp=row["tp"], formula=row["formula"]) / 1e9
    assert abs(got / row["implied"] - 1) < 0.005, (row, got)


@pytest.mark.parametrize("row", breakdown_rows(), ids=lambda r: f"{r['model']}-{r['seq_len']}-{r['mtp']}")
def test_per_term_breakdown(row):
    m = _model(row["model"], row["mtp"])
    t = flops_terms(m, row["seq_len"], tp=row["tp"])
    assert t["padded_vocab"] == row["padded_vocab"]
    for key, ref in (("mlp", row["mlp"]), ("attention", row["attention"]), ("mtp", row["mtp_term"]), ("logits", row["logits"])):
        assert t[key] == pytest.approx(ref, abs=0.006), key  # the table rounds to 2 decimals (MTP: 3)
    assert t["total"] == pytest.approx(t["mlp"] + t["attention"] + t["mtp"] + t["logits"])


def test_llama3_8b_worked_example_by_hand():
    # flops_per_token.md "A worked check", s = 8192, TP1, all in multiply-adds per token:
    mlp = 4096 * 3 * 14336 * 32                                  # 5.637e9
    proj = 4096 * (4096 + 2 * 1024) + 4096 * 4096                # 41.94e6
    core = 4096 * 8192                                           # n_h*d*s = 33.55e6
    attn = 32 * (proj + core)                                    # 2.416e9
    logits = 4096 * 128256                                       # 0.525e9
    expected = 6 * (mlp + attn + logits)                         # 51.47e9
    assert flops_per_token(load_model("llama3-8b"), 8192) == pytest.approx(expected, rel=1e-12)
    assert expected / 1e9 == pytest.approx(51.47, abs=0.005)


def test_deepseek_v3_mlp_and_mtp_terms_by_hand():
    # 3 dense layers (F=18432), 58 MoE layers + 1 MTP layer (MoE, since layer 60 is MoE),
    # each MoE layer: 8 routed + 1 shared expert of 2048, all gated (k=3).
    h = 7168
    mlp = h * (3 * 18432 * 3 + 3 * 2048 * 8 * 59 + 3 * 2048 * 59)
    mtp = 1 * (3 * h + 2 * h * h)
    t = flops_terms(load_model("deepseek-v3"), 4096)
    assert t["mlp"] == pytest.approx(6 * mlp / 1e9, rel=1e-12)
    assert t["mtp"] == pytest.approx(6 * mtp / 1e9, rel=1e-12)
    assert t["logits"] == pytest.approx(6 * h * 129280 * 2 / 1e9, rel=1e-12)


def test_legacy_formula_only_changes_non_silu_glu_and_swa():
    for name in catalog():
        m = load_model(name)
        cur, old = flops_per_token(m, 4096), flops_per_token(m, 4096, formula="legacy")
        if m.family == "gpt_oss" or (m.gated_mlp and m.activation != "silu"):   # GPT-OSS, Grok-1's GeGLU
            assert old < cur
        else:
            assert old == pytest.approx(cur, rel=1e-12), name
    # GPT-OSS-120B under the old formula: 27.16 GFLOP/token (k=2, every layer full causal)
    assert flops_per_token(load_model("gpt-oss-120b"), 4096, formula="legacy") / 1e9 == pytest.approx(27.16, abs=0.01)
    with pytest.raises(ValueError):
        flops_per_token(load_model("llama3-8b"), 4096, formula="nope")


@settings(max_examples=40, deadline=None)
@given(s=st.integers(1, 600), w=st.integers(1, 700))
def test_sliding_window_context_is_the_exact_average(s, w):
    # Brute force: query q (0-based) sees min(q+1, W) keys under window_size (W-1, 0).
    brute = sum(min(q + 1, w) for q in range(s)) / s
    if w < s:
        assert causal_context(s, w) == pytest.approx(brute, rel=1e-12)
    else:
        assert causal_context(s, w) == s / 2  # Megatron costs W >= s as a full causal layer


def test_vocab_padding_matches_models_json():
    checked = 0
    for name in catalog():
        for key, padded in catalog_entry(name)["megatron_padded_vocab_size"].items():
            assert load_model(name).padded_vocab(int(key[2:])) == padded, (name, key)
            checked += 1
    assert checked >= 25


@pytest.mark.parametrize("name", catalog())
def test_layer_costs_add_up_to_megatron_flops(name):
    m = load_model(name)
    for s in (1024, 4096, 8192):
        costs = layer_costs(m, s)
        assert len(costs) == m.num_layers + m.mtp_layers
        fwd = sum(c.flops for c in costs) + logits_flops(m) * (1 + m.mtp_layers)
        assert 3 * fwd == pytest.approx(flops_per_token(m, s), rel=1e-12)
        # the router is priced separately and is absent from Megatron's formula
        assert all((c.router > 0) == c.is_moe for c in costs)


def test_layer_costs_fields_deepseek():
    m = load_model("deepseek-v3")
    costs = layer_costs(m, 4096)
    dense, moe, mtp = costs[0], costs[3], costs[-1]
    assert (dense.is_moe, moe.is_moe, mtp.kind, mtp.is_moe) == (False, True, "mtp", True)
    assert dense.mlp_dense == 2 * 3 * 7168 * 18432 and dense.mlp_expert == 0
    assert moe.mlp_expert == 2 * 3 * 7168 * 2048 * 8 and moe.mlp_shared == 2 * 3 * 7168 * 2048
    assert moe.router == 2 * 7168 * 256 and moe.n_experts == 256 and moe.top_k == 8
    assert moe.expert_params == 3 * 7168 * 2048
    # MLA core: QK^T over 192 dims, AV over 128 dims, causal average s/2, times 2 FLOPs
    assert moe.attn_core == 2 * (2048 * 128 * 192 + 2048 * 128 * 128)
    assert mtp.mtp_proj == 2 * (3 * 7168 + 2 * 7168 * 7168)


def test_gpt_oss_sliding_layers_cost_less():
    m = load_model("gpt-oss-120b")
    costs = layer_costs(m, 4096)
    assert [c.swa for c in costs] == [i % 2 == 0 for i in range(36)]
    c_w = 128 - 128 * 127 / (2 * 4096)
    assert costs[0].attn_core == pytest.approx(2 * 2 * 64 * 64 * c_w)
    assert costs[1].attn_core == pytest.approx(2 * 64 * 64 * 4096)


# ----- parameter counts -----------------------------------------------------------------------


def test_llama3_8b_params_by_hand():
    h, f, v, L = 4096, 14336, 128256, 32
    per_layer = h * (4096 + 2 * 1024) + 4096 * h + 3 * h * f + 2 * h   # attn + MLP + 2 norms
    total = 2 * v * h + L * per_layer + h                               # untied embeddings + final norm
    assert total == 8030261248
    pc = param_counts(load_model("llama3-8b"))
    assert pc.total == total and pc.active == total and pc.experts == 0


@pytest.mark.parametrize("name", catalog())
def test_params_match_models_json(name):
    data = catalog_entry(name)  # planner/data/models.json or models_extra.json
    pc = param_counts(load_model(name))
    assert pc.total == data["params_total_computed"]
    if "params_active_computed" in data:
        assert pc.active == data["params_active_computed"]
    if "params_mtp_layer_computed" in data:
        assert pc.mtp == data["params_mtp_layer_computed"]
    assert pc.dense + pc.experts == pc.total


@pytest.mark.parametrize("name", catalog())
def test_every_catalog_model_names_its_primary_source(name):
    # provenance: the file the numbers were checked against, as owner/repo:path
    source = catalog_entry(name).get("source", "")
    assert re.match(r"[\w.-]+/[\w.-]+:\S+", source), f"{name}: source {source!r} is not owner/repo:path"


def flop_table() -> list[tuple[str, float, float, float]]:
    out = []
    for r in published_rows():
        m = _model(r["model"], r["mtp"])
        got = flops_per_token(m, r["seq_len"], tp=r["tp"], formula=r["formula"]) / 1e9
        label = f"{r['model']} s={r['seq_len']} TP{r['tp']}" + (" MTP0" if r["mtp"] == 0 and load_model(r["model"]).mtp_layers else "") + (
            " legacy" if r["formula"] == "legacy" else ""
        )
        out.append((label, r["implied"], got, 100 * (got / r["implied"] - 1)))
    return out


if __name__ == "__main__":  # print the FLOP table
    print(f"{'model':44s} {'implied':>9s} {'computed':>9s} {'diff':>7s}")
    for label, imp, got, d in flop_table():
        print(f"{label:44s} {imp:9.2f} {got:9.2f} {d:+6.2f}%")
