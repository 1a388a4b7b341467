"""The emitted model is the config (issue 23 item 2): every hyperparameter a config.json sets reaches the
trainer, read back by the trainer's own code.

For every catalog model and every config.json under tests/data/configs (published files, README.md there
cites them), the Megatron args go through megatron-core 0.19.2's ``parse_args`` + ``validate_args`` +
``core_transformer_config_from_args`` (tests/trainers/megatron_check.py), and the TorchTitan files of the
families it builds through torchtitan 0.3.0's ``ConfigManager`` and the model config it builds
(tests/trainers/torchtitan_check.py). The expected values are read here straight from the JSON file
(the oracle does not use planner.model.spec): rope base and scaling (``rope_theta`` / ``rope_scaling``
or the transformers v5 ``rope_parameters``), norm eps, router score function, expert bias, top-k
renormalisation and scale, qk-norm, tied embeddings, activation, vocabulary. A field the file does not
set is not checked. A mismatch fails.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from planner.config import ParallelConfig, Training
from planner.errors import InputError
from planner.model.spec import catalog, catalog_entry, load_model
from planner.output.emit import emit_plan
from planner.trainers.megatron.emit import mla_yarn_unexpressed
from planner.output.emit.support import check_family
from planner.trainers.torchtitan.emit import BASE_CONFIG, BUILTIN_MODEL, REGISTRY_KWARGS, parse_command
from planner.trainers.torchtitan.emit import MODELS as TT_MODELS
from test_emit_trainers import _megatron_env, _run, _say, mcore_dir  # noqa: F401 - mcore_dir is a fixture
from trainers.plans import hgx_cluster, plan_doc
from trainers.sites import bash_words

pytestmark = pytest.mark.trainers

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "configs"
FILES = {p.parent.name: p for p in sorted(CONFIG_DIR.glob("*/config.json"))}
MODELS = {**{n: n for n in catalog()}, **{f"file:{k}": str(p) for k, p in FILES.items()}}


def _megatron_builds(name: str) -> bool:
    """A family megatron-core cannot build as its config says is refused at emit (tests/test_families.py
    checks that refusal); the others are read back here."""
    from planner.trainers.megatron.emit import activation_args

    try:
        m = load_model(MODELS[name])
        check_family(m, "megatron", 4096)
        activation_args(m)          # pretrain_gpt.py's GLUs are --swiglu and --quick-geglu (Grok-1's GeGLU is refused)
    except InputError:
        return False
    return True


MEGATRON = [n for n in MODELS if _megatron_builds(n)]


def raw_config(name: str) -> dict:
    """The config as its file says it (a multimodal wrapper's text_config is the decoder)."""
    cfg = json.loads(Path(MODELS[name]).read_text()) if name.startswith("file:") else catalog_entry(name)
    if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type") or cfg.get("model_type")}
    return cfg


def rope_of(cfg: dict) -> tuple[float | None, dict | None]:
    """(rope_theta, scaling dict or None): transformers v5 rope_parameters, else rope_theta + rope_scaling.
    HunYuan's NTK-alpha scaling is plain RoPE of base theta * alpha ** (d / (d - 2)) (Tencent's
    HunYuanDynamicNTKAlphaRotaryEmbedding, transformers' dynamic rope with alpha)."""
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict) and rs.get("alpha") is not None:
        d = cfg.get("head_dim") or cfg.get("attention_head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return cfg.get("rope_theta", 10000.0) * rs["alpha"] ** (d / (d - 2)), None
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        kind = rp.get("rope_type") or rp.get("type")
        return rp.get("rope_theta", cfg.get("rope_theta")), (rp if kind not in (None, "default") else None)
    return cfg.get("rope_theta"), cfg.get("rope_scaling") or None


def _layout(name: str) -> ParallelConfig:
    m = load_model(MODELS[name])
    return ParallelConfig(tp=1, pp=1, ep=math.gcd(8, m.num_experts) if m.num_experts else 1, etp=1, mbs=1)


def _emit(name: str, trainer: str, tmp: Path) -> Path:
    doc = plan_doc(MODELS[name], hgx_cluster("h100", 1), _layout(name),
                   Training(seq_len=4096, global_batch=64, precision="bf16", trainer=trainer), world=8)
    out = tmp / name.replace(":", "_")
    emit_plan(doc, [trainer], out)
    return out


@pytest.fixture(scope="module")
def megatron_read(mcore_dir, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("fidelity-megatron")
    jobs, outs = [], {}
    for name in MEGATRON:
        out = _emit(name, "megatron", tmp)
        outs[name] = out
        jobs.append({"id": name, "args": bash_words(out / "megatron" / "args.txt"), "env": _megatron_env(out),
                     "sm": 90, "schedule": False})
    # an MLA config with plain RoPE (DeepSeek-V2-Lite without its rope_scaling): megatron-core's MLA defaults
    # to YaRN and refuses the fused RoPE kernel without it
    plain = tmp / "mla-plain-rope"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({k: v for k, v in json.loads(FILES["deepseek-v2-lite"].read_text())
                                                   .items() if k != "rope_scaling"}))
    MODELS["derived:mla-plain-rope"] = str(plain / "config.json")
    out = _emit("derived:mla-plain-rope", "megatron", tmp)
    outs["derived:mla-plain-rope"] = out
    jobs.append({"id": "derived:mla-plain-rope", "args": bash_words(out / "megatron" / "args.txt"),
                 "env": _megatron_env(out), "sm": 90, "schedule": False})
    data = _run("megatron_check.py", jobs, tmp, str(mcore_dir))
    return {r["id"]: r for r in data["results"]}, outs


def _close(a, b) -> bool:
    return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)


def megatron_mismatches(cfg: dict, r: dict, env_text: str) -> list[str]:
    """Fields the file sets that megatron-core's parsed args / TransformerConfig do not carry."""
    args, c, bad = r["args"], r["config"], []

    def want(what, have, expect, close=False):
        if not (_close(have, expect) if close else have == expect):
            bad.append(f"{what}: megatron-core has {have!r}, the config says {expect!r}")

    mla = cfg.get("kv_lora_rank") is not None
    theta, rs = rope_of(cfg)
    if theta is not None:
        # --rotary-base is type=int (megatron/training/arguments.py:2335): a fractional base is rounded
        want("rotary_base", args["rotary_base"], round(theta), close=True)
        if mla:
            want("MLA rotary_base", c["rotary_base"], theta, close=True)
    kind = (rs or {}).get("rope_type") or (rs or {}).get("type")
    if cfg["model_type"] == "nemotron_h":   # NemotronHAttention: no positional embedding
        want("position_embedding_type", args["position_embedding_type"], "none")
    elif cfg["model_type"] == "gpt2":       # GPT2Model: a learned position table (wpe)
        want("position_embedding_type", args["position_embedding_type"], "learned_absolute")
    elif kind is None:
        want("rope scaling", (args["position_embedding_type"], args["use_rope_scaling"]), ("rope", False))
        if mla:
            want("MLA rope_type", c["rope_type"], "rope")
    elif kind == "yarn" and mla:
        want("MLA rope_type", c["rope_type"], "yarn")
        want("rotary_scaling_factor", c["rotary_scaling_factor"], rs["factor"], close=True)
        for k in ("mscale", "mscale_all_dim"):
            if rs.get(k) is not None:
                want(k, c[k], rs[k], close=True)
        gaps = mla_yarn_unexpressed(load_model(MODELS[r["id"]]))
        for k in ("original_max_position_embeddings", "beta_fast", "beta_slow"):
            if rs.get(k) is not None and k not in gaps:
                want(k, c[k], rs[k], close=True)
            elif k in gaps and f"{k}={float(rs[k])!r}" not in env_text:
                bad.append(f"{k}={rs[k]}: megatron-core's command line cannot set it and env.sh does not say so")
    elif kind == "yarn":
        want("position_embedding_type", args["position_embedding_type"], "yarn")
        want("yarn factor", c["yarn_rotary_scaling_factor"], rs["factor"], close=True)
        for k, f in (("original_max_position_embeddings", "yarn_original_max_position_embeddings"),
                     ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"), ("mscale", "yarn_mscale"),
                     ("mscale_all_dim", "yarn_mscale_all_dim")):
            if rs.get(k) is not None:
                want(k, c[f], rs[k], close=True)
        if rs.get("truncate") is not None:
            want("truncate", c["yarn_correction_range_round_to_int"], rs["truncate"])
    elif kind == "llama3":
        want("use_rope_scaling", args["use_rope_scaling"], True)
        want("rope_scaling_factor", args["rope_scaling_factor"], rs["factor"], close=True)
    else:
        bad.append(f"rope type {kind!r}: no check written")
    if cfg.get("partial_rotary_factor") is not None:
        want("rotary_percent", args["rotary_percent"], cfg["partial_rotary_factor"], close=True)
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_epsilon"))
    if eps is not None:
        want("layernorm_epsilon", c["layernorm_epsilon"], eps, close=True)
    want("vocab_size", args["vocab_size"], cfg["vocab_size"])
    if "tie_word_embeddings" in cfg:
        want("untie_embeddings_and_output_weights", args["untie_embeddings_and_output_weights"],
             not cfg["tie_word_embeddings"])
    if cfg["model_type"] == "gpt_oss":   # HF GptOssExperts: gate * sigmoid(1.702 * gate), i.e. a quick-GELU GLU
        want("activation", (c["gated_linear_unit"], c["activation_func"]), (True, "quick_gelu"))
    elif cfg.get("hidden_act") == "silu":
        want("activation", (c["gated_linear_unit"], c["activation_func"]), (True, "silu"))
    llama4 = cfg["model_type"] in ("llama4", "llama4_text")   # use_qk_norm: a weightless L2 norm (Llama4TextL2Norm)
    qk = cfg["model_type"] in ("qwen3", "qwen3_moe", "qwen3_next") or (bool(cfg.get("use_qk_norm")) and not llama4)
    want("qk_layernorm", bool(c["qk_layernorm"]), qk)
    if llama4:
        want("qk_l2_norm", bool(c["qk_l2_norm"]), bool(cfg.get("use_qk_norm")))
    if c["num_moe_experts"]:
        if cfg.get("scoring_func"):
            want("moe_router_score_function", c["moe_router_score_function"], cfg["scoring_func"])
        score = c["moe_router_score_function"]
        if score == "softmax":   # megatron-core refuses expert bias with softmax; a softmax config never gets it
            want("expert bias (softmax router)", c["moe_router_enable_expert_bias"], False)
        elif cfg.get("topk_method"):
            want("expert bias", c["moe_router_enable_expert_bias"], cfg["topk_method"] == "noaux_tc")
        if cfg.get("norm_topk_prob") is not None and score == "softmax" and cfg.get("num_experts_per_tok", 1) > 1:
            want("moe_router_pre_softmax", c["moe_router_pre_softmax"], not cfg["norm_topk_prob"])
        if cfg.get("routed_scaling_factor") is not None:
            want("moe_router_topk_scaling_factor", c["moe_router_topk_scaling_factor"] or 1.0,
                 cfg["routed_scaling_factor"], close=True)
    hybrid_mismatches(cfg, args, c, want)
    return bad


def _pattern_of(cfg: dict) -> str:
    """Nemotron-H's block pattern as its file gives it (a string, or layers_block_type names)."""
    if cfg.get("hybrid_override_pattern"):
        return cfg["hybrid_override_pattern"]
    return "".join({"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}[b] for b in cfg["layers_block_type"])


def hybrid_mismatches(cfg: dict, args: dict, c: dict, want) -> None:
    """The hybrid families' mixers, read from the JSON: Nemotron-H's block pattern, Mamba-2 widths, squared
    ReLU and shared-expert width; Qwen3-Next's Gated DeltaNet layers and widths and gated attention;
    DeepSeek-V3.2's DSA indexer."""
    mt = cfg["model_type"]
    if mt == "nemotron_h":
        want("hybrid_layer_pattern", (args["hybrid_layer_pattern"] or "").replace("|", ""), _pattern_of(cfg))
        for key, field in (("ssm_state_size", "mamba_state_dim"), ("mamba_head_dim", "mamba_head_dim"),
                           ("n_groups", "mamba_num_groups"), ("mamba_num_heads", "mamba_num_heads")):
            want(field, c[field], cfg[key])
        want("activation", (c["gated_linear_unit"], c["activation_func"]), (False, "squared_relu"))
        if cfg.get("moe_shared_expert_intermediate_size"):
            want("moe_shared_expert_intermediate_size", c["moe_shared_expert_intermediate_size"],
                 cfg["moe_shared_expert_intermediate_size"])
    if mt == "qwen3_next":
        L = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or ["full_attention" if (i + 1) % cfg.get("full_attention_interval", 4) == 0
                                           else "linear_attention" for i in range(L)]
        want("experimental_attention_variant", c["experimental_attention_variant"], "gated_delta_net")
        freq = c["linear_attention_freq"]
        freq = [0 if (i + 1) % freq == 0 else 1 for i in range(L)] if isinstance(freq, int) else list(freq)
        want("linear_attention_freq", freq, [1 if t == "linear_attention" else 0 for t in types])
        for key in ("linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
                    "linear_conv_kernel_dim"):
            want(key, c[key], cfg[key])
        want("attention_output_gate", c["attention_output_gate"], True)
        # Qwen3NextSparseMoeBlock's shared_expert_gate and Qwen3NextRMSNorm's (1 + weight): the modeling code's
        # fixed traits of the family (no config field)
        want("moe_shared_expert_gate", c["moe_shared_expert_gate"], True)
        want("layernorm_zero_centered_gamma", c["layernorm_zero_centered_gamma"], True)
    if mt == "deepseek_v32":
        want("experimental_attention_variant", c["experimental_attention_variant"], "dsa")
        for key, field in (("index_n_heads", "dsa_indexer_n_heads"), ("index_head_dim", "dsa_indexer_head_dim"),
                           ("index_topk", "dsa_indexer_topk")):
            want(field, c[field], cfg[key])


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_reads_back_the_config(name, megatron_read, request):
    """megatron-core accepts the emitted args and its config has the config.json's rope base and scaling,
    norm eps, router (score function, expert bias, renormalisation, scale), qk-norm, tied embeddings,
    activation and vocabulary."""
    results, outs = megatron_read
    r = results[name]
    assert r["ok"], f"megatron-core refused {name} at {r['stage']}: {r['error']}"
    env_text = (outs[name] / "megatron" / "env.sh").read_text()
    bad = megatron_mismatches(raw_config(name), r, env_text)
    assert not bad, f"{name}: " + "; ".join(bad)
    _say(request, f"megatron-core 0.19.2 reads {name} as its config says (rotary base {r['args']['rotary_base']}, "
                  f"eps {r['config']['layernorm_epsilon']}, router {r['config']['moe_router_score_function']})")


def test_the_issue_configs_are_there():
    """The issue's defects each have a published config here: Qwen2.5-72B and Qwen3-Coder (rope base 1e6 /
    1e7, not 10,000), DeepSeek-V2-Lite (eps 1e-6, YaRN with mscale 0.707), Kimi-K2.5 (a sigmoid router with
    expert bias inside a multimodal wrapper), transformers v5 rope_parameters."""
    assert {"qwen2.5-72b-instruct", "qwen3-coder-480b-a35b-instruct", "deepseek-v2-lite", "kimi-k2.5",
            "deepseek-v2-lite-v5", "llama-3.1-8b-v5", "qwen3-8b-v5"} <= set(FILES)
    assert "rope_parameters" in json.loads(FILES["deepseek-v2-lite-v5"].read_text())


def test_mla_with_plain_rope(megatron_read):
    """An MLA config without rope_scaling: megatron-core accepts it and runs plain RoPE, not its MLA default YaRN."""
    results, outs = megatron_read
    r = results["derived:mla-plain-rope"]
    assert r["ok"], r["error"]
    assert r["config"]["rope_type"] == "rope" and r["args"]["rotary_base"] == 10000
    assert not megatron_mismatches(json.loads(Path(MODELS["derived:mla-plain-rope"]).read_text()), r, "")


def test_mismatch_check_can_fail(megatron_read):
    """The comparison is not vacuous: megatron-core's reading of DeepSeek-V2-Lite checked against
    Kimi-K2.5's config reports the differences (rope base, eps, YaRN factor, router score function)."""
    results, _ = megatron_read
    bad = megatron_mismatches(raw_config("file:kimi-k2.5"), results["file:deepseek-v2-lite"], "")
    for what in ("rotary_base", "layernorm_epsilon", "rotary_scaling_factor", "moe_router_score_function"):
        assert any(b.startswith(what) for b in bad), (what, bad)


# --- TorchTitan ---------------------------------------------------------------------------------

TITAN = [n for n in MODELS if load_model(MODELS[n]).family in ("llama", "qwen3", "qwen3_moe", "deepseek_v3",
                                                                  "gpt_oss")]


def _builtin_job(name: str, args: list[str], tmp: Path) -> dict:
    """A job building torchtitan's own flavour of a catalog model (its registry function, or for a flavour
    without one the function topoplan starts from), with the emitted command's parallelism."""
    module, fn, flavour = TT_MODELS[name]
    base = fn or BASE_CONFIG[module]
    d = tmp / f"builtin-{name}"
    d.mkdir()
    (d / "topoplan_config.py").write_text(
        f"from torchtitan.models.{module} import model_registry\n"
        f"from torchtitan.models.{module}.config_registry import {base} as _base\n\n\n"
        f"def builtin():\n    config = _base()\n"
        f"    config.model_spec = model_registry({flavour!r}, {REGISTRY_KWARGS.get(module, '')}converters=None)\n"
        f"    return config\n")
    i, j = args.index("--module"), args.index("--config")
    args = list(args)
    args[i + 1], args[j + 1] = "topoplan_config", "builtin"
    return {"id": f"builtin:{name}", "args": args, "world": 8, "sm": 100, "path": str(d)}


@pytest.fixture(scope="module")
def titan_read(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fidelity-titan")
    jobs = []
    for name in TITAN:
        try:
            out = _emit(name, "torchtitan", tmp)
        except InputError:
            continue
        args = parse_command((out / "torchtitan" / "command.txt").read_text())
        jobs.append({"id": name, "args": args, "world": 8, "sm": 100, "path": str(out / "torchtitan")})
        if name in TT_MODELS:
            jobs.append(_builtin_job(name, args, tmp))
    return {r["id"]: r for r in _run("torchtitan_check.py", jobs, tmp)}


def titan_mismatches(cfg: dict, r: dict) -> list[str]:
    """Fields the file sets that the model config torchtitan builds does not carry."""
    facts, bad = r["model"], []
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_epsilon"))
    if eps is not None and not all(math.isclose(e, eps) for e in facts["norm_eps"]):
        bad.append(f"norm eps: torchtitan builds {facts['norm_eps']}, the config says {eps}")
    theta, rs = rope_of(cfg)
    kind = (rs or {}).get("rope_type") or (rs or {}).get("type")
    for rope in facts["rope"]:
        if theta is not None and not math.isclose(rope["theta"], theta):
            bad.append(f"rope theta: torchtitan builds {rope['theta']}, the config says {theta}")
        want = {None: "none", "yarn": "yarn", "llama3": "llama"}.get(kind, kind)
        if rope["scaling"] != want:
            bad.append(f"rope scaling: torchtitan builds {rope['scaling']!r}, the config says {kind!r}")
        pairs = {"yarn": (("factor", "rope_factor"), ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"),
                          ("original_max_position_embeddings", "original_seq_len")),
                 "llama3": (("factor", "scaling_factor"), ("low_freq_factor", "low_freq_factor"),
                            ("high_freq_factor", "high_freq_factor"),
                            ("original_max_position_embeddings", "original_max_position_embeddings"))}.get(kind, ())
        for k, f in pairs:
            if rs.get(k) is not None and not math.isclose(rope[f], rs[k]):
                bad.append(f"rope {k}: torchtitan builds {rope[f]}, the config says {rs[k]}")
    for router in facts["routers"]:
        if cfg.get("scoring_func") and router["score_func"] != cfg["scoring_func"]:
            bad.append(f"router score: torchtitan builds {router['score_func']}, the config says {cfg['scoring_func']}")
        if cfg.get("norm_topk_prob") is not None and router["route_norm"] != cfg["norm_topk_prob"]:
            bad.append(f"route_norm: torchtitan builds {router['route_norm']}, the config says {cfg['norm_topk_prob']}")
        if cfg.get("routed_scaling_factor") is not None and not math.isclose(router["route_scale"],
                                                                            cfg["routed_scaling_factor"]):
            bad.append(f"route_scale: torchtitan builds {router['route_scale']}, the config says "
                       f"{cfg['routed_scaling_factor']}")
    return bad


@pytest.mark.parametrize("name", TITAN)
def test_torchtitan_builds_the_config(name, titan_read, request):
    """The model config torchtitan builds from the emitted files has the config.json's norm eps, RoPE base
    and scaling (the v5 rope_parameters too) and router settings."""
    if name not in titan_read:
        pytest.skip(f"{name}: topoplan refuses TorchTitan for it (tested in test_emit_trainers.py)")
    r = titan_read[name]
    assert r["ok"], f"torchtitan refused {name} at {r['stage']}: {r['error']}"
    bad = titan_mismatches(raw_config(name), r)
    assert not bad, f"{name}: " + "; ".join(bad)
    _say(request, f"torchtitan 0.3.0 builds {name} as its config says ({r['model']['rope'][0]['theta']} rope base, "
                  f"eps {r['model']['norm_eps']})")


def test_builtin_flavour_table_is_torchtitans(titan_read):
    """planner.trainers.torchtitan.emit.BUILTIN_MODEL (what decides whether a catalog model's launch must set
    the config's RoPE and eps itself) says what torchtitan's own flavours build: RoPE fields and eps."""
    assert set(BUILTIN_MODEL) == set(TT_MODELS)
    for name, (rope, eps) in BUILTIN_MODEL.items():
        r = titan_read[f"builtin:{name}"]
        assert r["ok"], (name, r["stage"], r["error"])
        assert r["model"]["norm_eps"] == [eps], (name, r["model"]["norm_eps"])
        (built,) = r["model"]["rope"]
        assert {k: built[k] for k in rope} == rope, (name, built)
