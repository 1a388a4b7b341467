"""Hybrid families (issue 23 item 1): Qwen3-Next (Gated DeltaNet + gated attention), Nemotron-H (Mamba-2
hybrids, Nemotron 3 Nano's MoE) and DeepSeek-V3.2 (DeepSeek sparse attention). Each published config in
tests/data/configs loads with the publisher's total and active parameters, its per-layer FLOPs follow the
papers' complexity (checked against brute force and hand sums from the JSON fields), its memory carries the
recurrent states, it plans on 64 H100 (or is refused with a hand bound), a trainer that cannot build it
refuses in one line, and bad fields are named. megatron-core's own read-back and FLOP count are in
tests/test_hybrids_trainers.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.cost.memory import layer_activation_bytes
from planner.errors import InfeasibleError, InputError
from planner.model.flops import flops_per_token, layer_costs, param_counts
from planner.model.spec import load_model, spec_from_config
from planner.output.emit import load_context, render_files
from planner.output.emit.support import check_family
from planner.rules import violations
from planner.search.plan import plan
from topologies.loader import load_cluster
from test_families import load_with_one_junk_field
from trainers.plans import hgx_cluster, plan_doc

CONFIGS = Path(__file__).parent / "data" / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def _model(name: str):
    return load_model(CONFIGS / name / "config.json")


# directory, published total (B), published active (B), the ParamCounts field the publisher's active figure
# matches, active tolerance, the source (tests/data/configs/README.md)
PUBLISHED = [
    # Qwen/Qwen3-Next-80B-A3B-Instruct model card: "80B in total" (its "3B activated" is the name's A3B:
    # test_qwen_names_its_moe_models_by_the_activated_count_rounded_down)
    ("qwen3-next-80b-a3b-instruct", 80.0, None, "active", 0.05),
    # nvidia/Nemotron-H-{8B,47B,56B}-Base-8K model cards and arXiv:2504.03624: dense, active = total
    ("nemotron-h-8b-base-8k", 8.0, 8.0, "active", 0.05),
    ("nemotron-h-47b-base-8k", 47.0, 47.0, "active", 0.05),
    ("nemotron-h-56b-base-8k", 56.0, 56.0, "active", 0.05),
    # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B model card: 31.6B total, 3.2B active (3.6B with embeddings)
    ("nemotron-3-nano-30b-a3b", 31.6, 3.6, "active", 0.05),
    ("nemotron-3-nano-30b-a3b", 31.6, 3.2, "active_without_embedding", 0.05),
    # deepseek-ai/DeepSeek-V3.2-Exp: DeepSeek-V3's 671B total / 37B activated plus the indexer (0.85B)
    ("deepseek-v3.2-exp", 671.0, 37.0, "active", 0.05),
]


@pytest.mark.parametrize("name, total, active, field, tol", PUBLISHED)
def test_published_total_and_active_parameters(name, total, active, field, tol):
    p = param_counts(_model(name))
    assert abs(p.total / 1e9 - total) / total <= 0.03
    if active is not None:
        assert abs(getattr(p, field) / 1e9 - active) / active <= tol


# Qwen's one convention: activated parameters with both embeddings, as ParamCounts.active counts them
# (Qwen3-30B-A3B's card: "30.5B in total and 3.3B activated", 29.9B non-embedding, so the 0.6B of the
# two embeddings are in both figures; Qwen3-235B-A22B's: "22B activated"), and the model's name carries
# that count rounded down to whole billions (A3B, A22B, A35B). Qwen3-Next's card states only its name's
# "3B" (its count is 3.87B; 3.25B without either embedding), so the name's rule is the check there.
QWEN_CARDS = [("qwen3-30b-a3b", 3.3, 3), ("qwen3-235b-a22b", 22.0, 22),
              (CONFIGS / "qwen3-coder-480b-a35b-instruct" / "config.json", 35.0, 35),
              (CONFIGS / "qwen3-next-80b-a3b-instruct" / "config.json", None, 3)]


@pytest.mark.parametrize("model, card, name_b", QWEN_CARDS, ids=lambda x: getattr(x, "parent", x))
def test_qwen_names_its_moe_models_by_the_activated_count_rounded_down(model, card, name_b):
    active = param_counts(load_model(model)).active / 1e9
    assert math.floor(active) == name_b
    if card is not None:
        assert abs(active - card) / card <= 0.05


def test_deepseek_v32_with_mtp_is_the_checkpoint_size():
    # the Hugging Face repository lists 685B parameters: the checkpoint, MTP module included
    assert abs(param_counts(_model("deepseek-v3.2-exp")).total_with_mtp / 1e9 - 685) / 685 <= 0.03


def test_gdn_and_mamba_parameters_by_hand():
    """One layer of each mixer, summed by hand from the JSON fields (HF Qwen3NextGatedDeltaNet,
    NemotronHMamba2Mixer)."""
    q = _cfg("qwen3-next-80b-a3b-instruct")
    h, k, v = q["hidden_size"], q["linear_num_key_heads"] * q["linear_key_head_dim"], \
        q["linear_num_value_heads"] * q["linear_value_head_dim"]
    nv, K = q["linear_num_value_heads"], q["linear_conv_kernel_dim"]
    gdn = (h * (2 * k + 2 * v) + h * 2 * nv + (2 * k + v) * K + 2 * nv + q["linear_value_head_dim"] + v * h)
    first = layer_costs(_model("qwen3-next-80b-a3b-instruct"), 4096)[0]
    assert first.mixer == "gdn" and first.attn_params == gdn
    n = _cfg("nemotron-h-8b-base-8k")
    H, d, N, G = n["hidden_size"], n["mamba_num_heads"] * n["mamba_head_dim"], n["ssm_state_size"], n["n_groups"]
    conv = d + 2 * G * N
    mamba = H * (2 * d + 2 * G * N + n["mamba_num_heads"]) + conv * (n["conv_kernel"] + 1) \
        + 3 * n["mamba_num_heads"] + d + d * H
    c0 = layer_costs(_model("nemotron-h-8b-base-8k"), 4096)[0]
    assert n["hybrid_override_pattern"][0] == "M" and c0.mixer == "mamba"
    assert c0.params == mamba + H       # the block's one norm; no MLP in a Mamba block


def test_nemotron_h_blocks_follow_the_pattern():
    for name in ("nemotron-h-8b-base-8k", "nemotron-3-nano-30b-a3b", "nemotron-h-47b-base-8k"):
        pat = _cfg(name)["hybrid_override_pattern"]
        m = _model(name)
        assert m.num_layers == len(pat)
        want = {"M": ("mamba", "none"), "*": ("attention", "none"), "-": ("none", "dense"), "E": ("none", "moe")}
        assert [(m.mixers[i], m.mlp_kind(i)) for i in range(m.num_layers)] == [want[c] for c in pat]


@settings(max_examples=40, deadline=None)
@given(s=st.integers(min_value=2, max_value=1 << 17))
def test_recurrent_mixers_are_linear_in_the_sequence(s):
    """Gated DeltaNet's delta rule and Mamba-2's scan cost the same per token at any length; full attention's
    core grows as s/2 keys per query."""
    qn, nh = _model("qwen3-next-80b-a3b-instruct"), _model("nemotron-h-8b-base-8k")
    a, b = layer_costs(qn, s), layer_costs(qn, 4096)
    gdn = [i for i, c in enumerate(a) if c.mixer == "gdn"]
    att = [i for i, c in enumerate(a) if c.mixer == "attention"]
    assert all(a[i].attn_core == b[i].attn_core for i in gdn)
    q = _cfg("qwen3-next-80b-a3b-instruct")
    assert a[att[0]].attn_core == pytest.approx(2 * 2 * q["num_attention_heads"] * q["head_dim"] * s / 2)
    m0 = layer_costs(nh, s)[0]
    n = _cfg("nemotron-h-8b-base-8k")
    # megatron-core's 7 d N FLOPs of the scan (training.py mamba_layer_flops), whatever s
    assert m0.attn_core == pytest.approx(7 * n["mamba_num_heads"] * n["mamba_head_dim"] * n["ssm_state_size"])


@settings(max_examples=30, deadline=None)
@given(s=st.integers(min_value=2049, max_value=40000))
def test_dsa_attends_top_k_keys_and_the_indexer_scores_all(s):
    """DeepSeek sparse attention: the main attention's average keys per query is the brute-force mean of
    min(i, k) over positions i = 1..s (O(L*k)); the indexer scores s/2 keys per query at its width (O(L^2))."""
    v = _cfg("deepseek-v3.2-exp")
    k, H, dI = v["index_topk"], v["index_n_heads"], v["index_head_dim"]
    mean_keys = sum(min(i, k) for i in range(1, s + 1)) / s
    n_h, dqk, dv = v["num_attention_heads"], v["qk_nope_head_dim"] + v["qk_rope_head_dim"], v["v_head_dim"]
    core = layer_costs(_model("deepseek-v3.2-exp"), s)[0].attn_core
    assert core == pytest.approx(2 * (n_h * (dqk + dv) * mean_keys + H * (dI + 1) * s / 2), rel=1e-12)


def test_dsa_flops_by_hand_against_dense_deepseek_v3():
    """V3.2 minus the same file without the indexer (V3's dense MLA): the indexer's projections and scores
    less the keys each query skips, on every layer and the MTP layer, times 6 (training FLOPs)."""
    v = _cfg("deepseek-v3.2-exp")
    dense = {k: x for k, x in v.items() if not k.startswith("index_")}
    dense.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    s = 8192
    k, H, dI, h, qr = v["index_topk"], v["index_n_heads"], v["index_head_dim"], v["hidden_size"], v["q_lora_rank"]
    n_h, dqk, dv = v["num_attention_heads"], v["qk_nope_head_dim"] + v["qk_rope_head_dim"], v["v_head_dim"]
    skipped = s / 2 - (k - k * (k - 1) / (2 * s))
    per_layer = qr * H * dI + h * dI + h * H + H * (dI + 1) * s / 2 - n_h * (dqk + dv) * skipped
    layers = v["num_hidden_layers"] + v["num_nextn_predict_layers"]
    diff = flops_per_token(_model("deepseek-v3.2-exp"), s) - flops_per_token(spec_from_config(dense), s)
    assert diff == pytest.approx(6 * layers * per_layer, rel=1e-9)


def test_recurrent_mixers_saved_activations_by_hand():
    """A Nemotron-H Mamba block saves, per token (megatron-core's memory-efficient path: mamba_ssm keeps
    zxbcdt and out_x and recomputes the convolution and the states): its norm input, the in_proj input
    (bf16 here), the in_proj output, the scan output and the out_proj input; a Qwen3-Next GDN layer
    (fla's chunk_gated_delta_rule saves q, k, v, g, beta and the WY matrix A of 64 per token and value
    head) saves the in_proj input and output, the convolved q/k/v, A (bf16) with g and beta (fp32), the
    rule's output and the out_proj input. Neither grows with the sequence."""
    n = _cfg("nemotron-h-8b-base-8k")
    m = _model("nemotron-h-8b-base-8k")
    H, nh, hd, N, G = n["hidden_size"], n["mamba_num_heads"], n["mamba_head_dim"], n["ssm_state_size"], n["n_groups"]
    d = nh * hd
    cfg = ParallelConfig(tp=1, pp=1, mbs=1)
    for s in (4096, 32768):
        t = Training(seq_len=s, global_batch=64)
        saved, full = layer_activation_bytes(m, layer_costs(m, s)[0], cfg, t)
        assert saved == full == pytest.approx((H * 2 + H * 2 + (2 * d + 2 * G * N + nh) * 2 + d * 2 + d * 2) * s)
    # an MLP-only block saves no mixer tensors: norm, fc1 input, fc1 output, fc2 input (squared ReLU)
    F = n["intermediate_size"]
    t = Training(seq_len=4096, global_batch=64)
    saved, _ = layer_activation_bytes(m, layer_costs(m, 4096)[1], cfg, t)
    assert saved == pytest.approx((H * 2 + H * 2 + F * 2 + F * 2) * 4096)
    # Qwen3-Next: a GDN layer and an attention layer carry the same MoE terms, so their difference is the mixers'
    q = _cfg("qwen3-next-80b-a3b-instruct")
    qn = _model("qwen3-next-80b-a3b-instruct")
    h, nv = q["hidden_size"], q["linear_num_value_heads"]
    k, v = q["linear_num_key_heads"] * q["linear_key_head_dim"], nv * q["linear_value_head_dim"]
    gdn = h * 2 + (2 * k + 2 * v + 2 * nv) * 2 + (2 * k + v) * 2 + nv * (64 * 2 + 8) + v * 2 + v * 2
    nq, nkv, hdim = q["num_attention_heads"], q["num_key_value_heads"], q["head_dim"]
    attn = h * 2 + (nq * hdim + 2 * nkv * hdim + nq * hdim) * 2 + nq * hdim * 2 + nq * 4   # q, k, v, gate; o; stats
    costs = layer_costs(qn, 4096)
    i_g, i_a = costs[0], next(c for c in costs if c.mixer == "attention")
    diff = layer_activation_bytes(qn, i_g, cfg, t)[1] - layer_activation_bytes(qn, i_a, cfg, t)[1]
    assert diff == pytest.approx((gdn - attn) * 4096)


@pytest.fixture(scope="module")
def h100_64():
    return load_cluster("dgx-h100", gpus=64)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b-instruct", "nemotron-h-8b-base-8k", "nemotron-h-56b-base-8k",
                                  "nemotron-3-nano-30b-a3b"])
def test_each_hybrid_plans_on_64_h100(name, h100_64):
    m, t = _model(name), Training(seq_len=4096, global_batch=512)
    best = plan(m, h100_64, t, top=1).plans[0]
    assert best.prediction.fits and best.prediction.step_time_s > 0
    assert not violations(m, best.config, t, best.prediction.world)


@pytest.mark.slow   # two 671B solves (4.4 s); the quick loop's sibling: test_optimizer_offload's Llama 3 70B on 8 H100
def test_deepseek_v32_fits_64_h100_only_with_the_optimizer_offload(h100_64):
    # by hand: 671.9e9 parameters; weights (2 B) and gradients (2 B) are held at least once and the fp32
    # master weights and Adam moments (12 B) are sharded over the job: 16 B/param / 64 GPUs = 168 GB > 80 GB;
    # with the optimizer state on the host, 4 B/param / 64 = 42 GB
    m = _model("deepseek-v3.2-exp")
    assert param_counts(m).total * 16 / 64 > 80e9 > param_counts(m).total * 4 / 64
    with pytest.raises(InfeasibleError, match="no layout fits"):
        plan(m, h100_64, Training(seq_len=4096, global_batch=512, recipe={"optimizer_offload_fraction": 0.0}), top=1)
    res = plan(m, h100_64, Training(seq_len=4096, global_batch=512), top=1)
    assert res.training.recipe.optimizer_offload_fraction == 1.0 and res.plans[0].prediction.fits
    assert res.plans[0].prediction.breakdown["cpu_optimizer"] > 0


@pytest.mark.parametrize("name, trainer, words", [
    ("qwen3-next-80b-a3b-instruct", "torchtitan", "Gated DeltaNet"),
    ("nemotron-h-8b-base-8k", "torchtitan", "Mamba-2"),
    ("deepseek-v3.2-exp", "torchtitan", "sparse attention"),
    ("nemotron-3-nano-30b-a3b", "maxtext", "Mamba-2"),
    ("deepseek-v3.2-exp", "maxtext", "reduced test shape"),
])
def test_a_trainer_without_the_mixer_refuses_in_one_line(name, trainer, words):
    m = _model(name)
    with pytest.raises(InputError) as exc:
        check_family(m, trainer, 4096)
    msg = str(exc.value)
    assert "\n" not in msg and words in msg and m.family in msg and f"--trainer {trainer}" in msg


def test_maxtext_runs_qwen3_next_as_its_own_model_or_as_keys_of_its_block(tmp_path):
    doc = plan_doc(str(CONFIGS / "qwen3-next-80b-a3b-instruct" / "config.json"), hgx_cluster("h100", 1),
                   ParallelConfig(tp=1, pp=1, ep=8), Training(seq_len=4096, global_batch=64, trainer="maxtext"))
    text = render_files(load_context(doc), ["maxtext"])["maxtext/overrides.yml"]
    assert "model_name: qwen3-next-80b-a3b" in text
    # another shape of the family: MaxText's qwen3_next block with the config's keys (test_maxtext_model_keys.py)
    cfg = dict(_cfg("qwen3-next-80b-a3b-instruct"), num_hidden_layers=24)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    doc = plan_doc(str(p), hgx_cluster("h100", 1), ParallelConfig(tp=1, pp=1, ep=8),
                   Training(seq_len=4096, global_batch=64, trainer="maxtext"))
    lines = render_files(load_context(doc), ["maxtext"])["maxtext/overrides.yml"].splitlines()
    assert "decoder_block: qwen3_next" in lines and "base_num_decoder_layers: 24" in lines
    assert not any(x.startswith("model_name:") for x in lines)
    # full attention not last in each cycle of 4: MaxText's block cannot place it
    cfg = dict(_cfg("qwen3-next-80b-a3b-instruct"),
               layer_types=(["full_attention"] + ["linear_attention"] * 3) * 12)
    with pytest.raises(InputError, match="layer_types"):
        check_family(spec_from_config(cfg), "maxtext", 4096)


@pytest.mark.parametrize("name, change, field", [
    ("nemotron-h-8b-base-8k", {"hybrid_override_pattern": "M-X*"}, "hybrid_override_pattern"),
    ("nemotron-h-8b-base-8k", {"num_hidden_layers": 50}, "hybrid_override_pattern"),
    ("nemotron-h-8b-base-8k", {"mamba_num_heads": None}, "mamba_num_heads"),
    ("nemotron-h-8b-base-8k", {"ssm_state_size": 0}, "ssm_state_size"),
    ("qwen3-next-80b-a3b-instruct", {"layer_types": ["linear_attention", "sliding"]}, "layer_types"),
    ("qwen3-next-80b-a3b-instruct", {"linear_num_value_heads": 24}, "linear_num_value_heads"),
    ("qwen3-next-80b-a3b-instruct", {"full_attention_interval": "4"}, "full_attention_interval"),
    ("deepseek-v3.2-exp", {"index_topk": -1}, "index_topk"),
    ("deepseek-v3.2-exp", {"q_lora_rank": None}, "q_lora_rank"),
])
def test_a_bad_hybrid_field_is_named(name, change, field):
    cfg = dict(_cfg(name), **change)
    with pytest.raises(InputError, match=rf"field '{field}'"):
        spec_from_config(cfg, source="config.json")


def test_gdn_and_mamba_heads_must_divide_tp_cp():
    """megatron-core splits GDN key/value heads over tp*cp (transformer_config.py) and Mamba heads over
    tp*cp, groups over tp (mamba_mixer.py, mamba_context_parallel.py): 16 key heads refuse tp*cp = 32;
    Nemotron-H's 8 groups refuse tp = 16."""
    t = Training(seq_len=4096, global_batch=64)
    qn, nh = _model("qwen3-next-80b-a3b-instruct"), _model("nemotron-h-8b-base-8k")
    assert not [v for v in violations(qn, ParallelConfig(tp=2, cp=8, ep=1), t, 64) if v.rule.startswith("mixer")]
    bad = [v.message for v in violations(qn, ParallelConfig(tp=4, cp=8), t, 64) if v.rule.startswith("mixer")]
    assert bad and "linear_num_key_heads=16" in bad[0]
    assert [v for v in violations(nh, ParallelConfig(tp=16, cp=1), t, 64) if v.rule.startswith("mixer")]


HYBRIDS = sorted({p[0] for p in PUBLISHED})


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(HYBRIDS), st.data())
def test_any_bad_hybrid_field_is_a_one_line_input_error_never_a_crash(name, data):
    load_with_one_junk_field(_cfg(name), data)


@pytest.mark.parametrize("name, script", [("nemotron-h-8b-base-8k", "pretrain_hybrid.py"),
                                          ("qwen3-next-80b-a3b-instruct", "pretrain_gpt.py"),
                                          ("deepseek-v3.2-exp", "pretrain_gpt.py")])
def test_the_slurm_task_starts_megatrons_script_for_the_model(name, script):
    """Megatron-LM builds a Mamba hybrid layer pattern with pretrain_hybrid.py (HybridModel) and the
    experimental attention variants with pretrain_gpt.py (GPTModel)."""
    m = _model(name)
    doc = plan_doc(str(CONFIGS / name / "config.json"), hgx_cluster("h100", 1),
                   ParallelConfig(tp=1, pp=1, ep=8 if m.num_experts else 1), Training(seq_len=4096, global_batch=64))
    files = render_files(load_context(doc), ["megatron", "slurm"])
    assert f"/{script}\"" in files["slurm/task.sh"]
    assert script in files["megatron/env.sh"].splitlines()[0]


@pytest.mark.parametrize("name, flag, value", [
    ("qwen3-next-80b-a3b-instruct", "--linear-num-value-heads", "16"),
    ("qwen3-next-80b-a3b-instruct", "--attention-output-gate", None),
    ("deepseek-v3.2-exp", "--dsa-indexer-topk", "1024"),
    ("nemotron-h-8b-base-8k", "--mamba-state-dim", "64"),
])
def test_read_back_refuses_args_with_other_mixers(name, flag, value):
    """``predict --from megatron/args.txt`` prices the files only when they build this model's mixers: a changed
    width or a dropped flag names the flag."""
    from planner.trainers.megatron.emit import megatron_args
    from planner.trainers.megatron.readback import megatron_setup

    m = _model(name)
    doc = plan_doc(str(CONFIGS / name / "config.json"), hgx_cluster("h100", 1),
                   ParallelConfig(tp=1, pp=1, ep=8 if m.num_experts else 1), Training(seq_len=4096, global_batch=64))
    args = megatron_args(load_context(doc))
    megatron_setup(args, m, 8)                              # as written: read back
    i = args.index(flag)
    bad = args[:i] + args[i + 1:] if value is None else args[:i + 1] + [value] + args[i + 2:]
    with pytest.raises(InputError, match=rf"{flag} is .* but --model"):
        megatron_setup(bad, m, 8)
