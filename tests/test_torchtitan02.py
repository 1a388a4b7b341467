"""TorchTitan 0.2 for a user's config.json (issue 23): job.toml's ``[experimental] custom_import`` names a
module that adds the config's model as a flavour. torchtitan 0.2.0's own code (its wheel, unpacked by
tests/trainers/mcore.py) parses the job file, imports the module, builds the model on the meta device:
the parameters are those topoplan counts, the widths, norm epsilons and RoPE frequencies are the
config's (RoPE by transformers' formulas, re-stated here). What 0.2 cannot build gets no job.toml and a
line in command.txt naming the field."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.config import ParallelConfig, Training
from planner.model.flops import param_counts
from planner.model.spec import catalog_entry, load_model
from planner.output.emit import emit_plan
from trainers.mcore import ensure_torchtitan02
from trainers.plans import hgx_cluster, plan_doc

CONFIGS = Path(__file__).parent / "data" / "configs"
HARNESS = Path(__file__).resolve().parent / "trainers" / "torchtitan02_check.py"


def _config(tmp: Path, tag: str, base: str, **edit) -> Path:
    """A catalog model's config.json as a user brings it (renamed, optionally edited)."""
    cfg = {k: v for k, v in catalog_entry(base).items() if k != "source"}
    cfg.update(edit, _name_or_path=f"acme/{tag}")
    p = tmp / tag / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(cfg))
    return p


def _emit(path, out: Path, cfg: ParallelConfig = ParallelConfig(tp=1, pp=1, ep=8, etp=1, mbs=1)) -> Path:
    m = load_model(path)
    if not m.num_experts and cfg.ep > 1:
        cfg = ParallelConfig(tp=2, pp=1, mbs=1)
    doc = plan_doc(str(path), hgx_cluster("h100", 1), cfg,
                   Training(seq_len=4096, global_batch=64, precision="bf16", trainer="torchtitan"))
    emit_plan(doc, ["torchtitan"], out)
    return out / "torchtitan"


def hf_inv_freq(m) -> list[float]:
    """transformers' RoPE inverse frequencies (modeling_rope_utils: default, and _compute_llama3_parameters)."""
    d = m.head_dim
    inv = [1.0 / m.rope_theta ** (i / d) for i in range(0, d, 2)]
    rs = m.rope_scaling
    if rs is None:
        return inv
    f, lo, hi, old = rs.factor, rs.low_freq_factor or 1.0, rs.high_freq_factor or 4.0, rs.original_max_position_embeddings or 8192
    out = []
    for x in inv:
        wavelen = 2 * math.pi / x
        y = x / f if wavelen > old / lo else x
        if not wavelen < old / hi and not wavelen > old / lo:
            s = (old / wavelen - lo) / (hi - lo)
            y = (1 - s) * y / f + s * y
        out.append(y)
    return out


@pytest.fixture(scope="module")
def titan02():
    return ensure_torchtitan02()


def _check(titan02: Path, dirs: dict[str, Path], tmp: Path) -> dict:
    jobs = tmp / "jobs.json"
    res = tmp / "results.json"
    jobs.write_text(json.dumps([{"id": k, "dir": str(v)} for k, v in dirs.items()]))
    env = dict(os.environ, PYTHONPATH=str(titan02) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, str(HARNESS), str(jobs), str(res)], capture_output=True, text=True,
                       env=env, timeout=900)
    assert p.returncode == 0 and res.exists(), p.stderr[-3000:]
    return {r["id"]: r for r in json.loads(res.read_text())}


@pytest.mark.trainers
def test_torchtitan_02_builds_a_user_config_from_job_toml(titan02, tmp_path):
    paths = {
        "llama": _config(tmp_path, "acme-llama", "llama3-8b", rope_theta=1_000_000.0, rms_norm_eps=1e-6),
        "llama31": CONFIGS / "llama-3.1-8b-v5" / "config.json",
        "qwen3": CONFIGS / "qwen3-8b-v5" / "config.json",
        "qwen3_moe": _config(tmp_path, "acme-qwen3-moe", "qwen3-30b-a3b", num_hidden_layers=12, num_experts=64),
        "deepseek_v3": _config(tmp_path, "acme-dsv3", "deepseek-v3", num_hidden_layers=6, first_k_dense_replace=1,
                               n_routed_experts=64, n_group=1, topk_group=1),
    }
    dirs = {tag: _emit(p, tmp_path / f"out-{tag}") for tag, p in paths.items()}
    results = _check(titan02, dirs, tmp_path)
    for tag, path in paths.items():
        m, r = load_model(path), results[tag]
        assert r["ok"], f"torchtitan 0.2.0 refused {tag} at {r['stage']}: {r['error']}\n{r.get('trace', '')}"
        assert r["torchtitan"].startswith(str(titan02))     # 0.2.0, not the installed 0.3.0
        assert r["model"][1] == "topoplan" and r["seq_len"] == 4096
        assert r["params"] == param_counts(m).total, (tag, r["params"], param_counts(m).total)
        assert r["eps"] == [m.norm_eps]
        w = r["widths"]
        assert (w["layers"], w["dim"], w["vocab"]) == (m.num_layers, m.hidden_size, m.vocab_size)
        if not all(m.moe_layers):
            assert w["ffn"] == m.ffn_hidden_size
        if m.num_experts:
            assert (w["experts"], w["expert_ffn"], w["top_k"], w["shared_ffn"]) == \
                (m.num_experts, m.moe_ffn_hidden_size, m.top_k, m.shared_ffn_hidden_size)
        if r["inv_freq"] is not None:
            assert r["inv_freq"] == pytest.approx(hf_inv_freq(m), rel=2e-5)


@pytest.mark.trainers
def test_the_flavour_module_is_what_makes_the_flavour(titan02, tmp_path):
    """Mutant: without the custom_import module torchtitan 0.2.0 has no flavour 'topoplan'."""
    d = _emit(CONFIGS / "qwen3-8b-v5" / "config.json", tmp_path / "out")
    (d / "topoplan_flavour_v02.py").write_text("")
    r = _check(titan02, {"q": d}, tmp_path)["q"]
    assert not r["ok"] and r["stage"] == "model_args" and "topoplan" in r["error"]


@pytest.mark.parametrize("tag, base, edit, field", [
    ("dsv3-groups", "deepseek-v3", {}, "n_group 8"),
    ("gptoss", "gpt-oss-20b", {"num_hidden_layers": 6}, "no gpt_oss model"),
    ("llama-tied", "llama3-8b", {"tie_word_embeddings": True}, "tie_word_embeddings"),
    ("qwen-yarn", "qwen3-30b-a3b", {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 32768}}, "rope_scaling yarn"),
])
def test_a_config_torchtitan_02_cannot_build_gets_no_job_toml_and_says_why(tag, base, edit, field, tmp_path):
    d = _emit(_config(tmp_path, tag, base, **edit), tmp_path / "out",
              ParallelConfig(tp=1, pp=1, ep=4 if base.startswith("gpt") else 8, etp=1, mbs=1))
    assert not (d / "job.toml").exists() and not (d / "topoplan_flavour_v02.py").exists()
    why = [x for x in (d / "command.txt").read_text().splitlines() if x.startswith("# No job.toml")]
    assert len(why) == 1 and "TorchTitan 0.2 cannot build" in why[0] and field in why[0]
    assert (d / "topoplan_config.py").exists()   # the 0.3 command line still builds it


# catalog models whose torchtitan 0.2.0 built-in flavour differs from their config.json (emit.BUILTIN_MODEL):
# Llama 3 8B / 70B have no RoPE scaling, Qwen3-235B-A22B's rope base is 1e6 (the flavours: Llama 3.1's, 5e6)
FIXED = ("llama3-8b", "llama3-70b", "qwen3-235b-a22b")


@pytest.mark.trainers
def test_torchtitan_02_parses_every_catalog_job_toml(titan02, tmp_path):
    """The catalog models' job.toml, with TP 2: 0.2.0 has no enable_sequence_parallel key (its parser
    refuses unknown keys), so none is written; a model whose built-in flavour differs from its config.json
    gets the flavour module (DeepSeek-V3's differs in eps, but 0.2.0 cannot route by groups: its built-in
    flavour, said in job.toml); GPT-OSS, which 0.2.0 has no model for, gets no job.toml."""
    from planner.trainers.torchtitan.emit import MODELS

    dirs = {}
    for name, (module, _, flavour) in MODELS.items():
        moe = bool(load_model(name).num_experts)
        d = _emit(name, tmp_path / f"out-{name}", ParallelConfig(tp=2, pp=1, ep=8 if moe else 1, etp=1, mbs=1))
        if module == "gpt_oss":
            assert not (d / "job.toml").exists()
            assert "# No job.toml: TorchTitan 0.2 cannot build" in (d / "command.txt").read_text()
            continue
        dirs[name] = d
    results = _check(titan02, dirs, tmp_path)
    for name, d in dirs.items():
        r, m = results[name], load_model(name)
        assert r["ok"], f"torchtitan 0.2.0 refused {name} at {r['stage']}: {r['error']}"
        assert r["widths"]["layers"] == m.num_layers
        if name in FIXED:   # the built-in flavour is not the config's: the flavour module builds the config
            assert r["model"] == [MODELS[name][0], "topoplan"] and r["params"] == param_counts(m).total
            assert r["eps"] == [m.norm_eps] and r["inv_freq"] == pytest.approx(hf_inv_freq(m), rel=2e-5)
        else:
            assert r["model"] == list(MODELS[name][::2])
