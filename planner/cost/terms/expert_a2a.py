"""Expert-parallel token dispatch and combine, priced as each dispatcher moves the bytes.

Per MoE layer and micro-batch each EP rank holds ``T_r = mbs * s / (cp * tp)`` tokens (sequence
parallel shards them over TP). Dispatch sends every token to the ranks hosting its top-k experts,
combine returns the weighted outputs: forward dispatch + combine and their backward mirror give 4
transfers. What one rank sends, in copies of one token (``h`` elements, ``b_d`` bytes each for
dispatch: 1 + 4/128 with FP8 dispatch and its scales, else 2; BF16 combine)::

    alltoall  (Megatron's NCCL all-to-all): one copy per token-expert pair, top_k copies, spread
              over the EP group: (g-1)/ep of them over NVLink, (ep-g)/ep through the NIC
    allgather (Megatron's all-gather dispatcher): every rank gathers all ep * T_r tokens and
              reduce-scatters the outputs (Fabric.all_gather / reduce_scatter)
    flex-deepep, flex-hybridep (DeepEP normal kernels, HybridEP): one copy per distinct destination;
              inside one NVLink domain a token goes once to each of the R ranks it reaches,
              R (1 - 1/ep) of them remote; across domains it crosses once to each remote domain it
              reaches over RDMA, N (1 - 1/D) copies through the NIC, and the receiving GPU forwards
              it over NVLink to the ranks there, R (g-1)/g copies

``R`` and ``N`` are the expected distinct ranks and NVLink domains a token reaches:
``topologies.collectives.distinct_destinations`` with the model's node-limited routing (``n_group``,
``topk_group``: DeepSeek-V3 sends a token to at most 4 of 8 expert groups) over EP placement (rank
r holds experts [r E/ep, (r+1) E/ep), a domain ``g`` consecutive ranks). The bytes are priced by
``Fabric.ep_dispatch`` (NVLink at the DeepEP rate, RDMA at 0.9 of line rate, both streams at once),
the NCCL all-to-all by ``Fabric.all_to_all``.

Overlap: ``ep.overlap`` of the transfers hides behind the other micro-batch's compute (Megatron's
1F1B A2A overlap) or the shared experts, bounded by the layer's compute. The hidden part is not
free: the communication kernels hold SMs (``COMM_SMS``; DeepEP's 20 of 132 on H100) that the GEMMs
overlapped with them lose, so the hidden seconds cost ``sms / sm_count`` of themselves in compute.
"""

from __future__ import annotations

from topologies.collectives import distinct_destinations

from planner.cost.terms import exposed

DISPATCH_FP8_BYTES = 1.0 + 4.0 / 128.0   # FP8 element plus one FP32 scale per 128 (DeepEP, HybridEP)
# SMs a communication kernel holds while it runs: Megatron's DeepEP default (moe_deepep_num_sms,
# "historical default 20", megatron-core 0.19 transformer_config.py; HybridEP takes the same knob,
# moe_flex_dispatcher_num_sms). The NCCL all-to-all is assumed to hold as many (one CTA per channel).
COMM_SMS = 20
# SMs per GPU: H100/H200/H800 SXM 132 (NVIDIA H100 whitepaper); B200 148 (NVIDIA Blackwell
# tuning guide); B300/GB300 and GB200 assumed the same as B200.
SM_COUNT = {"h100": 132, "h200": 132, "h800": 132, "b200": 148, "gb200": 148, "b300": 148, "gb300": 148}


def impl_of(dispatcher: str) -> str:
    """The transfer kind of a dispatcher: 'deepep' (flex backends), 'allgather' or 'nccl'."""
    if dispatcher.startswith("flex"):
        return "deepep"
    return "allgather" if dispatcher == "allgather" else "nccl"


def destinations(model, ep: int, per_domain: int) -> tuple[float, float]:
    """(R, N): expected distinct EP ranks and NVLink domains (``per_domain`` ranks each) a token's
    experts lie on, under the model's group-limited routing."""
    E, k = model.num_experts, model.top_k
    per_rank = max(1, E // ep)
    g = max(1, min(per_domain, ep))
    return (distinct_destinations(E, k, model.n_group, model.topk_group, per_rank),
            distinct_destinations(E, k, model.n_group, model.topk_group, per_rank * g))


def copies(model, ep: int, per_domain: int, domains: int, dispatcher: str) -> tuple[float, float]:
    """(NVLink copies, NIC copies) of one token a rank sends in a dispatch (the combine mirrors it).
    The NCCL all-to-all and all-gather dispatchers return (top_k, 0) and (ep, 0): their split over
    the links is the fabric's (``all_to_all`` / ``all_gather``)."""
    if ep <= 1:
        return 0.0, 0.0
    impl = impl_of(dispatcher)
    if impl == "nccl":
        return float(model.top_k), 0.0
    if impl == "allgather":
        return float(ep), 0.0
    R, N = destinations(model, ep, per_domain)
    if domains <= 1:
        return R * (1.0 - 1.0 / ep), 0.0
    g = max(1, min(per_domain, ep))
    return R * (g - 1) / g, N * (1.0 - 1.0 / domains)


def dispatch_bytes(low_precision: bool, fp8_dispatch: bool) -> float:
    """Bytes per element of a dispatched token: FP8 with its scales, or BF16."""
    return DISPATCH_FP8_BYTES if (low_precision and fp8_dispatch) else 2.0


def a2a_time(fabric, shape, model, tokens_per_rank: float, dispatcher: str, dispatch_b: float,
             combine_b: float = 2.0, cross_domain_scale: float = 1.0) -> float:
    """Seconds of forward + backward dispatch and combine of one MoE layer and micro-batch.

    ``cross_domain_scale`` multiplies the time when the group spans NVLink domains (an
    ``ExpertBalance`` whose cross-domain traffic differs from uniform routing).
    """
    if shape is None or shape.size <= 1:
        return 0.0
    ep, h = shape.size, model.hidden_size
    impl = impl_of(dispatcher)
    nvl, net = copies(model, ep, shape.per_domain, shape.domains, dispatcher)
    one = tokens_per_rank * h
    if impl == "nccl":
        t = (fabric.all_to_all(shape, one * nvl * dispatch_b, impl="nccl")
             + fabric.all_to_all(shape, one * nvl * combine_b, impl="nccl"))
    elif impl == "allgather":
        t = fabric.all_gather(shape, one * ep * dispatch_b) + fabric.reduce_scatter(shape, one * ep * combine_b)
    else:
        t = (fabric.ep_dispatch(shape, one * nvl * dispatch_b, one * net * dispatch_b)
             + fabric.ep_dispatch(shape, one * nvl * combine_b, one * net * combine_b))
    t *= 2.0
    if shape.domains > 1:
        t *= cross_domain_scale
    return t


def sm_share(gpu_name: str) -> float:
    """Fraction of the GPU's SMs the dispatch and combine kernels hold while they run."""
    return COMM_SMS / SM_COUNT.get(gpu_name.lower(), 132)


def overlap_with_sms(overlap: float, sm_fraction: float) -> float:
    """The overlap of the all-to-all net of the SMs it takes: the hidden seconds slow the GEMMs that
    run alongside by ``sm_fraction`` of themselves, so only ``overlap * (1 - sm_fraction)`` of the
    transfer is really hidden."""
    return overlap * (1.0 - sm_fraction)


def unpaired_passes(pp: int, vpp: int, m: float) -> float:
    """Micro-batches' worth of a pipeline rank's passes whose all-to-all the EP overlap cannot hide.
    Megatron's overlap (``overlap_moe_expert_parallel_comm``, the combined 1F1B schedule) hides a forward's
    all-to-all behind another micro-batch's backward and the other way round (megatron-core core_v0.17.1, commit
    266f1c97, ``pipeline_parallel/combined_1f1b.py``:39-53). With pipelining it needs the interleaved schedule
    (``transformer/transformer_config.py``:2099-2103: vpp must be set when pp > 1). That schedule runs rank r's
    ``W`` warm-up forwards alone (``schedules.py``:1439), pairs forward ``k + W`` with backward ``k`` for the
    other ``m vpp - W`` chunk passes (:1594-1596, :1746-1748) and runs the last ``W`` backwards alone
    (:1810-1868). ``W = 2 (pp - r - 1) + (vpp - 1) g + 1``, at most ``m vpp`` (``get_pp_rank_microbatches``,
    :811-835: the ``+ 1`` is the overlap's extra forward; ``g = microbatch_group_size_per_vp_stage``, default pp,
    ``model_parallel_config.py``:444-445). Without pipelining the first forward and the last backward run alone
    (``combined_1f1b.py``:56, :98): ``W = 1``, the same formula at pp = vpp = 1. Returns ``min(m vpp, W) / vpp``
    at r = 0: W forwards and W backwards of a rank's ``vpp`` chunks are ``W / vpp`` micro-batches' worth of its
    all-to-all. Rank 0 warms up longest; ``steptime`` prices the step's exposure there."""
    pp, vpp = max(int(pp), 1), max(int(vpp), 1)
    warm = 2 * (pp - 1) + (vpp - 1) * pp + 1
    return min(m * vpp, warm) / vpp


def window_with_sms(window: float, sm_fraction: float) -> float:
    """The compute an all-to-all can hide behind, at the speed the GEMMs keep while the
    communication kernels hold ``sm_fraction`` of the SMs."""
    return window * (1.0 - sm_fraction)


def a2a_exposed(t_a2a: float, overlap: float, t_compute: float, sm_fraction: float = 0.0) -> float:
    """Exposed seconds: what does not hide, ``x = exposed(t, o, w)``, plus the compute slowed while the
    hidden part holds ``f`` of the SMs, ``x + (t - x) f``. Since ``(1 - o + o f) t >= f t`` that equals
    ``exposed(t, o (1 - f), (1 - f) w)``, the form the plan program tabulates."""
    return exposed(t_a2a, overlap_with_sms(overlap, sm_fraction), window_with_sms(t_compute, sm_fraction))
