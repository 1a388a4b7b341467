"""The step-time model: adds the cost terms of ``planner.cost.terms`` and keeps the breakdown.

One training step of a layout is the slowest pipeline rank's micro-batches plus what cannot hide::

    t_mb[r]   = sum over rank r's layers of (compute + exposed TP + exposed EP + exposed CP + overhead)
                [+ output head / MTP on the last stage] [+ busiest-GPU expert excess]
    t_step    = m * max_r t_mb[r]                  (m = gbs / (mbs * dp) micro-batches per pipeline)
              + bubble((pp-1)/vpp * max_r t_mb[r]) + exposed p2p + exposed DP + optimizer

The breakdown splits the same sum into terms (seconds, exposed part only): ``compute`` (mean rank),
``tp_comm``, ``ep_a2a``, ``cp_comm``, ``other`` (per-layer launch overhead and the host floor of
``terms/host.py``: host time to issue a layer's kernels that its GPU work does not cover), ``imbalance`` (slowest
rank over the mean rank, and the busiest expert GPU over the mean), ``pp_bubble``, ``pp_p2p``,
``dp_comm``, ``optimizer``, ``offload`` (the wait for CPU activation offload copies, ``terms/offload.py``;
0 without ``Recipe.cpu_offload_layers``). The terms add up to ``step_time_s``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

from planner.config import ParallelConfig, Training
from planner.cost import compose as K
from planner.cost.compose import FLOAT as F
from planner.cost.memory import offloaded_layer_bytes
from planner.cost.terms import compute as C
from planner.cost.terms import context_parallel as CP
from planner.cost.terms import data_parallel as DP
from planner.cost.terms import expert_a2a as EA
from planner.cost.terms import host as HOST
from planner.cost.terms import offload as OFF
from planner.cost.terms import optimizer as OPT
from planner.cost.terms import pipeline as PPL
from planner.cost.terms import sync as SYNC
from planner.cost.terms import tensor_parallel as TP
from planner.model.flops import layer_costs
from planner.model.pipeline import pipeline_layout
from planner.rules import effective_recipe, quantised_params
from planner.trainers import get_trainer
from topologies.collectives import fabric_for as ff

_BASE_TERMS = ("compute", "tp_comm", "ep_a2a", "pp_bubble", "pp_p2p", "dp_comm", "cp_comm", "optimizer",
               "imbalance", "other", "offload", "sync")
# the breakdown's order: the base terms, the EXTRA_TERMS, and the slowest-GPU wait (a share of all of them) last
TERMS = _BASE_TERMS[:-1] + tuple(dict.fromkeys(t.name for t in K.EXTRA_TERMS if t.name not in _BASE_TERMS)) + ("sync",)
LOW_PRECISION = ("fp8", "fp8-block", "mxfp8", "nvfp4")


def fabric_for(cluster):
    return ff(cluster)


def profile_fabric(cluster, profile):
    """The cluster's fabric as a profile sees it: collectives that leave an NVLink domain scaled by the
    profile's ``net.bw`` for this GPU generation. Every caller that prices communication for a profile
    (``step_time``, the solver's tables) should use this, not ``fabric_for`` directly."""
    fabric = fabric_for(cluster)
    net = profile.param("net.bw", cluster.gpu_spec.arch)
    return fabric if net == 1.0 else NetScaled(fabric, net)


class NetScaled:
    """The fabric with every collective that leaves an NVLink domain ``scale`` times faster (the
    profile's ``net.bw``: achieved scale-out bandwidth of this stack and NIC generation relative to the
    fabric model's 0.74 of line rate)."""

    def __init__(self, fabric, scale: float):
        self.fabric, self.scale = fabric, scale

    def _by_shape(self, name, shape, *args, **kwargs):
        t = getattr(self.fabric, name)(shape, *args, **kwargs)
        return t / self.scale if shape.tier >= 0 else t

    def all_reduce(self, shape, nbytes):
        return self._by_shape("all_reduce", shape, nbytes)

    def all_gather(self, shape, nbytes):
        return self._by_shape("all_gather", shape, nbytes)

    def reduce_scatter(self, shape, nbytes):
        return self._by_shape("reduce_scatter", shape, nbytes)

    def all_to_all(self, shape, nbytes, impl="nccl"):
        return self._by_shape("all_to_all", shape, nbytes, impl=impl)

    def ep_dispatch(self, shape, nvl_bytes, net_bytes, impl="deepep"):
        return self._by_shape("ep_dispatch", shape, nvl_bytes, net_bytes, impl=impl)

    def p2p(self, nbytes, tier):
        t = self.fabric.p2p(nbytes, tier)
        return t / self.scale if tier >= 0 else t

    def nccl_latency(self, coll, shape, small=False):
        return self.fabric.nccl_latency(coll, shape, small)   # latency: net.bw scales bandwidth only


@dataclass
class StepTime:
    step_time_s: float
    breakdown: "OrderedDict[str, float]"
    microbatches: float
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Efficiencies:
    """Profile parameters resolved for one GPU and precision."""

    peak_lp: float
    peak_bf16: float
    eff_lp: float
    eff_bf16: float
    dim_half: float
    m_half: float
    attn_eff: float
    hbm_bps: float
    elem_factor: float
    quant_factor: float
    quant_bytes: float

    def layer_time(self, work, recompute):
        return C.layer_time(work, peak_lp=self.peak_lp, peak_bf16=self.peak_bf16, eff_lp=self.eff_lp,
                            eff_bf16=self.eff_bf16, dim_half=self.dim_half, m_half=self.m_half,
                            attn_eff=self.attn_eff, hbm_bps=self.hbm_bps, elem_factor=self.elem_factor,
                            quant_factor=self.quant_factor, quant_bytes=self.quant_bytes, recompute=recompute)


def efficiencies(gpu, precision: str, profile, fused: bool = True) -> Efficiencies:
    """Kernel efficiencies of ``profile`` on ``gpu``; ``fused=False`` (an eager recipe: Megatron without
    CUDA graphs, TorchTitan without torch.compile; ``recipe_pricing``) prices elementwise traffic with
    ``mem.elementwise_eager`` (unfused kernels and the launch gaps between them) instead of
    ``mem.elementwise``, and never less than it."""
    arch = gpu.arch
    p = lambda n: profile.param(n, arch)  # noqa: E731
    speed = p("gpu.speed")
    eff_lp = min(0.98, C.mamf(gpu.name, precision) * p(C.stack_key(precision)) * speed)
    eff_bf16 = min(0.98, C.mamf(gpu.name, "bf16") * p("gemm.bf16") * speed)
    return Efficiencies(
        peak_lp=gpu.peak_tflops(precision) * 1e12, peak_bf16=gpu.bf16_tflops * 1e12,
        eff_lp=eff_lp, eff_bf16=eff_bf16, dim_half=p("gemm.dim_half"), m_half=p("gemm.grouped_m_half"),
        attn_eff=min(0.98, p("attn.eff") * speed), hbm_bps=gpu.hbm_tbps * 1e12 * p("mem.hbm_eff"),
        # an eager recipe moves at least the traffic of a fused one
        elem_factor=p("mem.elementwise") if fused else max(p("mem.elementwise"), p("mem.elementwise_eager")),
        quant_factor=p("mem.quant"),
        quant_bytes=C.quant_bytes_per_element(precision))


def recipe_pricing(model, config: ParallelConfig, training: Training, profile, arch: str, recipe=None) -> tuple:
    """(TP overlap, EP overlap, fused elementwise) the step time prices for ``config``: the recipe as the
    trainer runs the layout (``planner.rules.effective_recipe``). A Megatron overlap the recipe
    switches off (by the user, or by a trainer rule for this layout) hides nothing: overlap 0. A
    trainer without the knob keeps the profile's fitted overlap, which its measured runs reached
    without it. The third value says whether elementwise traffic is fused: ``mem.elementwise``, else
    ``mem.elementwise_eager``: the trainer's ``Pricing.fused`` (planner.trainers). Megatron fuses with CUDA
    graphs (``cuda_graph_impl`` not none); TorchTitan with torch.compile of the model
    (``planner.trainers.torchtitan.rules.torch_compile_on``), whatever its CUDA graph switch
    (``training.disable_cuda_graphs``, not priced); MaxText as ``Training.cuda_graphs``.
    ``recipe``: the effective recipe when the caller resolved it (``predict`` does, once)."""
    rec = recipe or effective_recipe(model, config, training)
    trainer = get_trainer(training.trainer)
    o_tp = profile.param("tp.overlap", arch)
    o_ep = profile.param("ep.overlap", arch)
    if trainer.has("tp_comm_overlap") and not rec.tp_comm_overlap:
        o_tp = 0.0
    if trainer.has("overlap_moe_expert_parallel_comm") and not rec.overlap_moe_expert_parallel_comm:
        o_ep = 0.0
    return o_tp, o_ep, trainer.pricing.fused(rec, training.cuda_graphs)


def host_regime(model, config: ParallelConfig, training: Training, recipe=None) -> tuple[tuple, bool]:
    """(graphed modules, experts launched per step) for the host floor (``terms/host.py``), from the
    recipe as the trainer runs ``config`` (``planner.rules.effective_recipe``): no CUDA graphs is an
    eager layer, ``()``; a full-iteration graph, or a graph of the whole layer (modules ``()``), is
    ``HOST.WHOLE_LAYER``; partial graphs name their modules, and capture the expert launches only
    when they graph the MoE block. Megatron only: other trainers have no host floor."""
    if not get_trainer(training.trainer).pricing.host_floor:
        return HOST.WHOLE_LAYER, False
    rec = recipe or effective_recipe(model, config, training)
    impl, mods = rec.cuda_graph_impl, rec.cuda_graph_modules
    if impl == "full_iteration" or (impl != "none" and not mods):
        return HOST.WHOLE_LAYER, False
    if impl == "none":
        return (), True
    return tuple(mods), "moe" not in mods


@lru_cache(maxsize=256)
def layer_kinds(model) -> tuple:
    """The kind of every decoder layer: (its MLP "moe" | "dense" | "none", sliding-window attention,
    its token mixer "attention" | "gdn" | "mamba" | "none")."""
    return tuple((model.mlp_kind(i), bool(model.swa_layers[i]), model.mixers[i]) for i in range(model.num_layers))


_layer_kinds = layer_kinds


def mtp_kind(model) -> tuple:
    """The kind an MTP layer is priced as: the last decoder layer's MLP, full attention."""
    return ("moe" if model.mtp_is_moe else "dense", False, "attention")


def kinds_of(model) -> tuple:
    """Every layer kind a model's ranks can hold (MTP layers included), sorted."""
    kinds = set(layer_kinds(model))
    if model.mtp_layers:
        kinds.add(mtp_kind(model))
    return tuple(sorted(kinds))


# --- the composition's parts: pure functions of a few hashable inputs ---------------------------
# ``step_time`` composes them for one layout; ``planner.search.program`` tabulates the same functions
# over the values of the solver's decision variables. A cost change is made here, once.


def recompute_arg(config: ParallelConfig):
    """What the compute term reads of the recompute choice: "full", or the recomputed modules (a tuple,
    empty for none)."""
    r = config.recompute if config.recompute in ("none", "full") else config.recompute_modules
    return () if r == "none" else r


# a recomputed forward repeats its collectives: 2 AG + 2 RS of TP (full recompute), the MoE
# block's dispatch and combine (selective "moe" recompute)
RECOMPUTE_COMM = 1.5


def tp_layer_time(fabric, shape, mbs: int, seq_len: int, cp: int, hidden: int, recompute) -> float:
    """TP collectives of one layer and micro-batch (``terms/tensor_parallel.py``) on the group ``shape``,
    repeated in part by a full recompute; 0 when TP is 1."""
    if shape is None or shape.size <= 1:
        return 0.0
    t = TP.tp_comm_time(fabric, shape, TP.activation_bytes(mbs, seq_len, cp, hidden))
    if recompute == "full":
        t *= RECOMPUTE_COMM
    return t


def dispatch_bytes(precision: str, profile, arch: str) -> float:
    """Bytes per element the dispatch sends: FP8 and its scales when the stack quantises before the
    dispatch (``terms/expert_a2a.py``), else BF16."""
    return EA.dispatch_bytes(precision in LOW_PRECISION, profile.param("ep.dispatch_bytes_fp8", arch) >= 0.5)


def a2a_layer_time(fabric, shape, model, mbs: int, seq_len: int, cp: int, tp: int, dispatcher: str,
                   disp_bytes: float, recompute, cross_scale: float = 1.0) -> float:
    """Dispatch and combine of one MoE layer and micro-batch (``terms/expert_a2a.py``: the bytes each
    dispatcher moves, over NVLink and through the NIC) on the EP group ``shape``; 0 when EP is 1 or
    the model is dense."""
    if not model.is_moe or shape is None or shape.size <= 1:
        return 0.0
    t = EA.a2a_time(fabric, shape, model, mbs * seq_len / (cp * tp), dispatcher, disp_bytes,
                    cross_domain_scale=cross_scale)
    return t * a2a_recompute_factor(recompute)


def a2a_recompute_factor(recompute) -> float:
    """The all-to-all's repeat under recompute (``a2a_layer_time`` reads recompute only through this):
    selective recompute of the MoE block repeats dispatch and combine."""
    return RECOMPUTE_COMM if (recompute != "full" and "moe" in (recompute or ())) else 1.0


def cp_layer_time(fabric, tier: int, model, cp: int, mbs: int, seq_len: int, tp: int) -> float:
    """Context-parallel KV exchange of one layer and micro-batch (``terms/context_parallel.py``)."""
    return CP.cp_time(fabric, tier, cp, mbs, seq_len, CP.kv_width(model), tp) if cp > 1 else 0.0


def kind_time(eff: "Efficiencies", model, kind: tuple, seq_len: int, mbs: int, tp: int, cp: int, ep: int,
              etp: int, lp: bool, recompute) -> "C.LayerTime":
    """Compute of one layer of ``kind`` for one micro-batch (``terms/compute.py``)."""
    return eff.layer_time(C.layer_work(model, kind[0], kind[1], seq_len, mbs, tp, cp, ep, etp, lp,
                                       kind[2] if len(kind) > 2 else "attention"), recompute)


def head_time(eff: "Efficiencies", model, seq_len: int, mbs: int, tp: int, cp: int, mtp: bool) -> "C.LayerTime":
    """Compute of the output head (``mtp=False``) or of one MTP layer's extras, one micro-batch."""
    return eff.layer_time(C.head_work(model, seq_len, mbs, tp, cp, mtp), ())


def windows(lt, ep_sms: float = 0.0) -> tuple[float, float, float]:
    """The compute each communication of a layer can hide behind: (TP: three times the forward GEMMs,
    EP: the whole layer at the speed it keeps while the dispatch kernels hold ``ep_sms`` of the SMs,
    CP: the attention core)."""
    return 3.0 * lt.gemm_fwd, EA.window_with_sms(lt.total, ep_sms), lt.attn_core


def host_call_us(cluster, par) -> float:
    """Host microseconds per launched kernel: the cluster's own figure (``Cluster.host_launch_us``, its hosts'
    measured kernel launch cost: the cost belongs to the host CPU, docs/cloud.md) where the file sets one,
    else the profile's ``host.launch_us`` for the GPU generation (``par``: the profile's lookup)."""
    own = getattr(cluster, "host_launch_us", None)
    return float(own) if own is not None else par("host.launch_us")


def kind_host_time(model, kind: tuple, ep: int, graphed, experts_launched: bool, call_us: float,
                   recompute=()) -> float:
    """Host seconds to issue one layer of ``kind`` (``terms/host.py``); ``ep`` sets the local experts,
    ``graphed`` the modules CUDA graphs capture (``host_regime``), ``call_us`` is the profile's
    ``host.launch_us``, ``recompute`` (``recompute_arg``) what the backward launches again."""
    return HOST.host_time(kind[0], model.num_experts / ep if model.is_moe else 0.0, graphed, experts_launched, call_us,
                          recompute)


def kind_sync_time(model, kind: tuple, ep: int, lt, experts_launched: bool, recompute, call_us: float) -> float:
    """GPU idle seconds of one layer of ``kind`` behind the dropless router's host syncs
    (``terms/host.py`` ``sync_exposed``): one per forward pass of the MoE block, two when it is
    recomputed; none where the experts run inside a CUDA graph (static shapes, no sync)."""
    if kind[0] != "moe" or not experts_launched:
        return 0.0
    again = recompute == "full" or "moe" in (recompute or ())
    g_post = lt.expert / (4.0 if again else 3.0)   # the routed experts' forward
    return HOST.sync_exposed(model.num_experts / ep, 2 if again else 1, g_post, call_us)


def offload_time(model, config: ParallelConfig, training: Training, link_gbps: float, layer_times: dict) -> float:
    """Exposed seconds per micro-batch of CPU activation offloading (``terms/offload.py``) on the rank
    that holds the whole block (pp 1, the only layout megatron-core offloads with; 0 otherwise or when
    ``Recipe.cpu_offload_layers`` is off). Bytes per offloaded layer: ``memory.offloaded_layer_bytes``
    (their mean); compute per layer: the mean forward and backward of the decoder layers, from
    ``layer_times`` ({kind: LayerTime}, ``kind_time``)."""
    if config.pp > 1:
        return 0.0
    per_layer = offloaded_layer_bytes(model, config, training)
    if not per_layer:
        return 0.0
    kinds = layer_kinds(model)
    n = len(kinds)
    t_f = sum(layer_times[k].fwd for k in kinds) / n
    t_b = sum(layer_times[k].bwd for k in kinds) / n
    return OFF.offload_exposed(len(per_layer), n, sum(per_layer) / len(per_layer), link_gbps, t_f, t_b)


def p2p_bytes(mbs: int, seq_len: int, cp: int, tp: int, hidden: int) -> float:
    """Bytes of one stage-to-stage activation (``terms/pipeline.py``): BF16, sequence-sharded."""
    return mbs * seq_len / (cp * tp) * hidden * 2.0


@dataclass(frozen=True)
class RankInventory:
    """What one pipeline rank holds: layers by kind, MTP layers, head, and parameter counts."""

    kinds: tuple            # ((kind, swa), count) pairs, MTP layers included
    mtp: int
    loss: bool
    embedding: bool
    dense_params: float     # before TP split (embedding / output head included)
    expert_params: float    # every routed expert of the rank's MoE layers, before EP x ETP split


@lru_cache(maxsize=1024)
def rank_inventory(model, layout, seq_len: int, pp: int) -> tuple:
    """Per pipeline rank: its ``RankInventory`` (memoised per model and layout)."""
    costs = layer_costs(model, seq_len)
    kinds = layer_kinds(model)
    mtp_k = mtp_kind(model)
    vocab_params = model.hidden_size * model.padded_vocab(1)
    out = []
    for r in range(pp):
        count: dict = {}
        dense = expert = 0.0
        mtp = 0
        loss = emb = False
        for st in layout.for_rank(r):
            for i in st.layers:
                count[kinds[i]] = count.get(kinds[i], 0) + 1
                dense += costs[i].dense_params
                expert += costs[i].expert_params * costs[i].n_experts
            for j in range(int(st.mtp or 0)):
                count[mtp_k] = count.get(mtp_k, 0) + 1
                lc = costs[model.num_layers + j] if len(costs) > model.num_layers + j else costs[-1]
                dense += lc.dense_params
                expert += lc.expert_params * lc.n_experts
                mtp += 1
            if st.loss:
                loss = True
                if not model.tied_embeddings:
                    dense += vocab_params
            if st.embedding:
                emb = True
                dense += vocab_params
        out.append(RankInventory(tuple(sorted(count.items())), mtp, loss, emb, dense, expert))
    return tuple(out)


_RANK_KEYS = ("compute", "fwd", "bwd", "expert_excess", "tp", "ep", "cp", "other")   # per_kind's first 8


def _rank_microbatch(inv, per_kind, head, mtp_extra, tp, expert_shards, offload) -> dict:
    """One pipeline rank's seconds per micro-batch by term (its layers by kind, MTP, the loss head),
    its parameters per GPU and ``t_mb``, the sum of the terms on its critical path."""
    vals = [0.0] * len(_RANK_KEYS)
    for kind, n in inv.kinds:
        pk = per_kind[kind]
        for i in range(len(_RANK_KEYS)):
            vals[i] += n * pk[i]
    acc = dict(zip(_RANK_KEYS, vals))
    if inv.mtp:
        acc["compute"] += inv.mtp * mtp_extra.total
        acc["fwd"] += inv.mtp * mtp_extra.fwd
        acc["bwd"] += inv.mtp * mtp_extra.bwd
    if inv.loss:
        acc["compute"] += head.total
        acc["fwd"] += head.fwd
        acc["bwd"] += head.bwd
    acc["dense_params"] = inv.dense_params / tp
    acc["expert_params"] = inv.expert_params / expert_shards
    acc["offload"] = offload
    parts = [(n, per_kind[kind][-1]) for kind, n in inv.kinds]
    parts += [(inv.mtp, mtp_extra.total)] if inv.mtp else []
    parts += [(1, head.total)] if inv.loss else []
    acc["t_mb"] = K.rank_time(F, parts + ([(1, offload)] if offload else []))
    return acc


def _term_values(term, config: ParallelConfig, training: Training, world: int, dispatcher) -> dict:
    """The values of ``term.reads`` (``compose.StepTerm``) for one layout, as the solver's variables
    hold them (``dispatcher``: the one the step runs, the profile's when the layout names none)."""
    known = dict(tp=config.tp, cp=config.cp, pp=config.pp, vpp=config.vpp, dp=config.dp_for(world), ep=config.ep,
                 etp=config.etp, mbs=config.mbs, gbs=training.global_batch, recompute=config.recompute,
                 dispatcher=dispatcher, fsdp=config.fsdp, world=world)
    return {n: known[n] for n in term.reads}


def _data_parallel(config, training, recipe, fabric, shapes, par, crit, m) -> tuple[float, ...]:
    """(exposed seconds, dense and expert reduce-scatter, dense and expert all-gather) of the gradient
    reduction and parameter gather of the critical rank ``crit``."""
    dp_shape = shapes.get("dp-cp") or shapes.get("dp")   # dense gradients are reduced over dp x cp
    edp_shape = shapes.get("edp")
    grad_b = par("dp.grad_bytes")  # 2 (BF16) for Megatron-Bridge recipes, 4 for FP32 reduction
    param_b = DP.param_gather_bytes(training.precision, quantised_params(recipe))   # FP8 1, NVFP4 0.5
    rs_d, ag_d = DP.dp_time(fabric, dp_shape, crit["dense_params"], grad_bytes=grad_b, param_bytes=param_b)
    rs_e, ag_e = DP.dp_time(fabric, edp_shape, crit["expert_params"], grad_bytes=grad_b, param_bytes=param_b)
    keep = 1.0 - par("dp.overlap")
    rs, ag = rs_d + rs_e, ag_d + ag_e
    if config.fsdp:
        dp_x = K.fsdp_exposed(F, rs, ag, keep * rs, keep * ag, crit["compute"], int(round(m)), DP.FSDP_GATHERS)
    else:
        dp_x = K.dp_exposed(F, rs, ag, keep * rs, keep * ag, crit["bwd"],
                            DP.gather_window_passes(config.pp, config.vpp) * crit["fwd"])
    return dp_x, rs_d, rs_e, ag_d, ag_e


def _breakdown(m, mean, bubble, t_mb_max, p2p, dp_x, t_opt, extra) -> "OrderedDict[str, float]":
    """The step split into ``TERMS`` (exposed seconds; they add up to the step): the mean rank's
    micro-batches by term, the slowest rank's lead over it, the bubble, and the step-level terms."""
    bd = OrderedDict()
    bd["compute"] = m * mean["compute"]
    bd["tp_comm"] = m * mean["tp"]
    bd["ep_a2a"] = m * mean["ep"]
    bd["pp_bubble"] = bubble
    bd["pp_p2p"] = p2p
    bd["dp_comm"] = dp_x
    bd["cp_comm"] = m * mean["cp"]
    bd["optimizer"] = t_opt
    bd["imbalance"] = m * (t_mb_max - mean["t_mb"])
    bd["other"] = m * mean["other"]
    bd["offload"] = m * mean["offload"]
    for term, v in zip(K.EXTRA_TERMS, extra):
        bd[term.name] = bd.get(term.name, 0.0) + v
    return bd


def step_time(model, cluster, config: ParallelConfig, training: Training, world: int, placement, profile,
              shapes: dict, expert_balance=None, layout=None, recipe=None) -> StepTime:
    """Seconds per training step and its breakdown for ``config`` placed by ``placement``. ``recipe``: the
    effective recipe (``planner.rules.effective_recipe``) when the caller resolved it; else resolved here, once."""
    rec = recipe or effective_recipe(model, config, training)
    gpu = cluster.gpu_spec
    prec = training.precision
    s = training.seq_len
    tp, cp, pp, vpp, ep, etp, mbs = config.tp, config.cp, config.pp, config.vpp, config.ep, config.etp_eff, config.mbs
    arch = gpu.arch
    par = lambda n: profile.param(n, arch)  # noqa: E731
    o_tp, o_ep, graphs = recipe_pricing(model, config, training, profile, arch, rec)
    ep_sms = EA.sm_share(gpu.name)
    o_ep = EA.overlap_with_sms(o_ep, ep_sms)
    eff = efficiencies(gpu, prec, profile, graphs)
    fabric = profile_fabric(cluster, profile)
    dp = config.dp_for(world)
    edp = config.edp_for(world)
    m = training.global_batch / (mbs * dp)
    lp = prec in LOW_PRECISION
    if layout is None:
        layout = pipeline_layout(model, pp, vpp, config.pp_first, config.pp_last, seq_len=s)
    recompute = recompute_arg(config)

    # --- per layer type: compute and communication of one micro-batch -------------------------
    h = model.hidden_size
    t_tp_layer = tp_layer_time(fabric, shapes.get("tp"), mbs, s, cp, h, recompute)
    dispatcher = config.dispatcher if config.dispatcher is not None else profile.dispatcher
    cross_scale = 1.0
    ep_shape = shapes.get("ep")
    if expert_balance is not None and ep_shape is not None and ep_shape.domains > 1:
        uniform = 1.0 - ep_shape.per_domain / ep_shape.size
        if uniform > 0:
            cross_scale = max(expert_balance.cross_domain_fraction, 1e-3) / uniform
    t_a2a_layer = a2a_layer_time(fabric, ep_shape, model, mbs, s, cp, tp, dispatcher,
                                 dispatch_bytes(prec, profile, arch), recompute, cross_scale)
    t_cp_layer = cp_layer_time(fabric, shapes["cp"].tier if shapes.get("cp") else -1, model, cp, mbs, s, tp)
    balance = 1.0 if expert_balance is None else max(1.0, float(expert_balance.balance))
    launch = par("other.layer_us") * 1e-6
    o_cp = par("cp.overlap")

    graphed, experts_launched = host_regime(model, config, training, rec)
    call_us = host_call_us(cluster, par)
    inventory = rank_inventory(model, layout, s, pp)
    per_kind = {}
    hidden = {}   # per kind: the all-to-all seconds the EP overlap hides (compose.unpaired_a2a)
    layer_times = {}
    for kind in {k for inv in inventory for k, _ in inv.kinds}:
        lt = layer_times[kind] = kind_time(eff, model, kind, s, mbs, tp, cp, ep, etp, lp, recompute)
        w_tp, w_ep, w_cp = windows(lt, ep_sms)
        tp_x = K.exposed(F, t_tp_layer, (1.0 - o_tp) * t_tp_layer, w_tp)
        a2a_x = K.exposed(F, t_a2a_layer, (1.0 - o_ep) * t_a2a_layer, w_ep) if kind[0] == "moe" else 0.0   # net of SMs
        cp_x = K.exposed(F, t_cp_layer, (1.0 - o_cp) * t_cp_layer, w_cp)
        comm = (tp_x, a2a_x, cp_x) if kind[0] == "moe" else (tp_x, cp_x)
        t = K.layer_time(F, lt.total, comm, launch,
                         kind_host_time(model, kind, ep, graphed, experts_launched, call_us, recompute),
                         kind_sync_time(model, kind, ep, lt, experts_launched, recompute, call_us))
        # "other": the launch overhead and the host floor (terms/host.py), what the layer adds to its GPU time
        per_kind[kind] = (lt.total, lt.fwd, lt.bwd, lt.expert * (balance - 1.0), tp_x, a2a_x, cp_x,
                          t - (lt.total + tp_x + a2a_x + cp_x), t)
        hidden[kind] = t_a2a_layer - a2a_x if kind[0] == "moe" else 0.0
    head = head_time(eff, model, s, mbs, tp, cp, False)
    mtp_extra = head_time(eff, model, s, mbs, tp, cp, True) if model.mtp_layers else None

    t_offload = offload_time(model, config, training, gpu.host_link_gbps_uni, layer_times)

    # --- per pipeline rank ----------------------------------------------------------------------
    ranks = [_rank_microbatch(inv, per_kind, head, mtp_extra, tp, ep * etp, t_offload if pp == 1 else 0.0)
             for inv in inventory]
    n = len(ranks)
    mean = {k: sum(r[k] for r in ranks) / n for k in ("compute", "tp", "ep", "cp", "other", "offload", "t_mb")}
    ci, t_mb_max = K.critical(F, [r["t_mb"] + r["expert_excess"] for r in ranks])
    crit = ranks[ci]

    # --- pipeline, data parallel, optimizer: the step ---------------------------------------------
    pp_shape = shapes.get("pp")
    p2p_one = PPL.hop_p2p(fabric, p2p_bytes(mbs, s, cp, tp, h), pp_shape, vpp) if pp > 1 else 0.0
    dp_x, rs_d, rs_e, ag_d, ag_e = _data_parallel(config, training, rec, fabric, shapes, par, crit, m)
    shard = crit["dense_params"] / max(dp * cp, 1) + crit["expert_params"] / max(edp, 1)
    t_opt = OPT.optimizer_time(shard, eff.hbm_bps)
    extra = [term.seconds(K.TermContext(model, cluster, training, profile, fabric),
                          _term_values(term, config, training, world, dispatcher)) for term in K.EXTRA_TERMS]
    core, p2p = K.pipeline(F, m, PPL.bubble_factor(pp, vpp), t_mb_max, p2p_one,
                           PPL.p2p_transfers(pp, vpp, int(round(m)), par("pp.overlap")))
    unpaired = K.unpaired_a2a(F, EA.unpaired_passes(pp, vpp, m), sum(n * hidden[k] for k, n in inventory[0].kinds))

    bd = _breakdown(m, mean, PPL.bubble_factor(pp, vpp) * t_mb_max, t_mb_max, p2p, dp_x, t_opt, extra)
    bd["ep_a2a"] += unpaired
    total = K.step(F, core, p2p, dp_x, t_opt, [unpaired] + extra)
    bd["sync"] = SYNC.sync_time(total, world)   # the wait for the slowest of the world's GPUs (terms/sync.py)
    total += bd["sync"]
    details = dict(microbatches=m, dp=dp, edp=edp, t_microbatch_max=t_mb_max, eff_lp=eff.eff_lp,
                   eff_bf16=eff.eff_bf16, tp_layer_s=t_tp_layer, a2a_layer_s=t_a2a_layer, cp_layer_s=t_cp_layer,
                   dp_raw_s=rs_d + rs_e + ag_d + ag_e, dp_rs_s=rs_d + rs_e, dp_ag_s=ag_d + ag_e,
                   t_fwd_mb=crit["fwd"], t_bwd_mb=crit["bwd"], rank_t_mb=[r["t_mb"] for r in ranks],
                   offload_mb_s=t_offload)
    return StepTime(step_time_s=total, breakdown=bd, microbatches=m, details=details)
