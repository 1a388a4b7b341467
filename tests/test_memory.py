"""Memory per GPU: hand-computed cases (arithmetic written out), monotonicity properties, and
published reality (NVIDIA's DeepSeek-V3 runs fit; DeepSeek-V3 on 64 H100 does not; every run in
calibration.csv fits with its recompute setting or the cheapest one that fits).

calibration.csv: planner/data/profiles/calibration.csv (NVIDIA's published Megatron-Bridge runs).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.cost.memory import (
    GIB,
    MemoryOptions,
    inflight_compositions,
    inflight_per_chunk,
    memory_per_gpu,
)
from planner.cost.profiles import CALIBRATION_CSV
from planner.model.spec import ModelSpec, load_model
from topologies.gpus import get_gpu

DS = load_model("deepseek-v3")

TINY = ModelSpec(
    name="tiny", family="llama", num_layers=2, hidden_size=1024, vocab_size=32000, num_attention_heads=8,
    num_kv_heads=8, head_dim=128, ffn_hidden_size=4096, gated_mlp=True,
)


def test_tiny_dense_model_by_hand():
    cfg = ParallelConfig(tp=1, pp=1, mbs=1, dp=1)
    tr = Training(seq_len=1024, global_batch=1, precision="bf16")
    est = memory_per_gpu(TINY, cfg, tr, world=1, gpu_spec=None)
    # parameters: embedding + untied head 2*32000*1024, per layer attention 4*1024^2, gated MLP
    # 3*1024*4096, two norms 2*1024; final norm 1024
    P = 2 * 32000 * 1024 + 2 * (4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024) + 1024
    assert P == 99_095_552
    c = est.components
    assert c["weights"] * GIB == pytest.approx(2 * P)           # bf16
    assert c["grads"] * GIB == pytest.approx(2 * P)             # bf16 grads (Megatron perf recipes)
    assert c["optimizer"] * GIB == pytest.approx(12 * P)        # fp32 master + 2 fp32 moments, dp = 1
    assert c["weight_copies"] == 0
    # activations per token per layer (bytes): norms 2*1024*2 = 4096; QKV input 1024*2 = 2048;
    # q,k,v (1024 + 2*1024)*2 = 6144; o-proj input 1024*2 + softmax stats 8*4 = 2080;
    # MLP input 2048; fc1 output 2*4096*2 + fc2 input 4096*2 = 24576  -> 40992
    per_token_layer = 4096 + 2048 + 6144 + 2080 + 2048 + 24576
    acts = per_token_layer * 1024 * 2                            # 1024 tokens, 2 layers, 1 micro-batch
    assert c["activations"] * GIB == pytest.approx(acts)
    # loss stage: logits bf16 + fp32 softmax, 6 B per vocab entry per token; final-norm and head inputs
    logits = 1024 * 32000 * 6 + 1024 * 1024 * 2 + 1024 * 1024 * 2
    assert c["logits"] * GIB == pytest.approx(logits)
    reserve = 3 * GIB + 0.05 * (acts + logits)
    assert c["reserve"] * GIB == pytest.approx(reserve)
    # CUDA graphs (on by default): one static hidden-state buffer per layer and micro-batch in flight,
    # 1024 tokens x 1024 x 2 B x 2 layers (issue 11: the new component, added to the total)
    graphs = 1024 * 1024 * 2 * 2
    assert c["cuda_graphs"] * GIB == pytest.approx(graphs)
    assert est.peak_gib * GIB == pytest.approx(16 * P + acts + logits + reserve + graphs)


def test_matches_korthikanti_for_a_gpt_layer():
    # Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
    # bytes per layer: s*b*h*(34 + 5*a*s/h), with tensor+sequence parallelism all divided by t.
    # A fused stack keeps no s x s scores (the 5as^2b term) and no dropout masks (2 sbh: one in
    # attention, one after the MLP), leaving 32 sbh/t; flash attention adds its softmax
    # statistics, 4 B per head per token. Full recompute keeps 2 sbh/t per layer.
    h, a, s, b, t = 2048, 16, 2048, 2, 4
    gpt = ModelSpec(name="gpt", family="gpt", num_layers=4, hidden_size=h, vocab_size=50304,
                    num_attention_heads=a, num_kv_heads=a, head_dim=h // a, ffn_hidden_size=4 * h,
                    gated_mlp=False, activation="gelu")
    tr = Training(seq_len=s, global_batch=b, precision="bf16")
    est = memory_per_gpu(gpt, ParallelConfig(tp=t, mbs=b, dp=1), tr, t, None)
    korthikanti = 34 * s * b * h / t - 2 * s * b * h / t
    lse = a * 4 / t * s * b
    assert est.components["activations"] * GIB == pytest.approx(4 * (korthikanti + lse))
    full = memory_per_gpu(gpt, ParallelConfig(tp=t, mbs=b, dp=1, recompute="full"), tr, t, None)
    assert full.components["activations"] * GIB == pytest.approx(4 * 2 * s * b * h / t + (korthikanti + lse))


def test_recompute_and_precision_by_hand():
    tr8 = Training(seq_len=1024, global_batch=1, precision="mxfp8")
    base = memory_per_gpu(TINY, ParallelConfig(dp=1), tr8, 1, None)
    # quantised copies: row- and column-wise MXFP8, (1 + 1/32) B each, on the 2 layers' linear weights
    linear = 2 * (4 * 1024 * 1024 + 3 * 1024 * 4096)
    assert base.components["weight_copies"] * GIB == pytest.approx(2 * (1 + 1 / 32) * linear)
    q = 1 + 1 / 32
    # saved GEMM inputs shrink to q bytes: QKV in, o-proj in, fc1 in, fc2 in
    per_tok = 4096 + 1024 * q + 6144 + (1024 * q + 32) + 1024 * q + (2 * 4096 * 2 + 4096 * q)
    assert base.components["activations"] * GIB == pytest.approx(per_tok * 1024 * 2)
    # selective "mlp" drops fc1 output and fc2 input
    mlp = memory_per_gpu(TINY, ParallelConfig(dp=1, recompute="mlp"), tr8, 1, None)
    assert (base.components["activations"] - mlp.components["activations"]) * GIB == pytest.approx(
        (2 * 4096 * 2 + 4096 * q) * 1024 * 2)
    # full: each layer keeps its input (1024*2 B per token) + one layer recomputed in backward
    full = memory_per_gpu(TINY, ParallelConfig(dp=1, recompute="full"), tr8, 1, None)
    assert full.components["activations"] * GIB == pytest.approx(1024 * 2 * 1024 * 2 + per_tok * 1024)


def test_deepseek_h100_recipe_rank_by_hand():
    # 256 H100, TP2 PP8 EP32 ETP1, full recompute, MBS1, seq 4096, GBS 4096, bf16:
    # dp = 256/(2*8) = 16, edp = 256/(1*32*8) = 1, micro-batches M = 4096/16 = 256.
    cfg = ParallelConfig(tp=2, pp=8, ep=32, etp=1, mbs=1, recompute="full")
    tr = Training(seq_len=4096, global_batch=4096, precision="bf16")
    est = memory_per_gpu(DS, cfg, tr, 256, get_gpu("h100"))
    r1 = est.per_stage[1]  # rank 1: layers 8-15, all MoE (layout Et*8|(t*8|)*6t*5mL)
    assert r1.layers == 8 and r1.inflight == (7,)  # 1F1B: pp - rank
    h = 7168
    experts = 8 * (256 // 32) * 3 * h * 2048                     # 8 layers x 8 local experts, ETP1
    dup = h * 1536 + 1536 + h * (512 + 64) + 512                 # MLA down-projections + latent norms
    attn = (h * 1536 + 1536 + 1536 * 128 * 192) + (h * 576 + 512 + 512 * 128 * 256) + 128 * 128 * h
    dense_layer = dup + (attn - dup) / 2 + 3 * h * 2048 / 2 + 2 * h + 256 * h   # shared / TP, norms, router
    dense = 8 * dense_layer
    assert r1.weights * GIB == pytest.approx(2 * (dense + experts))
    assert r1.grads * GIB == pytest.approx(2 * (dense + experts))
    assert r1.optimizer * GIB == pytest.approx(12 * (dense / 16 + experts / 1))
    # full recompute: 8 layers x 7 micro-batches of layer inputs 4096*7168*2/2 B, plus one layer
    layer_inputs = 8 * 7 * 4096 * h * 2 / 2
    assert r1.activations * GIB > layer_inputs
    assert r1.activations * GIB - layer_inputs < 3 * GIB          # the recomputed layer's working set
    assert est.fits(80.0)


@pytest.mark.parametrize(
    "pp, vpp, rank, m, expected",
    [
        (4, 1, 0, 64, [4]), (4, 1, 3, 64, [1]), (4, 1, 0, 2, [2]),       # 1F1B: min(pp - r, M)
        (1, 1, 0, 64, [1]),
        # interleaved: warm-up (pp-r-1)*2 + (vpp-1)*pp, +1; chunk of virtual micro-batch k = (k//pp) % vpp
        (2, 8, 0, 256, [3, 2, 2, 2, 2, 2, 2, 2]),                        # 16 + 1 = 17
        (2, 8, 1, 256, [2, 2, 2, 2, 2, 2, 2, 1]),                        # 14 + 1 = 15
        (4, 2, 0, 64, [7, 4]),                                           # 6 + 4 + 1 = 11: chunks 0000 1111 000
        (4, 2, 3, 64, [4, 1]),                                           # 0 + 4 + 1 = 5
        (4, 2, 0, 2, [2, 2]),                                            # capped at M*vpp = 4
    ],
)
def test_inflight_micro_batches(pp, vpp, rank, m, expected):
    assert inflight_per_chunk(pp, vpp, rank, m) == expected


def test_interleaved_schedule_compositions_by_hand():
    # PP4 VPP2, rank 0, 64 micro-batches: warm-up (4-0-1)*2 + (2-1)*4 = 10 forwards run chunks
    # 0000 1111 00 -> (6, 4). Steady state: forward 10 (chunk 0) -> (7, 4), backward 0 (chunk 1)
    # -> (7, 3); forward 11 (chunk 0) -> (8, 3), backward 1 (chunk 1) -> (8, 2); forward 12
    # (chunk 1) -> (8, 3) ... so the peaks are (7, 4) and (8, 3).
    assert set(inflight_compositions(4, 2, 0, 64)) == {(7, 4), (8, 3)}
    # 1F1B and no pipeline: one vector
    assert inflight_compositions(8, 1, 2, 64) == ((6,),)
    assert inflight_compositions(1, 1, 0, 64) == ((1,),)


@pytest.mark.parametrize("pp, vpp, m", [(2, 8, 256), (4, 2, 64), (4, 4, 64), (8, 4, 64), (8, 2, 24), (4, 4, 4)])
def test_schedule_simulation_agrees_with_the_warmup_count(pp, vpp, m):
    # The most live micro-batches the simulation sees equals Megatron's warm-up + 1 (capped).
    for r in range(pp):
        peak = max(sum(v) for v in inflight_compositions(pp, vpp, r, m))
        assert peak == sum(inflight_per_chunk(pp, vpp, r, m)), r


# ----- monotonicity (degrees grow with dp fixed, so the world grows with them) ----------------

MODELS = ["llama3-8b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b"]


def _peak(name, precision="bf16", **kw):
    m = load_model(name)
    cfg = ParallelConfig(**kw)
    world = cfg.tp * cfg.cp * cfg.pp * cfg.dp
    tr = Training(seq_len=4096, global_batch=4096, precision=precision)
    return memory_per_gpu(m, cfg, tr, world, None)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(MODELS), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       ep=st.sampled_from([1, 2, 4, 8]), mbs=st.sampled_from([1, 2]),
       rc=st.sampled_from(["none", "core_attn", "moe_act", "full"]),
       prec=st.sampled_from(["bf16", "fp8", "mxfp8", "nvfp4"]))
def test_more_tp_or_ep_never_increases_memory(name, tp, pp, ep, mbs, rc, prec):
    m = load_model(name)
    ep = ep if m.is_moe else 1
    kw = dict(pp=pp, mbs=mbs, recompute=rc, dp=8)
    a = _peak(name, prec, tp=tp, ep=ep, **kw).peak_gib
    assert _peak(name, prec, tp=2 * tp, ep=ep, **kw).peak_gib <= a + 1e-9
    world = tp * pp * 8
    if m.is_moe and m.num_experts % (2 * ep) == 0 and world % (tp * 2 * ep * pp) == 0:  # a valid EP grid
        assert _peak(name, prec, tp=tp, ep=2 * ep, **kw).peak_gib <= a + 1e-9


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(MODELS), tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4, 8]),
       vpp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2, 4]),
       base=st.sets(st.sampled_from(["core_attn", "mlp", "moe", "moe_act", "layernorm", "shared_experts", "mla_up_proj"])),
       extra=st.sampled_from(["core_attn", "mlp", "moe", "moe_act", "layernorm", "shared_experts", "mla_up_proj"]))
def test_more_recompute_never_increases_and_more_mbs_never_decreases(name, tp, pp, vpp, mbs, base, extra):
    vpp = vpp if pp > 1 else 1
    ep = 8 if load_model(name).is_moe else 1
    kw = dict(tp=tp, pp=pp, vpp=vpp, ep=ep, dp=4)
    r1 = "+".join(sorted(base)) or "none"
    r2 = "+".join(sorted(base | {extra}))
    m1 = _peak(name, mbs=mbs, recompute=r1, **kw).peak_gib
    assert _peak(name, mbs=mbs, recompute=r2, **kw).peak_gib <= m1 + 1e-9
    none = _peak(name, mbs=mbs, recompute="none", **kw).peak_gib
    assert _peak(name, mbs=mbs, recompute="full", **kw).peak_gib <= none
    # GBS 4096 over dp 4 leaves >= 128 micro-batches, so every rank's pipeline stays full
    assert _peak(name, mbs=2 * mbs, recompute=r1, **kw).peak_gib >= m1


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(MODELS), pp=st.sampled_from([1, 2, 3, 4, 6, 8]), prec=st.sampled_from(["bf16", "mxfp8"]))
def test_more_pp_never_increases_model_state(name, pp, prec):
    # Model state (weights, copies, grads, optimizer) per GPU only falls with PP. The activation
    # peak need not: under 1F1B rank 0 holds pp micro-batches of its ceil-rounded share of layers.
    def state(p):
        est = _peak(name, prec, tp=1, pp=p, ep=8 if load_model(name).is_moe else 1, dp=4)
        return max(r.weights + r.weight_copies + r.grads + r.optimizer for r in est.per_stage)

    assert state(2 * pp) <= state(pp) + 1e-9


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_more_pp_never_increases_peak_when_layers_divide(name):
    # pp | num_layers: doubling pp halves every rank's layers, so rank 0's 1F1B activations stay
    # pp * L/pp and the state halves.
    m = load_model(name)
    pps = [p for p in (1, 2, 4, 8, 16) if m.num_layers % p == 0]
    peaks = [_peak(name, tp=1, pp=p, ep=8 if m.is_moe else 1, dp=4, mbs=1).peak_gib for p in pps]
    assert all(b <= a + 1e-9 for a, b in zip(peaks, peaks[1:])), list(zip(pps, peaks))


# ----- published reality ------------------------------------------------------------------

def test_nvidia_deepseek_v3_runs_fit():
    # Megatron-Bridge 26.08: DeepSeek-V3 on 256 GB300, TP1 PP2 VPP8 EP32 MXFP8 MBS1, no recompute
    gb300 = get_gpu("gb300")
    tr = Training(seq_len=4096, global_batch=4096, precision="mxfp8")
    est = memory_per_gpu(DS, ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1), tr, 256, gb300)
    assert est.fits(gb300.hbm_gib), est.to_dict()
    # Megatron-Bridge recipe on 256 H100: TP2 PP8 EP32 ETP1, full recompute, bf16
    h100 = get_gpu("h100")
    tr = Training(seq_len=4096, global_batch=4096, precision="bf16")
    est = memory_per_gpu(DS, ParallelConfig(tp=2, pp=8, ep=32, etp=1, mbs=1, recompute="full"), tr, 256, h100)
    assert est.fits(h100.hbm_gib), est.to_dict()
    # and without recompute the same H100 layout does not fit (why the recipe recomputes)
    est = memory_per_gpu(DS, ParallelConfig(tp=2, pp=8, ep=32, etp=1, mbs=1), tr, 256, h100)
    assert not est.fits(h100.hbm_gib)


def test_deepseek_v3_never_fits_on_64_h100():
    # 671B + MTP x (2 weights + 2 grads + 12 optimizer) B spread over 64 GPUs is ~170 GiB each at
    # best: no layout, recompute or FSDP brings it under 80 GB.
    h100 = get_gpu("h100")
    tr = Training(seq_len=4096, global_batch=1024, precision="fp8")
    tried = 0
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16):
            for ep in (1, 2, 4, 8, 16, 32, 64):
                if 64 % (tp * pp) or 64 % (ep * tp * pp) or 256 % ep:
                    continue
                for fsdp in (False, True):
                    cfg = ParallelConfig(tp=tp, pp=pp, ep=ep, mbs=1, recompute="full", fsdp=fsdp)
                    est = memory_per_gpu(DS, cfg, tr, 64, h100)
                    assert not est.fits(h100.hbm_gib), cfg.short()
                    assert est.peak_gib > 120
                    tried += 1
    assert tried > 30


LADDER = ("none", "moe_act", "layernorm+moe_act", "mla_up_proj+moe_act", "core_attn", "mlp", "core_attn+mlp",
          "moe", "full")


def test_every_published_run_fits():
    rows = list(csv.DictReader(CALIBRATION_CSV.open()))
    assert len(rows) >= 30
    for row in rows:
        m = load_model(row["model"])
        gpu = get_gpu(row["gpu"])
        tr = Training(seq_len=int(row["seq_len"]), global_batch=int(row["gbs"]), precision=row["precision"])
        given_rc = row["recompute"].split(" ")[0] if row["recompute"] else None
        fits = False
        for rc in [given_rc] if given_rc else LADDER:
            cfg = ParallelConfig(
                tp=int(row["tp"]), pp=int(row["pp"]), vpp=int(row["vpp"] or 1), cp=int(row["cp"] or 1),
                ep=int(row["ep"] or 1), etp=int(row["etp"]) if row["etp"] else None, mbs=int(row["mbs"]),
                fsdp=bool(row["fsdp"]) and row["fsdp"] != "0", recompute=rc)
            if memory_per_gpu(m, cfg, tr, int(row["num_gpus"]), gpu).fits(gpu.hbm_gib):
                fits = True
                break
        assert fits, row["id"]


def test_layout_must_match_the_config():
    from planner.errors import InputError
    from planner.model.pipeline import pipeline_layout

    tr = Training(seq_len=4096, global_batch=4096, precision="bf16")
    with pytest.raises(InputError, match="pp=4 vpp=1 but the config has pp=8"):
        memory_per_gpu(DS, ParallelConfig(pp=8, ep=8), tr, 64, None, layout=pipeline_layout(DS, 4))
    custom = pipeline_layout(DS, 8, pp_first=4, pp_last=7)
    est = memory_per_gpu(DS, ParallelConfig(pp=8, ep=8), tr, 64, None, layout=custom)
    assert est.per_stage[0].layers == 4 and est.per_stage[-1].layers == 7


def test_options_and_report_shape():
    tr = Training(seq_len=4096, global_batch=4096, precision="bf16")
    cfg = ParallelConfig(tp=2, pp=8, ep=32, etp=1, recompute="full")
    bf16 = memory_per_gpu(DS, cfg, tr, 256, None)
    fp32 = memory_per_gpu(DS, cfg, tr, 256, None, options=MemoryOptions(grad_bytes=4.0))
    r = bf16.worst_rank
    assert fp32.per_stage[r].grads == pytest.approx(2 * bf16.per_stage[r].grads)
    d = bf16.to_dict()
    assert set(d) == {"peak_gib", "worst_rank", "components", "per_stage"} and len(d["per_stage"]) == 8
    assert sum(bf16.components.values()) == pytest.approx(bf16.peak_gib)
    # the last rank carries the logits of both heads (main + MTP)
    assert bf16.per_stage[-1].logits > 0 and all(x.logits == 0 for x in bf16.per_stage[:-1])


# ----- issue 11 item 6: CUDA-graph buffers, expert imbalance, headroom ----------------------------

def test_cuda_graph_buffers_by_hand():
    # Llama3-8B, no PP: one micro-batch in flight; 32 layers x one static hidden buffer each,
    # T*h*2/(tp*cp) = 4096 * 4096 * 2 B = 32 MiB -> 32 x 32 MiB = 1 GiB exactly.
    m = load_model("llama3-8b")
    cfg = ParallelConfig(tp=1, pp=1, mbs=1, dp=8)
    on = memory_per_gpu(m, cfg, Training(seq_len=4096, global_batch=64, cuda_graphs=True), 8)
    off = memory_per_gpu(m, cfg, Training(seq_len=4096, global_batch=64, cuda_graphs=False), 8)
    assert on.components["cuda_graphs"] == pytest.approx(32 * 4096 * 4096 * 2 / GIB)
    assert on.components["cuda_graphs"] == pytest.approx(1.0)
    assert off.components["cuda_graphs"] == 0.0
    assert on.peak_gib - off.peak_gib == pytest.approx(1.0)
    # TP2 halves it (sequence parallel), and other trainers capture no such graphs
    half = memory_per_gpu(m, cfg.model_copy(update={"tp": 2, "dp": 4}),
                          Training(seq_len=4096, global_batch=64), 8)
    assert half.components["cuda_graphs"] == pytest.approx(0.5)
    tt = memory_per_gpu(m, cfg, Training(seq_len=4096, global_batch=64, trainer="torchtitan",
                                         stack="torchtitan"), 8)
    assert tt.components["cuda_graphs"] == 0.0


def test_cuda_graph_buffers_follow_the_microbatches_in_flight():
    # 1F1B PP4: rank 0 holds min(pp, M) = 4 micro-batches of its 8 layers -> 32 buffers
    m = load_model("llama3-8b")
    cfg = ParallelConfig(tp=1, pp=4, mbs=1, dp=2)
    est = memory_per_gpu(m, cfg, Training(seq_len=4096, global_batch=64), 8)
    r0 = est.per_stage[0]
    assert r0.inflight == (4,)
    assert r0.cuda_graphs == pytest.approx(4 * 8 * 4096 * 4096 * 2 / GIB)


def test_expert_imbalance_scales_the_routed_activations():
    # Qwen3-30B-A3B, EP8, no PP: the busiest expert GPU holds (balance - 1) x the routed copies more
    from planner.cost.memory import routed_activation_bytes
    from planner.model.flops import layer_costs

    m = load_model("qwen3-30b-a3b")
    tr = Training(seq_len=4096, global_batch=64, precision="bf16")
    cfg = ParallelConfig(tp=1, pp=1, ep=8, mbs=1, dp=8)
    base = memory_per_gpu(m, cfg, tr, 8)
    est = memory_per_gpu(m, cfg, tr, 8, expert_balance=1.25)
    moe = [c for c in layer_costs(m, 4096) if c.kind == "decoder" and c.is_moe]
    # routed copies per token: top_k * (h*2 + 4 + (2F*2 + F*2)) bytes (balanced), by hand
    h, f, k = m.hidden_size, m.moe_ffn_hidden_size, m.top_k
    per_layer = 4096 * k * (h * 2 + 4 + 2 * f * 2 + f * 2)
    assert routed_activation_bytes(m, moe[0], cfg, tr) == pytest.approx(per_layer)
    assert base.components["expert_imbalance"] == 0.0
    assert est.components["expert_imbalance"] == pytest.approx(0.25 * len(moe) * per_layer / GIB)
    assert est.peak_gib > base.peak_gib
    # recomputing the whole MoE block keeps no routed activations to scale
    rc = memory_per_gpu(m, cfg.model_copy(update={"recompute": "moe"}), tr, 8, expert_balance=1.25)
    assert rc.components["expert_imbalance"] == 0.0


@pytest.mark.parametrize("text,hbm,gib", [("5%", 288.0, 14.4), ("8GiB", 80.0, 8.0), ("5%,4GiB", 80.0, 4.0),
                                          ("5%,4GiB", 288.0, 14.4), ("0", 80.0, 0.0), ("10 %, 2 GB", 80.0, 8.0)])
def test_memory_headroom_is_the_larger_of_share_and_gib(text, hbm, gib):
    from planner.cost.memory import usable_hbm_gib

    tr = Training(global_batch=8, memory_headroom=text)
    assert tr.headroom_gib(hbm) == pytest.approx(gib)
    assert usable_hbm_gib(hbm, tr) == pytest.approx(hbm - gib)


@pytest.mark.parametrize("text", ["abc", "5", "-1GiB", "120%", ""])
def test_bad_memory_headroom_is_refused(text):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="memory headroom|memory_headroom"):
        Training(global_batch=8, memory_headroom=text)


def test_a_measured_run_is_not_refused_on_an_assumed_graph_regime():
    # Llama 3.1 405B on 256 GB200 (Megatron-Bridge 26.04/26.08, TP4 PP16 VPP4, recompute not
    # published, recipe sets no cuda_graph_impl): 195 GiB with the CUDA-graph buffers, 185.5 without,
    # both with BF16 weights (fp8_param_gather false: the FP8 parameters NVIDIA ran leave room for both).
    from planner.calibration.validate import fits_as_run, predict_case, row_case

    row = {"id": "l405", "stack": "megatron-26.08", "model": "llama3.1-405b", "gpu": "GB200", "num_gpus": "256",
           "precision": "fp8", "seq_len": "8192", "gbs": "1536", "mbs": "1", "tp": "4", "pp": "16", "vpp": "4",
           "fp8_param_gather": "false"}
    case = row_case(dict(row))
    p = predict_case(case)
    assert p.config.recompute == "none" and fits_as_run(p, case)
    assert not p.fits and p.memory["cuda_graphs"] > p.memory_gib_per_gpu - p.hbm_gib
    # a row that says graphs were on is held to the buffers: the cheapest recompute that fits with them
    stated = row_case(dict(row, cuda_graphs="true"))
    q = predict_case(stated)
    assert q.config.recompute != "none" and q.fits and fits_as_run(q, stated)
