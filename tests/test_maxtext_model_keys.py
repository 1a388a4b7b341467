"""MaxText model keys for a user's config.json (issue 23): the emitted overrides, read back the way MaxText
0.2.5 merges base.yml, a model file and overrides (tests/trainers/maxtext_config.py), build the config's
model; emitted for a catalog model as if it were a user's config, they build what MaxText's own
configs/models/<name>.yml builds (the independent oracle: MaxText's files, vendored in tests/data/maxtext);
what MaxText cannot express is refused in one line naming MaxText and the config's field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from planner.config import ParallelConfig, Training
from planner.errors import InputError
from planner.model.spec import catalog_entry, load_model, spec_from_config
from planner.output.emit import load_context, render_files
from planner.trainers.maxtext import model_keys as mk
from planner.trainers.maxtext.families import MODEL_NAMES, maxtext_model_name
from trainers.maxtext_config import effective, load_yaml, model_file, model_view
from trainers.plans import hgx_cluster, plan_doc

CONFIGS = Path(__file__).parent / "data" / "configs"
# tests/data configs MaxText builds from keys, and MaxText's own file of the same model where it ships one
USER_CONFIGS = {"deepseek-v2-lite": "deepseek2-16b", "deepseek-v2-lite-v5": "deepseek2-16b", "kimi-k2.5": None,
                "llama-3.1-8b-v5": "llama3.1-8b", "qwen2.5-72b-instruct": None, "qwen3-8b-v5": "qwen3-8b",
                "qwen3-coder-480b-a35b-instruct": "qwen3-480b-a35b",
                "qwen3-next-80b-a3b-instruct": "qwen3-next-80b-a3b"}
# where MaxText's own file and the config disagree, each checked against the publisher's config.json
KNOWN = {
    # deepseek3-671b.yml: "For DeepSeek default device-limited routing, please set n_routing_groups=8 and
    # topk_routing_group=4" -- the config's n_group 8 / topk_group 4 are written
    ("deepseek-v3", "groups"): ((8, 4), (-1, -1)),
    # MaxText's Qwen3 MoE files carry the 2507 releases' RoPE base; Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B
    # (the catalog's sources) say rope_theta 1,000,000
    ("qwen3-30b-a3b", "rope.theta"): (1_000_000, 10_000_000),
    ("qwen3-235b-a22b", "rope.theta"): (1_000_000, 5_000_000),
}
# keys of MaxText's model files that build nothing of the model: base.yml's dropout_rate is 0; the tokenizer;
# the aux-loss weight; the Gated DeltaNet kernel's chunk length
INERT = {"enable_dropout", "tokenizer_type", "load_balance_loss_weight", "gdn_chunk_size"}


def _emitted(path: str | Path) -> dict:
    ep = 8 if load_model(path).num_experts else 1
    doc = plan_doc(str(path), hgx_cluster("h100", 1), ParallelConfig(tp=1, pp=1, ep=ep),
                   Training(seq_len=4096, global_batch=64, trainer="maxtext"))
    return load_yaml(render_files(load_context(doc), ["maxtext"])["maxtext/overrides.yml"])


def _as_user_config(name: str, tmp_path: Path) -> Path:
    """The catalog model's config.json under another name (no MaxText model_name matches it)."""
    raw = {k: v for k, v in catalog_entry(name).items() if not k.startswith("_")}
    p = tmp_path / f"my-{name}" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(raw))
    assert maxtext_model_name(load_model(p)) is None
    return p


def _flat(view: dict) -> dict:
    out = {k: v for k, v in view.items() if k != "rope"}
    out.update({f"rope.{k}": v for k, v in view["rope"].items()})
    return out


def _differences(mine: dict, theirs: dict) -> dict:
    a, b = _flat(mine), _flat(theirs)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _no_leak(overrides: dict) -> None:
    """A key MaxText's named model file sets and the overrides leave out would reach the run."""
    if overrides.get("model_name", "default") != "default":
        assert overrides.get("override_model_config") is True
        assert set(model_file(overrides["model_name"])) - set(overrides) <= INERT


@pytest.mark.parametrize("name", sorted(MODEL_NAMES))
def test_a_catalog_model_as_a_user_config_builds_what_maxtexts_own_file_builds(name, tmp_path):
    mine = _emitted(_as_user_config(name, tmp_path))
    _no_leak(mine)
    view = model_view(effective(mine))
    diff = _differences(view, model_view(effective({"model_name": MODEL_NAMES[name]})))
    assert diff == {k[1]: v for k, v in KNOWN.items() if k[0] == name}
    # the catalog model itself names MaxText's file and overrides it with the same keys: the same model
    catalog = _emitted(name)
    assert catalog["model_name"] == MODEL_NAMES[name]
    _no_leak(catalog)
    assert model_view(effective(catalog)) == view


@pytest.mark.parametrize("name", [n for n, f in USER_CONFIGS.items() if f])
def test_a_user_config_builds_what_maxtexts_own_file_of_that_model_builds(name):
    mine = _emitted(CONFIGS / name / "config.json")
    _no_leak(mine)
    assert _differences(model_view(effective(mine)), model_view(effective({"model_name": USER_CONFIGS[name]}))) == {}


def _spec_view(m) -> dict:
    """What the ModelSpec says, by hand, in the terms of model_view (for the fields the config sets)."""
    moe = list(m.moe_layers)
    v = {"layers": m.num_layers, "emb": m.hidden_size, "heads": m.num_attention_heads, "kv_heads": m.num_kv_heads,
         "vocab": m.vocab_size, "eps": m.norm_eps, "tied": m.tied_embeddings, "rope.theta": m.rope_theta}
    v["head_dim" if m.attention != "mla" else "v_head_dim"] = m.head_dim
    if m.attention == "mla":
        v.update(q_lora_rank=m.q_lora_rank or 0, kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim)
    if not all(moe):
        v["mlp_dim"] = m.ffn_hidden_size
    if m.num_experts:
        v.update(experts=m.num_experts, top_k=m.top_k, moe_mlp_dim=m.moe_ffn_hidden_size,
                 first_dense=moe.index(True), shared_ffn=m.shared_ffn_hidden_size, renormalised=m.norm_topk_prob,
                 expert_bias=m.expert_bias, router_scale=m.router_scale)
    if m.qk_norm:
        v["qk_norm"] = True
    if m.attention_bias:
        v["attention_bias"] = True
    if m.gdn:   # Qwen3-Next: full attention every full_attention_interval-th layer, the Gated DeltaNet widths
        g, full = m.gdn, [i for i, x in enumerate(m.mixers) if x == "attention"]
        v.update(inhomogeneous_layer_cycle_interval=full[1] - full[0], partial_rotary_factor=m.partial_rotary_factor,
                 qk_norm_zero_centered=m.norm_zero_centered,
                 gdn_num_key_heads=g.num_key_heads, gdn_key_head_dim=g.key_head_dim,
                 gdn_num_value_heads=g.num_value_heads, gdn_value_head_dim=g.value_head_dim,
                 gdn_conv_kernel_dim=g.conv_kernel)
    rs = m.rope_scaling
    if rs is not None:
        v["rope.kind"] = {"llama3": "llama3.1", "yarn": "yarn", "linear": "default"}[rs.kind]
        if rs.kind == "yarn":
            v.update({"rope.rope_factor": rs.factor, "rope.original_max_position_embeddings":
                      rs.original_max_position_embeddings, "rope.beta_fast": rs.beta_fast, "rope.beta_slow": rs.beta_slow})
            v.update(_hf_yarn_scales(m))
    return v


def _hf_yarn_scales(m) -> dict:
    """transformers' YaRN scales: cos/sin x attention_factor (_compute_yarn_parameters: get_mscale(f, mscale) /
    get_mscale(f, mscale_all_dim) when both are set, else get_mscale(f)); DeepSeek's MLA softmax scale x
    get_mscale(f, mscale_all_dim)^2 (DeepseekV3Attention)."""
    rs = m.rope_scaling

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
    if rs.mscale and rs.mscale_all_dim:
        cos_sin = get_mscale(rs.factor, rs.mscale) / get_mscale(rs.factor, rs.mscale_all_dim)
    else:
        cos_sin = get_mscale(rs.factor)
    out = {"rope.cos_sin_scale": pytest.approx(cos_sin)}
    if m.attention == "mla":
        out["rope.softmax_scale_factor"] = pytest.approx(get_mscale(rs.factor, rs.mscale_all_dim or 0.0) ** 2)
    return out


def _read_as_spec(view: dict, keys: tuple) -> dict:
    """model_view in ModelSpec terms, for the keys _spec_view names."""
    f = _flat(view)
    moe = view.get("experts", 0) > 1
    shared = f["shared_expert"] if "shared_expert" in f else f.get("shared_experts", 0)   # qwen3_next: one or none
    derived = {"first_dense": f.get("first_num_dense_layers", 0) if moe else None,
               "shared_ffn": shared * f.get("moe_mlp_dim", 0) if moe else None,
               "expert_bias": bool(f.get("routed_bias")) and f.get("routed_score_func", "") != "softmax",
               "router_scale": f.get("routed_scaling_factor", 1.0)}
    return {k: derived[k] if k in derived else f.get(k) for k in keys}


def _user_specs():
    return [CONFIGS / n / "config.json" for n in USER_CONFIGS]


@pytest.mark.parametrize("path", _user_specs(), ids=lambda p: p.parent.name)
def test_the_emitted_keys_read_back_give_the_configs_shape(path):
    m = load_model(path)
    want = _spec_view(m)
    got = _read_as_spec(model_view(effective(_emitted(path))), tuple(want))
    assert got == want


def test_another_qwen3_next_shape_reads_back_as_its_config(tmp_path):
    """MaxText's qwen3_next block with the config's keys: 24 layers, full attention every 3rd, 256 experts."""
    raw = json.loads((CONFIGS / "qwen3-next-80b-a3b-instruct" / "config.json").read_text())
    raw.update(num_hidden_layers=24, full_attention_interval=3, num_experts=256, linear_num_value_heads=16)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    m = load_model(p)
    o = _emitted(p)
    assert "model_name" not in o
    want = _spec_view(m)
    assert _read_as_spec(model_view(effective(o)), tuple(want)) == want
    assert want["inhomogeneous_layer_cycle_interval"] == 3 and want["gdn_num_value_heads"] == 16


def test_the_read_back_fails_when_a_key_is_dropped(monkeypatch):
    """Mutant: without normalization_layer_epsilon MaxText runs base.yml's 1e-5, not Qwen3's 1e-6."""
    path = CONFIGS / "qwen3-8b-v5" / "config.json"
    real = mk.model_keys
    monkeypatch.setattr("planner.trainers.maxtext.emit.model_keys",
                        lambda m, name: {k: v for k, v in real(m, name).items() if k != "normalization_layer_epsilon"})
    got = _read_as_spec(model_view(effective(_emitted(path))), ("eps",))
    assert got == {"eps": 1e-5} != {"eps": load_model(path).norm_eps}


def test_deepseek_v3_routing_names_maxtexts_file_and_overrides_all_its_keys():
    o = _emitted(CONFIGS / "kimi-k2.5" / "config.json")
    assert o["model_name"] == "kimi-k2-1t" and o["override_model_config"] is True
    assert o["routed_bias_update_rate"] == 1e-3     # the bias moves (base.yml's 0.0 would keep it at zero)
    view = model_view(effective(o))
    assert view["deepseek_routing"] and view["routed_bias"] and view["rope"]["theta"] == 50000
    assert view["rope"]["rope_factor"] == 64 and view["eps"] == 1e-5       # Kimi-K2.5's own, not K2's 32 / 1e-6
    v2 = _emitted(CONFIGS / "deepseek-v2-lite" / "config.json")
    assert "model_name" not in v2 and not model_view(effective(v2))["deepseek_routing"]


def _variant(tmp_path, name: str, **change) -> dict:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(_cfg(name, **change)))
    return model_view(effective(_emitted(p)))


def test_tied_embeddings_linear_and_yarn_rope_read_back_as_transformers_runs_them(tmp_path):
    v = _variant(tmp_path, "qwen2.5-72b-instruct", tie_word_embeddings=True,
                 rope_scaling={"type": "linear", "factor": 4.0})
    assert v["tied"] and not v["tied_logits_divided"]          # HF's tied head: no 1/sqrt(emb_dim)
    assert v["rope"] == {"kind": "default", "theta": 1_000_000, "linear_factor": 4.0}
    # Qwen's YaRN recipe: transformers scales cos/sin by 0.1 ln(4) + 1 and rotates halves (not interleaved)
    v = _variant(tmp_path, "qwen2.5-72b-instruct",
                 rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert v["rope"]["cos_sin_scale"] == pytest.approx(1.1386294361) and v["rope"]["rope_interleave"] is False
    # the position table covers the extended context, 4 x 32,768 (the config's max_position_embeddings is 32,768)
    assert v["rope"]["max_position_embeddings"] == 131072 and v["rope"]["original_max_position_embeddings"] == 32768


def _cfg(name: str, **change) -> dict:
    raw = json.loads((CONFIGS / name / "config.json").read_text())
    raw.update(change)
    return raw


@pytest.mark.parametrize("name, change, field", [
    ("qwen3-8b-v5", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama-3.1-8b-v5", {"attention_bias": True}, "attention_bias"),
    ("llama-3.1-8b-v5", {"mlp_bias": True}, "mlp_bias"),
    ("llama-3.1-8b-v5", {"hidden_act": "gelu"}, "hidden_act"),
    ("qwen2.5-72b-instruct", {"rope_theta": 500000.5}, "rope_theta"),
    ("llama-3.1-8b-v5", {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192}}, "rope_scaling"),
    ("llama-3.1-8b-v5", {"model_type": "mistral", "sliding_window": 4096}, "sliding_window"),
    ("qwen3-coder-480b-a35b-instruct", {"norm_topk_prob": False}, "norm_topk_prob"),
    ("qwen3-coder-480b-a35b-instruct", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("deepseek-v2-lite", {"rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.707,
                                           "original_max_position_embeddings": 4096}}, "mscale"),
    ("deepseek-v2-lite", {"rope_scaling": None}, "rope_scaling"),
    ("qwen3-next-80b-a3b-instruct", {"shared_expert_intermediate_size": 1024}, "shared_expert_intermediate_size"),
    ("qwen3-next-80b-a3b-instruct", {"full_attention_interval": 5}, "full_attention_interval"),
    ("deepseek-v2-lite", {"n_group": 4, "topk_group": 2}, "n_group"),
    ("kimi-k2.5", {"norm_topk_prob": False}, "norm_topk_prob"),
])
def test_what_maxtext_cannot_express_is_refused_in_one_line_naming_the_field(name, change, field, tmp_path):
    raw = _cfg(name, **change)
    if "text_config" in raw:   # Kimi-K2.5's wrapper: the change goes to its text model
        raw = {**raw, "text_config": {**raw["text_config"], **change}}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError) as exc:
        _emitted(p)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("--trainer maxtext: MaxText cannot build") and field in msg


def test_a_family_topoplan_maps_no_block_to_is_refused():
    m = spec_from_config(catalog_entry("glm-4.5"), name="my-glm")
    assert "model_type 'glm4_moe'" in mk.refusal(m)
