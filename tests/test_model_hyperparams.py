"""The config.json hyperparameters the ModelSpec carries to the trainers (issue 23 item 2) without the
trainers installed: rope base and scaling in both layouts (``rope_theta`` + ``rope_scaling``, transformers v5
``rope_parameters``), norm eps, the router (expert bias never with a softmax router), and the refusals
where a trainer cannot run what the config says. The trainers' own readings are in test_emit_fidelity.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.errors import InputError
from planner.model.spec import load_model, spec_from_config
from planner.output.emit import emit_plan
from planner.trainers.megatron.bridge import parse_overrides
from planner.trainers.megatron.emit import parse_args_file
from trainers.plans import hgx_cluster, plan_doc

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def _emit(model: str, trainer: str, tmp: Path, ep: int = 8) -> Path:
    m = load_model(model)
    stack = "megatron" if trainer == "bridge" else trainer   # Bridge launches Megatron's layout
    doc = plan_doc(model, hgx_cluster("h100", 1), ParallelConfig(tp=1, pp=1, ep=ep if m.num_experts else 1, mbs=1),
                   Training(seq_len=4096, global_batch=64, precision="bf16", trainer=stack), world=8)
    out = tmp / "out"
    emit_plan(doc, [trainer], out)
    return out


def _flags(out: Path) -> list[str]:
    return parse_args_file((out / "megatron" / "args.txt").read_text())


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_v5_rope_parameters_read_as_the_v4_file():
    """DeepSeek-V2-Lite as published (rope_theta + rope_scaling) and as transformers 5.7 saves it
    (rope_parameters holding both): the same RoPE, eps and router."""
    old, new = (spec_from_config(_cfg(n)) for n in ("deepseek-v2-lite", "deepseek-v2-lite-v5"))
    rs = _cfg("deepseek-v2-lite")["rope_scaling"]
    assert old.rope_theta == new.rope_theta == 10000
    assert old.rope_scaling == new.rope_scaling
    assert (new.rope_scaling.kind, new.rope_scaling.factor, new.rope_scaling.mscale, new.rope_scaling.mscale_all_dim) \
        == (rs["type"], rs["factor"], rs["mscale"], rs["mscale_all_dim"])
    assert old.norm_eps == new.norm_eps == 1e-6
    assert (new.router_score, new.expert_bias, new.norm_topk_prob) == ("softmax", False, False)


def test_v5_default_rope_type_is_plain_rope():
    m = spec_from_config(_cfg("qwen3-8b-v5"))
    assert m.rope_theta == 1_000_000 and m.rope_scaling is None


@pytest.mark.parametrize("edit, field", [
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                          "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}, "rope_parameters"),
    ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "dynamic", "factor": 2.0}}, "rope_parameters.rope_type"),
    ({"rope_parameters": None, "rope_scaling": {"type": "yarn"}}, "rope_scaling.factor"),
    ({"rms_norm_eps": -1}, "rms_norm_eps"),
    ({"rope_parameters": None, "rope_theta": "big"}, "rope_theta"),
])
def test_bad_rope_or_eps_names_the_field(edit, field):
    cfg = {**_cfg("qwen3-8b-v5"), **edit}
    with pytest.raises(InputError, match=f"field '{field}'"):
        spec_from_config(cfg, source="x/config.json")


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(["deepseek_v3", "kimi_k2", "deepseek_v2", "glm4_moe", "qwen3_moe"]),
       score=st.sampled_from([None, "softmax", "sigmoid"]), method=st.sampled_from([None, "noaux_tc", "greedy"]))
def test_expert_bias_only_with_noaux_tc_and_a_non_softmax_router(family, score, method):
    """megatron-core refuses expert bias with softmax (TransformerConfig): whatever the file says, a
    softmax router never gets it, and a sigmoid one gets it exactly when topk_method is noaux_tc (the
    family's transformers default when the file is silent)."""
    cfg = {**json.loads(json.dumps(_cfg("deepseek-v2-lite"))), "model_type": family}
    for k, v in (("scoring_func", score), ("topk_method", method)):
        cfg.pop(k, None)
        if v is not None:
            cfg[k] = v
    if family in ("glm4_moe", "qwen3_moe"):
        cfg.pop("kv_lora_rank")
    m = spec_from_config(cfg)
    default_sigmoid = family in ("deepseek_v3", "kimi_k2", "glm4_moe")
    want_score = score or ("sigmoid" if default_sigmoid else "softmax")
    want_method = method or ("noaux_tc" if default_sigmoid else "greedy")
    assert m.router_score == want_score
    assert m.expert_bias == (want_method == "noaux_tc" and want_score != "softmax")


def test_kimi_k25_megatron_args_route_as_the_config(tmp_path):
    """Kimi-K2.5 (a kimi_k2 text_config in a multimodal wrapper): sigmoid router with expert bias, its
    rope base and eps; its YaRN beta_fast of 1 (megatron-core's MLA default is 32; beta_slow 1 is the
    default), which pretrain_gpt.py cannot set for MLA, is named in env.sh and set by the Bridge overrides."""
    out = _emit(str(CONFIGS / "kimi-k2.5"), "megatron", tmp_path)
    a = _flags(out)
    text = _cfg("kimi-k2.5")["text_config"]
    assert _value(a, "--moe-router-score-function") == "sigmoid" and "--moe-router-enable-expert-bias" in a
    assert float(_value(a, "--rotary-base")) == text["rope_theta"]
    assert float(_value(a, "--norm-epsilon")) == text["rms_norm_eps"]
    assert float(_value(a, "--rotary-scaling-factor")) == text["rope_scaling"]["factor"]
    env = (out / "megatron" / "env.sh").read_text()
    assert "beta_fast=1.0" in env and "runs beta_fast=32.0" in env and "beta_slow" not in env
    b = _emit(str(CONFIGS / "kimi-k2.5"), "bridge", tmp_path / "b")
    o = parse_overrides((b / "bridge" / "overrides.txt").read_text())
    assert (o["model.beta_fast"], o["model.rotary_base"]) == ("1", "50000") and "model.beta_slow" not in o
    assert o["model.moe_router_score_function"] == "sigmoid" and o["model.moe_router_enable_expert_bias"] == "true"


def test_softmax_without_renormalisation_is_pre_softmax(tmp_path):
    """DeepSeek-V2-Lite: norm_topk_prob false with a softmax router is Megatron's softmax over all experts
    before the top-k (--moe-router-pre-softmax); Qwen3-Coder's true keeps the top-k softmax."""
    lite = _flags(_emit(str(CONFIGS / "deepseek-v2-lite"), "megatron", tmp_path / "l"))
    coder = _flags(_emit(str(CONFIGS / "qwen3-coder-480b-a35b-instruct"), "megatron", tmp_path / "c"))
    assert "--moe-router-pre-softmax" in lite and "--moe-router-pre-softmax" not in coder
    assert "--moe-router-enable-expert-bias" not in lite + coder


@pytest.mark.parametrize("edit, words", [
    ({"hidden_act": "gelu"}, "gated gelu MLP"),
    ({"rope_scaling": {"type": "linear", "factor": 2.5}}, "linear RoPE scaling by 2.5"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0}}, "low_freq_factor=2.0"),
])
def test_megatron_refuses_what_pretrain_gpt_cannot_run(tmp_path, edit, words):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**_cfg("qwen2.5-72b-instruct"), **edit}))
    with pytest.raises(InputError, match=f"--trainer megatron: .*{words}.*cannot run"):
        _emit(str(d), "megatron", tmp_path)
    assert not (tmp_path / "out").exists()


def test_readback_refuses_args_of_another_config(tmp_path):
    """predict --from args.txt with a model whose config.json says another rope base or eps: refused,
    naming the flag and the field (Qwen2.5-72B files read as a copy with Megatron's old default 10,000)."""
    from planner.trainers.megatron.readback import read_megatron

    out = _emit(str(CONFIGS / "qwen2.5-72b-instruct"), "megatron", tmp_path)
    config, _, _ = read_megatron(out, load_model(str(CONFIGS / "qwen2.5-72b-instruct")))
    assert config.tp == 1
    for edit, words in (({"rope_theta": 10000.0}, "--rotary-base is 1e\\+06 .* rope_theta 10000"),
                        ({"rms_norm_eps": 1e-5}, "--norm-epsilon is 1e-06 .* rms_norm_eps 1e-05")):
        d = tmp_path / f"other-{len(words)}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**_cfg("qwen2.5-72b-instruct"), **edit}))
        with pytest.raises(InputError, match=words):
            read_megatron(out, load_model(str(d)))


def test_older_plan_json_gets_its_config_hyperparameters(tmp_path):
    """A plan.json saved before the spec carried the hyperparameters (tests/trainers/data: no rope_theta)
    is emitted with its catalog model's (DeepSeek-V3: sigmoid router with expert bias, eps 1e-6, YaRN 40),
    not with the spec's defaults; one whose model cannot be read again is refused, naming the field."""
    from planner.model.spec import catalog_entry

    plan = Path(__file__).resolve().parent / "trainers" / "data" / "plan_deepseek-v3_256xgb300.json"
    doc = json.loads(plan.read_text())
    assert "rope_theta" not in doc["model"]["spec"]
    emit_plan(doc, ["megatron"], tmp_path / "old")
    a = _flags(tmp_path / "old")
    raw = catalog_entry("deepseek-v3")
    assert _value(a, "--moe-router-score-function") == raw["scoring_func"] == "sigmoid"
    assert "--moe-router-enable-expert-bias" in a
    assert float(_value(a, "--norm-epsilon")) == raw["rms_norm_eps"]
    assert float(_value(a, "--rotary-scaling-factor")) == raw["rope_scaling"]["factor"]
    doc["model"]["spec"] = {**doc["model"]["spec"], "name": "acme-moe", "source": str(tmp_path / "gone.json")}
    with pytest.raises(InputError, match="model.spec.rope_theta' is missing"):
        emit_plan(doc, ["megatron"], tmp_path / "gone")
    assert not (tmp_path / "gone").exists()


def test_gpt2_family_emits_learned_positions_biases_and_plain_gelu(tmp_path):
    """A GPT-2 config.json (transformers' GPT2Config names; GPT-3 175B in the catalog is the same family): Megatron
    gets a learned absolute position table (megatron-core's own default, --position-embedding-type learned_absolute),
    LayerNorm, no RoPE flags, biases kept (no --disable-bias-linear), plain GELU (no --swiglu) and tied embeddings."""
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
           "n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    path = tmp_path / "gpt2" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    args = _flags(_emit(str(path), "megatron", tmp_path))
    assert _value(args, "--position-embedding-type") == "learned_absolute"
    assert _value(args, "--normalization") == "LayerNorm"
    assert "--rotary-base" not in args and "--disable-bias-linear" not in args and "--swiglu" not in args
    assert "--untie-embeddings-and-output-weights" not in args
    assert _value(args, "--ffn-hidden-size") == str(4 * 768)
    # Bridge starts from a provider (AutoBridge) and must get the same: LayerNorm (GPTModelProvider's own default
    # is not what a Llama-like provider sets) and the learned position table
    from planner.trainers.megatron.bridge import parse_overrides
    o = parse_overrides((_emit(str(path), "bridge", tmp_path / "b") / "bridge" / "overrides.txt").read_text())
    assert o["model.normalization"].strip("'") == "LayerNorm"
    assert o["model.position_embedding_type"].strip("'") == "learned_absolute"
    llama = parse_overrides((_emit("llama3-8b", "bridge", tmp_path / "l") / "bridge" / "overrides.txt").read_text())
    assert llama["model.normalization"].strip("'") == "RMSNorm"
