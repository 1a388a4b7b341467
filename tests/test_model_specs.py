"""Model specs: the catalog, config.json loading of each family, and refusals that name the field."""

from __future__ import annotations

import gc
import json

import pytest

from planner.errors import InputError
from planner.model import spec as S
from planner.model.spec import ModelSpec, catalog, catalog_entry, load_model, spec_from_config

EXPECTED = {
    "llama3-8b", "llama3-70b", "llama3.1-405b", "deepseek-v3", "kimi-k2", "qwen3-30b-a3b",
    "qwen3-235b-a22b", "gpt-oss-120b", "gpt-oss-20b", "mixtral-8x7b", "mixtral-8x22b",
    # planner/data/models_extra.json
    "glm-4.5", "glm-4.5-air", "llama4-scout", "llama4-maverick", "nemotron4-340b", "nemotron-h-56b",
    "gpt3-175b", "grok1-314b", "llama2-70b",
}


def test_catalog_lists_every_reference_model():
    assert set(catalog()) == EXPECTED
    for name in catalog():
        m = load_model(name)
        assert isinstance(m, ModelSpec) and m.name == name
        assert len(m.moe_layers) == len(m.swa_layers) == m.num_layers


def test_lookup_is_case_insensitive_and_refuses_unknown():
    assert load_model("DeepSeek-V3") is load_model("deepseek-v3")
    with pytest.raises(InputError, match="unknown model 'gpt-5'"):
        load_model("gpt-5")


def test_a_typo_gets_did_you_mean_and_a_directory_without_config_says_so(tmp_path):
    with pytest.raises(InputError, match="did you mean 'deepseek-v3'"):
        load_model("deepseek-v4")
    with pytest.raises(InputError, match="did you mean 'qwen3-235b-a22b'"):
        load_model("qwen3-235b-a22")
    with pytest.raises(InputError, match="the directory has no config.json"):
        load_model(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        load_model(tmp_path / "nope" / "config.json")


# Published totals (params_stated_* in planner/data/models_extra.json, and for the reference models
# the figures their publishers state). Held to 2% with and without the MTP modules where the
# publisher's own count is ambiguous about them (GLM-4.5 states 355B; 352.8B + 4.0B MTP).
# Each publisher's active figure matches one convention (planner.model.flops.ParamCounts).
@pytest.mark.parametrize("name, total, convention, active", [
    ("glm-4.5", 355e9, "active_non_embedding", 32e9),        # zai-org: 355B total, 32B active
    ("glm-4.5-air", 106e9, "active_non_embedding", 12e9),    # zai-org: 106B total, 12B active
    ("llama4-scout", 109e9, "active", 17e9),                 # Meta: 109B total (with the vision encoder), 17B active
    ("llama4-maverick", 400e9, "active", 17e9),              # Meta: 400B total, 17B active
    ("gpt-oss-20b", 20.9e9, "active_without_embedding", 3.61e9),   # OpenAI card: 20.91B total, 3.61B active
    ("gpt-oss-120b", 116.8e9, "active_without_embedding", 5.13e9),  # OpenAI card: 116.83B total, 5.13B active
    ("deepseek-v3", 671e9, "active", 37e9),                  # DeepSeek: 671B total, 37B activated
    ("llama2-70b", 70e9, "active", 70e9),                    # Meta: Llama 2 70B (68.98B counted), dense
    # Nemotron-4 340B technical report (arXiv:2406.11704): 9.4B embedding + 331.6B non-embedding parameters
    ("nemotron4-340b", 341.0e9, "active_non_embedding", 331.6e9),
    ("grok1-314b", 314.0e9, "active", 84.5e9),              # xai-org/grok-1 README: 314B, 2 of 8 experts a token
    ("gpt3-175b", 175.0e9, "active", 175.0e9),              # Brown et al. 2020: 175B (the 2048 x 12288
    #                                                         learned position table, 25M, is not counted)
])
def test_parameter_counts_match_the_published_figures(name, total, convention, active):
    from planner.model.flops import param_counts

    pc = param_counts(load_model(name))
    assert min(abs(pc.total / total - 1), abs(pc.total_with_mtp / total - 1)) < 0.02, pc.total
    assert getattr(pc, convention) == pytest.approx(active, rel=0.02)
    assert pc.active - pc.active_without_embedding == pc.embedding
    assert pc.active_without_embedding - pc.active_non_embedding == pc.output


def test_nemotron4_is_a_plain_squared_relu_mlp_with_partial_rope():
    """Nemotron-4 (HF NemotronConfig, Megatron-Bridge NemotronModelProvider): two MLP matrices (no gate), squared
    ReLU, half the head rotated; a config.json of the family without ``gated_mlp`` reads the same."""
    from planner.model.flops import param_counts

    m = load_model("nemotron4-340b")
    assert m.family == "nemotron" and not m.gated_mlp and m.activation == "relu2" and m.layer_norm
    assert (m.head_dim, m.num_kv_heads, m.partial_rotary_factor, m.tied_embeddings) == (192, 8, 0.5, False)
    # one layer by hand: q and o 18432^2 each, k and v 18432 x 8 x 192 each, MLP 2 x 18432 x 73728
    h = 18432
    per_layer = 2 * h * h + 2 * h * 8 * 192 + 2 * h * 73728
    assert param_counts(m).active_non_embedding == pytest.approx(96 * per_layer, rel=1e-3)
    cfg = {k: v for k, v in catalog_entry("nemotron4-340b").items() if k != "gated_mlp"}
    assert not spec_from_config(cfg, name="x").gated_mlp


def test_gpt2_family_reads_gpt2config_names_and_learned_positions():
    """transformers' GPT2Config names (n_layer, n_embd, n_head, n_inner None = 4 n_embd, n_positions): GPT-3 175B is
    this architecture (plain GELU MLP, biases, tied embeddings, learned absolute positions); Megatron gets
    --position-embedding-type learned_absolute, not RoPE."""
    from planner.trainers.megatron.emit import activation_args

    m = load_model("gpt3-175b")
    assert (m.family, m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_kv_heads, m.head_dim) == (
        "gpt2", 96, 12288, 49152, 96, 128)
    assert not m.gated_mlp and m.attention_bias and m.mlp_bias and m.tied_embeddings
    assert m.position_embedding == "learned_absolute" and activation_args(m) == []
    small = spec_from_config({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
                              "vocab_size": 50257, "activation_function": "gelu_new"}, name="gpt2")
    assert small.ffn_hidden_size == 4 * 768 and small.tied_embeddings and small.max_position_embeddings == 1024
    with pytest.raises(InputError, match="n_layer"):
        spec_from_config({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "vocab_size": 50257}, name="x")


def test_glm45_and_llama4_specs():
    g = load_model("glm-4.5")
    assert g.family == "glm4_moe" and g.attention == "gqa" and g.moe_layers == (False,) * 3 + (True,) * 89
    assert (g.num_experts, g.top_k, g.moe_ffn_hidden_size, g.shared_ffn_hidden_size, g.mtp_layers) == (160, 8, 1536, 1536, 1)
    assert g.qk_norm and g.attention_bias and g.ffn_hidden_size == 12288
    a = load_model("glm-4.5-air")
    assert not a.qk_norm and a.moe_layers == (False,) + (True,) * 45
    s = load_model("llama4-scout")
    assert s.family == "llama4" and all(s.moe_layers) and (s.num_experts, s.top_k) == (16, 1)
    assert s.shared_ffn_hidden_size == s.moe_ffn_hidden_size == 8192
    m = load_model("llama4-maverick")
    # HF Llama4TextConfig: moe_layers = range(step - 1, L, step) with interleave_moe_layer_step 2
    assert m.moe_layers == tuple(i % 2 == 1 for i in range(48)) and m.ffn_hidden_size == 16384
    assert m.num_experts == 128 and not any(m.swa_layers)


def test_llama4_reads_the_nested_text_config_and_its_explicit_moe_layers():
    text = dict(catalog_entry("llama4-maverick")["text_config"], moe_layers=[3, 7])
    cfg = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text}
    m = spec_from_config(cfg, name="x")
    assert [i for i, f in enumerate(m.moe_layers) if f] == [3, 7]
    with pytest.raises(InputError, match="moe_layers"):
        spec_from_config({**cfg, "text_config": {**text, "moe_layers": [99]}})


def test_deepseek_v3_spec():
    m = load_model("deepseek-v3")
    assert (m.attention, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        "mla", 1536, 512, 128, 64, 128)
    assert m.moe_layers == (False,) * 3 + (True,) * 58
    assert (m.num_experts, m.top_k, m.moe_ffn_hidden_size, m.shared_ffn_hidden_size) == (256, 8, 2048, 2048)
    assert (m.n_group, m.topk_group, m.mtp_layers, m.make_vocab_divisible_by) == (8, 4, 1, 1280)
    assert m.padded_vocab(2) == 130560 and not m.tied_embeddings and m.is_moe


def test_family_specific_fields():
    k = load_model("kimi-k2")
    assert k.moe_layers[0] is False and all(k.moe_layers[1:]) and k.num_experts == 384 and k.mtp_layers == 0
    assert (k.n_group, k.topk_group) == (1, 1)
    q = load_model("qwen3-30b-a3b")
    assert all(q.moe_layers) and q.shared_ffn_hidden_size == 0 and q.qk_norm and q.head_dim == 128
    g = load_model("gpt-oss-120b")
    assert g.swa_layers == tuple(i % 2 == 0 for i in range(36)) and g.sliding_window == 128
    assert g.activation == "quick_gelu" and g.attention_bias and g.attention_sinks and g.moe_ffn_hidden_size == 2880
    x = load_model("mixtral-8x7b")
    assert all(x.moe_layers) and (x.num_experts, x.top_k, x.moe_ffn_hidden_size) == (8, 2, 14336)
    assert x.sliding_window is None and not any(x.swa_layers)
    ll = load_model("llama3-70b")
    assert not ll.is_moe and (ll.num_kv_heads, ll.head_dim, ll.ffn_hidden_size) == (8, 128, 28672)


def test_config_json_file_loads_like_the_catalog(tmp_path):
    for name in catalog():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(catalog_entry(name)))
        from_dir = load_model(d)
        from_file = load_model(d / "config.json")
        ref = load_model(name)
        assert from_file == from_dir
        skip = {"name", "source"}
        assert from_file.model_dump(exclude=skip) == ref.model_dump(exclude=skip), name
        assert from_file.name == name


def _hf_qwen3_moe(**over):
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 8,
        "hidden_size": 1024, "intermediate_size": 3072, "moe_intermediate_size": 256, "num_attention_heads": 16,
        "num_key_value_heads": 4, "head_dim": 64, "num_experts": 32, "num_experts_per_tok": 4,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 32000, "tie_word_embeddings": True,
        "hidden_act": "silu", "sliding_window": 4096, "use_sliding_window": False,
    }
    cfg.update(over)
    return cfg


def test_qwen3_dense_layers_from_mlp_only_layers_and_sparse_step():
    m = spec_from_config(_hf_qwen3_moe(mlp_only_layers=[0, 5]))
    assert m.moe_layers == (False, True, True, True, True, False, True, True)
    m = spec_from_config(_hf_qwen3_moe(decoder_sparse_step=2))
    assert m.moe_layers == (False, True) * 4  # (i+1) % 2 == 0
    assert m.tied_embeddings and m.sliding_window is None  # use_sliding_window false: no window
    m = spec_from_config(_hf_qwen3_moe(use_sliding_window=True, max_window_layers=6))
    assert m.swa_layers == (False,) * 6 + (True,) * 2 and m.sliding_window == 4096


def test_deepseek_without_q_lora_and_gpt_oss_layer_types():
    ds = dict(catalog_entry("deepseek-v3"), q_lora_rank=None, first_k_dense_replace=1, moe_layer_freq=2)
    m = spec_from_config(ds)
    assert m.q_lora_rank is None
    assert m.moe_layers[:5] == (False, False, True, False, True)  # i >= 1 and i % 2 == 0
    g = dict(catalog_entry("gpt-oss-20b"), layer_types=["full_attention"] * 20 + ["sliding_attention"] * 4)
    assert spec_from_config(g).swa_layers == (False,) * 20 + (True,) * 4


def test_gpt_oss_config_with_openai_key_names():
    cfg = dict(catalog_entry("gpt-oss-20b"))
    cfg["experts_per_token"] = cfg.pop("num_experts_per_tok")
    assert spec_from_config(cfg).top_k == 4
    cfg["experts_per_token"] = 64
    with pytest.raises(InputError, match="'experts_per_token'"):
        spec_from_config(cfg)


def test_renamed_model_type_is_read_by_architecture_and_unknown_ones_refused():
    cfg = {"model_type": "my_llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
           "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1536, "vocab_size": 1000}
    m = spec_from_config(cfg, name="mine")
    assert (m.family, m.head_dim, m.num_kv_heads, m.is_moe) == ("llama", 64, 8, False)
    cfg.update(model_type="mamba", architectures=["MambaForCausalLM"])
    with pytest.raises(InputError, match="field 'model_type' 'mamba'"):
        spec_from_config(cfg, source="mamba.json")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"model_type": "mystery", "architectures": ["MysteryForCausalLM"]}, "model_type"),
        ({"model_type": None, "architectures": None}, "model_type"),
        ({"head_dim": None, "hidden_size": 1000}, "num_attention_heads"),   # 16 heads do not divide 1000
        ({"num_experts_per_tok": 40}, "num_experts_per_tok"),             # 40 > 32 experts
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"num_hidden_layers": "eight"}, "num_hidden_layers"),
        ({"mlp_only_layers": [99]}, "mlp_only_layers"),
        ({"moe_intermediate_size": None}, "moe_intermediate_size"),
    ],
)
def test_refusals_name_the_file_and_field(tmp_path, change, field):
    cfg = _hf_qwen3_moe()
    for k, v in change.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(InputError) as exc:
        load_model(p)
    msg = str(exc.value)
    assert str(p) in msg and f"'{field}'" in msg and "\n" not in msg


def test_refusals_for_mla_and_groups(tmp_path):
    for change, field in (({"kv_lora_rank": None}, "kv_lora_rank"), ({"n_group": 7}, "n_group"),
                          ({"topk_group": 9}, "topk_group"), ({"first_k_dense_replace": 99}, "first_k_dense_replace")):
        cfg = catalog_entry("deepseek-v3")
        for k, v in change.items():
            if v is None:
                cfg.pop(k)
            else:
                cfg[k] = v
        with pytest.raises(InputError, match=f"'{field}'"):
            spec_from_config(cfg, source="ds.json")


def test_bad_files(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_model(p)
    with pytest.raises(InputError, match="no such file"):
        load_model(tmp_path / "missing.json")
    p.write_text("[1, 2]")
    with pytest.raises(InputError, match="JSON object"):
        load_model(p)


def test_spec_is_frozen_and_validates():
    m = load_model("llama3-8b")
    with pytest.raises(Exception):
        m.num_layers = 3
    with pytest.raises(Exception):
        m.model_copy(update={}).__class__(**{**m.model_dump(), "moe_layers": (True,) * 32})  # experts=0


def test_hash_is_computed_once_and_stays_pydantics():
    """ModelSpec's hash is kept per instance (planner/model/spec.py ``_hash_once``): it must still be
    the field-by-field hash pydantic gives a frozen model (oracle: the tuple of its field values), equal
    for equal specs built apart, and a ``model_copy`` with a change must hash (and compare) as itself."""
    m = load_model("deepseek-v3")
    twin = ModelSpec(**m.model_dump())
    assert twin is not m and twin == m
    fields = tuple(m.__dict__[k] for k in ModelSpec.model_fields)
    assert hash(m) == hash(twin) == hash(fields)
    shallower = m.model_copy(update={"num_layers": m.num_layers - 1})
    assert hash(shallower) == hash(tuple(shallower.__dict__[k] for k in ModelSpec.model_fields)) != hash(m)
    assert {m: 1, twin: 2, shallower: 3} == {m: 2, shallower: 3}
    kept = len(S._HASHES)
    del twin, shallower
    gc.collect()
    assert len(S._HASHES) == kept - 2   # the entries go with their instances
