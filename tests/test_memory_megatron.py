"""Memory per GPU against megatron-core's own arithmetic (``megatron/training/theoretical_memory_usage.py``,
megatron-core 0.19.2), on the arguments topoplan emits (``planner.trainers.megatron.emit.megatron_args``),
parsed by megatron's own ``parse_args`` / ``validate_args`` (tests/trainers/megatron_memory.py).

**Model state** (weights, gradients, optimizer): for every layout of the grid and every pipeline rank,
topoplan's figure equals megatron's ``compute_weight_and_optimizer_memory`` plus a list of named
adjustments, each a closed formula written here with its reason (no adjustment is read from
planner.cost.memory). The sum is asserted to 1e-9, and each adjustment is asserted to be non-zero
exactly where its reason applies, so the test fails when either side changes. First, a hand replica of
megatron's function (``mcore_state``) is asserted equal to megatron's value, so the adjustments start
from megatron's own accounting.

**Activations**: for dense models with sequence parallelism and selective recompute of the core
attention (the case ``report_theoretical_memory`` prices with ``compute_activation_memory``), topoplan's
activations + logits of pipeline rank 0 equal megatron's figure plus named per-token adjustments
(Korthikanti et al. 2022 Table 2 written for a GPT with dropout and MHA; topoplan's terms for a fused,
dropout-free, GQA, SwiGLU stack). Full recompute and no recompute: megatron prices both with its
no-SP selective formula (recompute is ignored); MoE: megatron prices every layer as a dense MLP of
``--ffn-hidden-size``. Both facts are asserted. ``python -m pytest tests/test_memory_megatron.py -m trainers
-s`` prints the tables of docs/memory.md ("Against Megatron's own arithmetic").
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.config import ParallelConfig, Training
from planner.cost.memory import GIB, WEIGHT_COPY_BYTES, memory_per_gpu, options_for
from planner.model.pipeline import pipeline_layout
from planner.model.spec import load_model
from planner.output.emit import load_context
from planner.trainers.megatron.emit import megatron_args, megatron_env
from trainers.plans import hgx_cluster, plan_doc

pytestmark = pytest.mark.trainers

HARNESS = Path(__file__).resolve().parent / "trainers" / "megatron_memory.py"
REL = 1e-9


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    world: int
    config: dict
    precision: str = "bf16"
    dist_opt: bool = True        # False: --use-distributed-optimizer dropped from the arguments
    topk: int | None = None      # --moe-router-topk replaced (activation check of MoE models)


def _c(model, world, precision="bf16", dist_opt=True, topk=None, **cfg) -> Case:
    cfg.setdefault("mbs", 1)
    cfg.setdefault("recompute", "core_attn")
    short = ParallelConfig(**cfg).short().replace(" MBS1", "").replace(" RC:core_attn", "")
    if cfg["recompute"] == "none":
        short += " RC:none"
    tag = ("" if dist_opt else " no-dist-opt") + ("" if precision == "bf16" else f" {precision}") + (
        f" topk{topk}" if topk else "")
    return Case(f"{model} {world}: {short}{tag}", model, world, cfg, precision, dist_opt, topk)


# Model state: dense and MoE models of the catalog, TP 1/2/4/8, PP 1/2/4 (VPP), EP, CP, the distributed
# optimizer on and off, FSDP, fp8.
STATE = [
    _c("llama3-8b", 8, tp=1, pp=1),
    _c("llama3-8b", 8, tp=2, pp=1),
    _c("llama3-8b", 8, tp=2, pp=1, dist_opt=False),
    _c("llama3-8b", 16, tp=2, pp=2),
    _c("llama3-8b", 16, tp=1, pp=1, cp=2),
    _c("llama3-8b", 8, tp=1, pp=1, fsdp=True),
    _c("llama3-70b", 64, tp=4, pp=4),
    _c("llama3-70b", 64, tp=8, pp=2),
    _c("llama3-70b", 64, tp=8, pp=1, dist_opt=False),
    _c("llama3-70b", 64, tp=4, pp=4, vpp=5),
    _c("llama3-70b", 64, tp=8, pp=2, precision="fp8"),
    _c("llama3-70b", 64, tp=4, pp=4, vpp=5, precision="nvfp4"),
    _c("llama3-8b", 8, tp=1, pp=1, fsdp=True, precision="nvfp4"),
    _c("mixtral-8x7b", 64, tp=1, pp=1, ep=8),
    _c("mixtral-8x7b", 64, tp=2, pp=2, ep=8, etp=1),
    _c("mixtral-8x7b", 64, tp=4, pp=1, ep=8, etp=1, dist_opt=False),
    _c("qwen3-30b-a3b", 16, tp=1, pp=1, ep=8),
    _c("qwen3-30b-a3b", 32, tp=2, pp=2, ep=8, etp=1),
    _c("qwen3-30b-a3b", 32, tp=4, pp=1, ep=8, etp=1),
    _c("gpt-oss-120b", 64, tp=1, pp=1, ep=8),
    _c("gpt-oss-120b", 64, tp=2, pp=2, ep=16, etp=1),
    _c("gpt-oss-120b", 64, tp=1, pp=4, ep=16, dist_opt=False),
    _c("deepseek-v3", 256, tp=1, pp=4, ep=64),
    _c("deepseek-v3", 256, tp=2, pp=4, ep=32, etp=1),
    _c("deepseek-v3", 256, tp=1, pp=4, vpp=4, ep=64, precision="mxfp8"),
    _c("deepseek-v3", 256, tp=8, pp=2, ep=16, etp=1),
]

# Activations: dense models, sequence parallel (TP >= 2), selective recompute of the core attention
# (megatron's compute_activation_memory); full and no recompute; MoE.
ACT = [
    _c("llama3-8b", 8, tp=2, pp=1),
    _c("llama3-8b", 16, tp=2, pp=2),
    _c("llama3-8b", 16, tp=4, pp=4),
    _c("llama3-70b", 64, tp=8, pp=1),
    _c("llama3-70b", 64, tp=4, pp=4),
    _c("llama3-70b", 64, tp=8, pp=2),
    _c("llama3-70b", 64, tp=4, pp=4, vpp=5),
]
ACT_OTHER = [
    _c("llama3-70b", 64, tp=4, pp=4, recompute="full"),
    _c("llama3-70b", 64, tp=4, pp=4, recompute="none"),
    _c("qwen3-30b-a3b", 32, tp=2, pp=2, ep=8, etp=1),
    _c("qwen3-30b-a3b", 32, tp=2, pp=2, ep=8, etp=1, topk=2),
]

SEQ, GBS_PER_RANK = 4096, 4


def training_of(case: Case) -> Training:
    return Training(seq_len=SEQ, global_batch=case.world * GBS_PER_RANK, precision=case.precision)


def config_of(case: Case) -> ParallelConfig:
    return ParallelConfig(**case.config)


def argv_of(case: Case) -> tuple[list[str], dict, int]:
    cfg, tr = config_of(case), training_of(case)
    gpu = "B200" if case.precision == "nvfp4" else "H100"   # NVFP4 needs Blackwell
    doc = plan_doc(case.model, hgx_cluster(gpu, max(1, case.world // 8)), cfg, tr, world=case.world)
    ctx = load_context(doc)
    args = megatron_args(ctx)
    if not case.dist_opt:
        args = [a for a in args if a not in ("--use-distributed-optimizer", "--overlap-param-gather")]
    if case.topk:
        args[args.index("--moe-router-topk") + 1] = str(case.topk)
    return args, megatron_env(ctx), ctx.sm


@pytest.fixture(scope="module")
def mcore(tmp_path_factory):
    """id -> megatron_memory.py's result for every case (one subprocess)."""
    from trainers.mcore import ensure_mcore

    root = ensure_mcore()
    jobs = []
    for case in {c.id: c for c in STATE + ACT + ACT_OTHER}.values():
        args, env, sm = argv_of(case)
        jobs.append({"id": case.id, "args": args, "env": env, "sm": sm})
    tmp = tmp_path_factory.mktemp("mcore_mem")
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = dict(os.environ, PYTHONPATH=str(root) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    p = subprocess.run([sys.executable, str(HARNESS), str(tmp / "jobs.json"), str(tmp / "results.json")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    out = {r["id"]: r for r in json.loads((tmp / "results.json").read_text())}
    bad = {k: v["error"] for k, v in out.items() if "error" in v}
    assert not bad, bad
    return out


# ---------------------------------------------------------------------------------------------------
# Megatron's parameter arithmetic per layer (theoretical_memory_usage.py, written per layer)


def mcore_layer(m, moe: bool, a: dict) -> tuple[float, float, float]:
    """(TP-sharded, replicated, expert-sharded) parameters of one layer as megatron's formula counts
    them: attention without biases, q/k norms or sinks; MLP matrices 2*h*F*(3/2 if --swiglu);
    norms 2h (RMSNorm); router h*E (+ E with linear biases); routed experts without biases."""
    h, glu = m.hidden_size, (1.5 if a["swiglu"] else 1.0)
    if m.attention == "mla":
        q = (m.q_lora_rank * (h + m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) + 1)
             if m.q_lora_rank else h * m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim))
        attn = (q + m.kv_lora_rank * (h + m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim) + 1)
                + h * m.qk_rope_head_dim + m.num_attention_heads * m.v_head_dim * h)
    else:
        attn = 2 * h * m.head_dim * (m.num_attention_heads + m.num_kv_heads)
    if not moe:
        return attn + 2 * h * m.ffn_hidden_size * glu, 2 * h, 0.0
    shared = 2 * h * (m.shared_ffn_hidden_size or 0) * glu
    router = h * m.num_experts + (m.num_experts if a["add_bias_linear"] else 0)
    return attn + shared, 2 * h + router, 2 * h * m.moe_ffn_hidden_size * m.num_experts * glu


def bpp(a: dict, d: int) -> float:
    """megatron's bytes per parameter: 18 (bf16 weight, fp32 grad, fp32 master + 2 moments), 6 + 12/d
    with the distributed optimizer."""
    return 6 + 12 / d if a["use_distributed_optimizer"] else 18


def edp(a: dict) -> int:
    return a["world_size"] // (a["expert_tensor_parallel_size"] * a["expert_model_parallel_size"]
                               * a["pipeline_model_parallel_size"])


def mcore_state(m, a: dict) -> float:
    """Hand replica of compute_weight_and_optimizer_memory: the 'most loaded shard' holds num_layers/pp
    layers (dense and MoE averaged), every MTP layer, one embedding (two when untied and pp == 1) and
    final_norm/pp."""
    tp, pp, ep, etp = (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"],
                       a["expert_model_parallel_size"], a["expert_tensor_parallel_size"])
    layers = [mcore_layer(m, bool(x), a) for x in m.moe_layers]
    mtp = [mcore_layer(m, m.mtp_is_moe, a)] * m.mtp_layers
    emb = m.hidden_size * a["padded_vocab_size"]
    ts = (sum(x[0] for x in layers) / pp + sum(x[0] for x in mtp) + emb) / tp
    if a["untie_embeddings_and_output_weights"] and pp == 1:
        ts += emb / tp
    rep = (sum(x[1] for x in layers) + m.hidden_size) / pp + sum(x[1] for x in mtp)
    ex = (sum(x[2] for x in layers) / pp + sum(x[2] for x in mtp)) / (etp * ep)
    return (ts + rep) * bpp(a, a["data_parallel_size"]) + ex * bpp(a, edp(a))


# ---------------------------------------------------------------------------------------------------
# From megatron's figure to topoplan's, rank by rank


def rank_params(m, cfg: ParallelConfig, rank: int, a: dict):
    """For pipeline rank ``rank`` of topoplan's layout: (dense, expert) parameters on one GPU under
    megatron's per-layer arithmetic (``mcore_layer``), and the named parameter adjustments
    {name: (dense, expert)}, each a hand formula: what megatron's formula leaves out or splits
    differently. Also the linear weights (quantised copies) and the largest layer (FSDP working set)."""
    tp, ep, etp = cfg.tp, cfg.ep, cfg.etp_eff
    h, n, d, g = m.hidden_size, m.num_attention_heads, m.head_dim, m.num_kv_heads
    k = m.mlp_matrices
    lay = pipeline_layout(m, cfg.pp, cfg.vpp, cfg.pp_first, cfg.pp_last, seq_len=SEQ)
    emb = m.hidden_size * m.padded_vocab(tp) / tp
    D = X = 0.0
    adj = {k_: [0.0, 0.0] for k_ in ("biases", "qk_norm", "sinks", "mtp_proj", "glu", "mla_dup")}
    lin = big = 0.0
    for chunk in lay.for_rank(rank):
        flags = [bool(m.moe_layers[i]) for i in chunk.layers] + [m.mtp_is_moe] * chunk.mtp
        kinds = ["decoder"] * len(chunk.layers) + ["mtp"] * chunk.mtp
        for moe, kind in zip(flags, kinds):
            ts, rep, ex = mcore_layer(m, moe, a)
            ex = ex / (etp * ep)
            D += ts / tp + rep
            X += ex
            extra = [0.0, 0.0]

            def add(name, dense=0.0, expert=0.0):
                adj[name][0] += dense
                adj[name][1] += expert
                extra[0] += dense
                extra[1] += expert

            experts_here = math.ceil(m.num_experts / ep) / etp if moe else 0
            if m.attention != "mla":   # counted with the attention, / tp (as topoplan splits attention)
                add("biases", dense=(n * d + 2 * g * d + h) / tp * m.attention_bias)   # q, k, v, o-proj biases
                add("qk_norm", dense=2 * d / tp * m.qk_norm)                           # q and k RMSNorm weights
                add("sinks", dense=n / tp * m.attention_sinks)                         # one softmax offset per head
            else:  # MLA down projections and latent norms are duplicated over TP, not split
                q_r = m.q_lora_rank or 0
                dup = h * q_r + q_r + h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
                add("mla_dup", dense=dup * (1 - 1 / tp))
            width = m.moe_ffn_hidden_size if moe else m.ffn_hidden_size
            if m.gated_mlp and not a["swiglu"]:  # GLU other than --swiglu (GPT-OSS --quick-geglu): h*F more
                add("glu", expert=h * width * experts_here) if moe else add("glu", dense=h * width / tp)
            if m.mlp_bias:   # fc1 and fc2 biases: per expert, or of the dense MLP
                b = (k - 1) * width + h
                add("biases", expert=b * experts_here) if moe else add("biases", dense=b / tp)
            mtp_proj = (2 * h * h + 2 * h) / tp if kind == "mtp" else 0.0
            add("mtp_proj", dense=mtp_proj)  # eh_proj (2h -> h) and the enorm / hnorm weights, / tp
            extra_d, extra_x = extra
            # quantised copies cover the attention, MLP, shared and routed experts' weights (not norms,
            # router or the MTP projection)
            lin += ts / tp + ex + extra_d + extra_x - mtp_proj
            big = max(big, ts / tp + rep + ex + extra_d + extra_x)
        if chunk.embedding:
            D += emb
        if chunk.loss:
            D += h + (0 if (m.tied_embeddings and chunk.embedding) else emb)
            if chunk.mtp and not chunk.embedding:
                D += emb  # MTP needs the embedding on the last stage
    return D, X, {k_: tuple(v) for k_, v in adj.items()}, lin, big


def state_adjustments(case: Case, a: dict, rank: int) -> tuple[float, list[tuple[str, float]]]:
    """(megatron's figure, [(adjustment, bytes)]) for ``rank``: megatron + sum(adjustments) is
    topoplan's model state on that rank."""
    m, cfg = load_model(case.model), config_of(case)
    opt = options_for(training_of(case))
    M = mcore_state(m, a)
    D1, X1, padj, lin, big = rank_params(m, cfg, rank, a)
    dp, e = a["data_parallel_size"], edp(a)
    meg = lambda D, X: D * bpp(a, dp) + X * bpp(a, e)  # noqa: E731
    out = [("stage contents: the layers, embedding, head and MTP of this rank (megatron: num_layers/pp "
            "averaged, every MTP layer, one embedding, final_norm/pp)", meg(D1, X1) - M)]
    reasons = {"biases": "linear biases (qkv, o-proj, MLP and expert fc1/fc2) megatron does not count",
               "qk_norm": "q/k RMSNorm weights (--qk-layernorm) megatron does not count",
               "sinks": "attention sinks (--softmax-type learnable) megatron does not count",
               "mtp_proj": "MTP eh_proj and enorm/hnorm megatron does not count",
               "glu": "gated MLP under --quick-geglu: megatron's 3/2 factor reads only --swiglu",
               "mla_dup": "MLA down projections and latent norms duplicated over TP (megatron divides by TP)"}
    D, X = D1, X1
    for name, (dd, dx) in padj.items():
        out.append((reasons[name], meg(D + dd, X + dx) - meg(D, X)))
        D, X = D + dd, X + dx
    g, d_full = opt.grad_bytes, dp * cfg.cp
    ours_opt = opt.master_bytes + 2 * opt.moment_bytes
    assert ours_opt == 12
    if not cfg.fsdp:
        out.append(("gradients in bf16 (grad_reduce_in_fp32=False; megatron's formula: fp32 main grads)",
                    (g - 4) * (D + X)))
        if a["use_distributed_optimizer"]:
            out.append(("distributed optimizer shards over DP x CP (megatron's formula: DP only)",
                        12 * D * (1 / d_full - 1 / dp)))
        else:
            out.append(("topoplan always runs the distributed optimizer (args without it: 12 B/param "
                        "unsharded)", 12 * (D / d_full - D) + 12 * (X / e - X)))
        q = WEIGHT_COPY_BYTES[case.precision]
        out.append((f"{case.precision} weight copies (megatron's formula: bf16 only)", q * lin))
        if a["fp8_param_gather"] or a["fp4_param_gather"]:   # as megatron parsed --fp8- / --fp4-param-gather
            out.append(("quantised parameters (--fp8-param-gather / --fp4-param-gather): the linear weights are the "
                        "FP8 / NVFP4 tensors, no bf16 copy (megatron's formula: 2 B/param of bf16 weights)", -2 * lin))
    else:
        q = WEIGHT_COPY_BYTES[case.precision]
        # FP8 / NVFP4 parameters: no bf16 linear weights, sharded or gathered
        wl = 0 if (a["fp8_param_gather"] or a["fp4_param_gather"]) else 2
        ours = (2 + g + 12) * (D / d_full + X / e) - (2 - wl) * lin / d_full + q * lin / d_full \
            + 2 * big * (wl + g + q)
        out.append(("FSDP shards weights and grads over DP and holds two layers unsharded (megatron's "
                    "formula: distributed optimizer only)", ours - meg(D, X)))
    return M, out


def ours_state(case: Case) -> list[float]:
    m, cfg, tr = load_model(case.model), config_of(case), training_of(case)
    est = memory_per_gpu(m, cfg, tr, case.world)
    return [(r.weights + r.weight_copies + r.grads + r.optimizer + r.fsdp_buffers) * GIB for r in est.per_stage]


@pytest.mark.parametrize("case", STATE, ids=[c.id for c in STATE])
def test_model_state_is_megatrons_plus_named_adjustments(case, mcore):
    r = mcore[case.id]
    a, m, cfg = r["args"], load_model(case.model), config_of(case)
    # the emitted arguments are the layout, as megatron parses them
    assert (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"], a["data_parallel_size"]) == (
        cfg.tp, cfg.pp, case.world // (cfg.tp * cfg.pp * cfg.cp))
    assert a["padded_vocab_size"] == m.padded_vocab(cfg.tp)
    assert a["use_distributed_optimizer"] == (case.dist_opt or cfg.fsdp)
    # the hand replica is megatron's function
    assert mcore_state(m, a) == pytest.approx(r["weights_optimizer"], rel=REL)
    ours = ours_state(case)
    for rank, o in enumerate(ours):
        M, adj = state_adjustments(case, a, rank)
        assert o == pytest.approx(M + sum(v for _, v in adj), rel=REL), (rank, adj)
    # each adjustment is there exactly where its reason applies (over all ranks)
    tot = {}
    for rank in range(cfg.pp):
        for name, v in state_adjustments(case, a, rank)[1]:
            tot[name] = tot.get(name, 0.0) + abs(v)
    nz = {name.split(" ")[0] + " " + name.split(" ")[1] for name, v in tot.items() if v > 0}
    expect = {
        "linear biases": m.attention_bias or m.mlp_bias,
        "q/k RMSNorm": m.qk_norm,
        "attention sinks": m.attention_sinks,
        "MTP eh_proj": m.mtp_layers > 0 and cfg.pp > 0,
        "gated MLP": m.gated_mlp and m.activation != "silu",
        "MLA down": m.attention == "mla" and cfg.tp > 1,
        "gradients in": not cfg.fsdp,
        "distributed optimizer": (not cfg.fsdp) and case.dist_opt and cfg.cp > 1,
        "topoplan always": not case.dist_opt,
        f"{case.precision} weight": case.precision != "bf16" and not cfg.fsdp,
        # auto: NVIDIA's recipes (fp8 / mxfp8: --fp8-param-gather, nvfp4: --fp4-param-gather)
        "quantised parameters": case.precision in ("fp8", "mxfp8", "nvfp4") and not cfg.fsdp,
        "FSDP shards": cfg.fsdp,
    }
    for key, want in expect.items():
        assert (key in nz) == bool(want), (key, want, tot)


def test_emitted_megatron_args_hold_the_gradients_the_estimate_counts(mcore):
    """topoplan counts a bf16 gradient buffer for Megatron (options_for: grad_bytes 2, as NVIDIA's
    performance recipes set grad_reduce_in_fp32=False); the emitted args.txt must make megatron hold
    that buffer: validate_args turns on fp32 gradient accumulation for --bf16 unless --grad-reduce-in-bf16."""
    g = options_for(Training(seq_len=SEQ, global_batch=8)).grad_bytes
    for case in STATE:
        a = mcore[case.id]["args"]
        assert a["accumulate_allreduce_grads_in_fp32"] == (g == 4), case.id


# ---------------------------------------------------------------------------------------------------
# Activations


def act_adjustments(case: Case, r: dict) -> tuple[float, list[tuple[str, float]]]:
    """(megatron's compute_activation_memory, [(adjustment, bytes)]) for pipeline rank 0 of a dense
    model with SP and core-attention recompute; megatron + sum = topoplan's activations + logits."""
    m, cfg, a = load_model(case.model), config_of(case), r["args"]
    h, F, n, d, g = m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.head_dim, m.num_kv_heads
    tp, pp, vpp, M = cfg.tp, cfg.pp, cfg.vpp, r["num_microbatches"]
    s, b = SEQ, cfg.mbs
    sbt = s * b / tp   # tokens per GPU under SP
    # megatron's number of layer activations held: num_layers x (interleave penalty or min(1, M/pp))
    if vpp > 1:
        factor = 1 + (pp - 1) / (pp * vpp)
    else:
        factor = min(1, M / pp) if pp > 1 else 1
    l_meg = m.num_layers * factor
    # topoplan: the layers of each chunk of rank 0 times its micro-batches in flight
    est = memory_per_gpu(m, cfg, training_of(case), case.world)
    lay = pipeline_layout(m, pp, vpp, cfg.pp_first, cfg.pp_last, seq_len=SEQ)
    inflight = est.per_stage[0].inflight
    l_ours = sum(k * len(ch.layers) for k, ch in zip(inflight, lay.for_rank(0)))
    ours_layer = 4 * h + 2 * h + (n * d + 2 * g * d) * 2 + n * d * 2 + 2 * h + 3 * F * 2  # bytes per token
    V = a["padded_vocab_size"]
    out = [
        ("dropout masks (attention output, MLP output: 1 B x h each); the emitted runs use dropout 0",
         -2 * h * sbt * l_meg),
        ("GQA: q is n*d wide, k and v n_kv*d (Korthikanti: q, k, v each h)",
         ((n * d + 2 * g * d) * 2 - 6 * h) * sbt * l_meg),
        ("attention output n*d wide (Korthikanti: h)", (n * d * 2 - 2 * h) * sbt * l_meg),
        ("SwiGLU: fc1 output 2F wide (Korthikanti: GeLU input F)", 2 * F * sbt * l_meg),
        ("layers held: topoplan's rank 0 layers x micro-batches in flight (schedule simulated) against "
         "megatron's num_layers x min(1, M/pp) or the interleave penalty", ours_layer * sbt * (l_ours - l_meg)),
        ("embedding input ids (int64) and embedding dropout mask: not kept", -(8 * s * b * pp + s * b * h * pp) * factor / tp),
    ]
    if pp == 1:
        ours_logits = s * b * V / tp * 6 + s * b / tp * h * 2 + s * b * h * 2
        out.append(("loss: bf16 logits + fp32 softmax (6 B per local logit), final-norm and gathered head "
                    "inputs (megatron: 4 B per logit and 4h per token, / tp)",
                    ours_logits - s * b * h * 4 * (1 + V / h) / tp))
    return r["act_sp"], out


@pytest.mark.parametrize("case", ACT, ids=[c.id for c in ACT])
def test_activations_are_megatrons_plus_named_adjustments(case, mcore):
    r = mcore[case.id]
    m, cfg = load_model(case.model), config_of(case)
    assert r["report"] == "sp" and r["args"]["sequence_parallel"]
    est = memory_per_gpu(m, cfg, training_of(case), case.world)
    ours = (est.per_stage[0].activations + est.per_stage[0].logits) * GIB
    M, adj = act_adjustments(case, r)
    assert ours == pytest.approx(M + sum(v for _, v in adj), rel=REL), adj
    named = {k.split(":")[0].split(" (")[0]: v for k, v in adj}
    assert named["dropout masks"] < 0 and named["SwiGLU"] > 0 and named["GQA"] < 0


def test_megatron_activation_estimate_ignores_recompute_and_experts(mcore):
    full, none = (mcore[c.id] for c in ACT_OTHER[:2])
    # report_theoretical_memory prices full and no recompute alike: the no-SP selective formula
    assert full["report"] == none["report"] == "no_sp"
    assert full["act_no_sp"] == none["act_no_sp"]
    m = load_model(ACT_OTHER[0].model)
    ests = [memory_per_gpu(m, config_of(c), training_of(c), c.world).per_stage[0] for c in ACT_OTHER[:2]]
    assert ests[0].activations < 0.2 * ests[1].activations  # topoplan: full recompute keeps layer inputs
    # MoE: megatron's figure does not move with top-k (every layer a dense MLP of --ffn-hidden-size)
    k8, k2 = (mcore[c.id] for c in ACT_OTHER[2:])
    assert k8["act_sp"] == k2["act_sp"]
    q8 = load_model("qwen3-30b-a3b")
    assert q8.top_k == 8
    q2 = q8.model_copy(update={"top_k": 2})
    c = ACT_OTHER[2]
    a8, a2 = (memory_per_gpu(q, config_of(c), training_of(c), c.world).per_stage[0].activations for q in (q8, q2))
    assert a8 > 1.5 * a2  # topoplan: the routed copies scale with top-k


# ---------------------------------------------------------------------------------------------------
# The tables of docs/memory.md


def test_print_tables(mcore, capsys):
    rows = []
    for case in STATE:
        r = mcore[case.id]
        ours = ours_state(case)
        worst = max(range(len(ours)), key=ours.__getitem__)
        M, adj = state_adjustments(case, r["args"], worst)
        parts = "; ".join(f"{name.split(' (')[0]} {v / GIB:+.2f}" for name, v in adj if abs(v) / GIB >= 0.005)
        rows.append(f"| {case.id} | {worst} | {ours[worst] / GIB:.2f} | {M / GIB:.2f} | {(ours[worst] - M) / GIB:+.2f} | {parts} |")
    arows = []
    for case in ACT:
        r = mcore[case.id]
        est = memory_per_gpu(load_model(case.model), config_of(case), training_of(case), case.world)
        ours = (est.per_stage[0].activations + est.per_stage[0].logits) * GIB
        M, adj = act_adjustments(case, r)
        parts = "; ".join(f"{name.split(' (')[0].split(':')[0]} {v / GIB:+.2f}" for name, v in adj if abs(v) / GIB >= 0.005)
        arows.append(f"| {case.id} | {ours / GIB:.2f} | {M / GIB:.2f} | {(ours - M) / GIB:+.2f} | {parts} |")
    with capsys.disabled():
        print("\n| layout | rank | ours GiB | megatron GiB | difference | adjustments (GiB) |")
        print("|---|---|---|---|---|---|")
        print("\n".join(rows))
        print("\n| layout | ours GiB | megatron GiB | difference | adjustments (GiB) |")
        print("|---|---|---|---|---|")
        print("\n".join(arows))
    assert rows and arows
