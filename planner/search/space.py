"""The declared decision space of ``topoplan plan``: candidate values per choice, and the trainers'
rules as tables over the few choices each rule reads.

A layout is one value per variable in ``VARIABLES``:

==============  ==========================================================================
``tp``          tensor parallel degree: powers of two up to 8 (and the NVLink domain) that
                divide the query heads and KV heads
``cp``          context parallel degree: 1, 2, 4, 8 with seq_len % (2 cp) == 0
``pp``          pipeline ranks: 1, 2, 3, 4, 6, 8, 9, 12, 16, 18, 24, 32, 36, 48, 64 (at most the
                decoder layers)
``vpp``         virtual stages per pipeline rank: 1, 2, 4, 8 (``pp * vpp <= layers``)
``split``       pipeline layout: 0 = balanced, 1 = last stage light (holds MTP + loss),
                2 = first and last stages light (embedding, MTP + loss); uneven splits are
                offered only when they differ from the balanced one
``ep``          expert parallel degree: divisors of the expert count (1 for a dense model)
``etp``         expert tensor parallel degree: ``None`` (= TP, Megatron's default) or 1
``dp``          data parallel replicas: divisors of the global batch (GBS % (MBS*DP) == 0)
``mbs``         micro-batch size: 1, 2, 4 (8 for models under 20 B parameters)
``recompute``   none, selective sets fitting the model (core_attn, moe_act, mla_up_proj...),
                full
``fsdp``        False: distributed optimizer (ZeRO-1); True: fully sharded parameters
``dispatcher``  MoE token dispatcher the stack offers (alltoall, flex-deepep, flex-hybridep)
``gbs``         global batch: the fixed value, or round values in the user's range
                (m * 2^k for m in 1, 3, 5 plus both ends)
``gpd``         GPUs used per NVLink domain: all, or the largest multiple of 2^k below the
                domain size (72 -> 64), so power-of-two groups stay inside a domain
==============  ==========================================================================

The world size is ``tp * cp * pp * dp`` and may be smaller than the GPUs offered.

Each rule of ``planner.rules`` is turned into an allowed-tuples table over the variables it
reads (``RULE_VARS``); the other fields are set to neutral values (1, None). Where a rule reads
the world size, ``world = tp * cp * pp * dp`` with the variables it does not list at 1; the
comment at each entry says why that projection is exact. tests/test_plan_space.py checks the
conjunction of these tables against ``rules.violations`` on random full layouts.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from planner.trainers import get_trainer
from planner.config import ParallelConfig, Training, parallel_config

VARIABLES = ("tp", "cp", "pp", "vpp", "split", "ep", "etp", "dp", "mbs", "recompute", "fsdp",
             "dispatcher", "gbs", "gpd")

# Which variables each trainer rule reads. world = tp*cp*pp*dp by construction.
RULE_VARS: dict[str, tuple[str, ...]] = {
    # world % (tp*pp*cp) == 0 holds by construction; the table is over all four anyway.
    "world_div_model_parallel": ("tp", "cp", "pp", "dp"),
    "dp_matches_world": ("tp", "cp", "pp", "dp"),
    "heads_div_tp": ("tp",),
    "kv_heads_div_tp": ("tp",),
    "mixer_heads_div_tp_cp": ("tp", "cp"),   # Gated DeltaNet / Mamba-2 heads over tp*cp; the model is fixed
    "kv_heads_tp_megatron": ("tp",),
    "experts_div_ep": ("ep",),
    # world % (etp*ep*pp) with world = tp*cp*pp*dp: pp cancels, so it reads tp, cp, dp, ep, etp.
    "expert_grid_div_world": ("tp", "cp", "dp", "ep", "etp"),
    "etp_only_for_moe": ("tp", "etp"),
    "pipeline_stages": ("pp", "vpp", "split"),
    "seq_div_2cp": ("cp",),
    # dp = world / (tp*pp*cp) is the dp variable: reads dp, mbs, gbs.
    "gbs_div_mbs_dp": ("dp", "mbs", "gbs"),
    "torchtitan_no_etp": ("tp", "etp", "ep"),
    # dp_shard = world / (tp*pp*cp) = dp; reads dp, cp, tp, ep.
    "torchtitan_ep_divides": ("tp", "cp", "dp", "ep"),
    # etp_eff = etp or tp; the model's expert biases are fixed.
    "moe_bias_needs_etp1": ("tp", "etp"),
    # dp = world / (tp*pp*cp) is the dp variable: reads dp, ep.
    "maxtext_ep_divides_dp": ("dp", "ep"),
    # equal chunks (split), the model's dense layers, M = gbs / (mbs * dp) divisible by pp.
    "maxtext_pipeline_layout": ("pp", "vpp", "split", "dp", "mbs", "gbs"),
    # Recipe settings (planner.trainers.megatron.rules.RECIPE_RULES) read only these layout choices; the model is fixed.
    "cpu_offloading_layout": ("pp", "recompute"),
    "fp8_param_gather_recipe": ("fsdp",),
    "optimizer_offload_layout": ("fsdp",),   # the offload fraction is the recipe's, fixed per search
    "fp4_param_gather_recipe": (),   # the precision alone decides
    "fp8_recipe_precision": (),      # the precision and the recipe alone decide
    "cuda_graphs_vs_recompute": ("recompute", "pp", "ep"),
    "cuda_graph_modules": ("recompute",),
    "moe_a2a_overlap_layout": ("ep", "dispatcher", "recompute", "pp", "vpp", "fsdp"),
    "delay_wgrad_needs_a2a_overlap": ("ep", "dispatcher", "recompute", "pp", "vpp", "fsdp"),
    "tp_comm_overlap_needs_sp": ("tp",),
    "expert_bias_needs_sigmoid_router": ("ep",),
    "torch_fsdp2_layout": ("fsdp", "pp", "ep"),
    # M = gbs / (mbs * dp), dp = world / (tp*pp*cp) is the dp variable; the schedule reads pp, vpp, M.
    "megatron_interleaved_microbatches": ("pp", "vpp", "dp", "mbs", "gbs"),
    "torchtitan_pipeline_microbatches": ("pp", "vpp", "dp", "mbs", "gbs"),
}

# Pipeline degrees: the factors of 2^a * 3^b up to 64 (GPU counts are powers of two or multiples of
# the 72-GPU NVL72 rack), and the virtual stages NVIDIA's recipes use.
PP_CANDIDATES = (1, 2, 3, 4, 6, 8, 9, 12, 16, 18, 24, 32, 36, 48, 64)
VPP_CANDIDATES = (1, 2, 4, 8)

_NEUTRAL = {"tp": 1, "cp": 1, "pp": 1, "vpp": 1, "split": 0, "ep": 1, "etp": None, "dp": 1, "mbs": 1,
            "recompute": "none", "fsdp": False, "dispatcher": "alltoall", "gbs": None, "gpd": None}


@dataclass
class Space:
    """Candidate values per variable, in VARIABLES order, and the context they were built for."""

    values: dict[str, list]
    num_layers: int
    gpus: int
    domain_sizes: list[int]
    trainer: str
    notes: list[str] = field(default_factory=list)

    def size(self) -> int:
        return math.prod(len(v) for v in self.values.values())

    def domain(self, var: str) -> list:
        return self.values[var]


def split_layers(num_layers: int, pp: int, vpp: int, split: int) -> tuple[int | None, int | None] | None:
    """(pp_first, pp_last) of split option ``split``, or None when the option does not exist here.

    Stages s = pp*vpp, m = ceil(L / s) layers on the middle stages.
    1 = last stage light: first = m, last = L - m (s - 1) (1 <= last < m).
    2 = both ends light: first = m - 1, last = L - (m - 1) - m (s - 2) (1 <= last < m).
    """
    if split == 0:
        return (None, None)
    s = pp * vpp
    if pp < 2 or s < 2:
        return None
    m = -(-num_layers // s)
    if split == 1:
        first, last = m, num_layers - m * (s - 1)
    elif split == 2:
        first = m - 1
        last = num_layers - first - m * (s - 2)
    else:
        return None
    if first < 1 or not (1 <= last < m) or (num_layers % s == 0 and split == 1):
        return None
    if last > m or first > m:
        return None
    return (first, last)


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def gbs_candidates(gbs: int, gbs_range: tuple[int, int] | None) -> list[int]:
    if gbs_range is None:
        return [gbs]
    lo, hi = gbs_range
    out = {lo, hi}
    for m in (1, 3, 5):
        k = 0
        while m * 2 ** k <= hi:
            if m * 2 ** k >= lo:
                out.add(m * 2 ** k)
            k += 1
    return sorted(out)


def gpd_candidates(domain_sizes: list[int]) -> list[int | None]:
    """None (every healthy GPU) and smaller per-domain counts that keep power-of-two groups whole."""
    if not domain_sizes:
        return [None]
    dmax = max(domain_sizes)
    out: list[int | None] = [None]
    seen = {dmax}
    k = 1
    while 2 ** k <= dmax:
        g = (dmax // 2 ** k) * 2 ** k
        if g not in seen and g >= dmax // 2:
            out.append(g)
            seen.add(g)
        k += 1
    return out


def recompute_candidates(model, trainer: str) -> list[str]:
    if not get_trainer(trainer).search.selective_recompute:
        return ["none", "core_attn", "full"]
    out = ["none", "core_attn"]
    if model.is_moe:
        out.append("moe_act")
        if model.attention == "mla":
            out.append("mla_up_proj+moe_act")
        else:
            out.append("core_attn+moe_act")
    else:
        out.append("core_attn+mlp")
    out.append("full")
    return out


def dispatcher_candidates(model, trainer: str, offered: tuple[str, ...] | None = None) -> list[str]:
    if not model.is_moe:
        return ["alltoall"]
    if not get_trainer(trainer).search.flex_dispatchers:
        return ["alltoall"]
    offered = offered or ("alltoall", "flex-deepep", "flex-hybridep")
    return list(offered)


def build_space(model, training: Training, gpus: int, domain_sizes: list[int], *,
                gbs_range: tuple[int, int] | None = None, trainer: str | None = None,
                dispatchers: tuple[str, ...] | None = None, nvlink_domain: int | None = None,
                total_params: float | None = None, extra: dict | None = None) -> Space:
    """Candidate values for every variable before any table prunes them.

    ``extra`` adds values (for example NVIDIA's published layout) so that a reference layout is
    always inside the space.
    """
    trainer = trainer or training.trainer
    L = model.num_layers
    tp_max = min(8, nvlink_domain or 8)
    tp = [t for t in _pow2_upto(tp_max)
          if model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0]
    cp = [c for c in (1, 2, 4, 8) if c == 1 or training.seq_len % (2 * c) == 0]
    pp = [p for p in PP_CANDIDATES if p <= L and p <= gpus]
    vpp = [v for v in VPP_CANDIDATES if v <= L]
    ep = [e for e in _divisors(model.num_experts) if e <= gpus] if model.is_moe else [1]
    etp = [None, 1] if (model.is_moe and get_trainer(trainer).search.expert_tp) else [None]
    gbs = gbs_candidates(training.global_batch, gbs_range)
    dp = sorted({d for g in gbs for d in _divisors(g) if d <= gpus})
    big = total_params is not None and total_params >= 20e9
    mbs = [1, 2, 4] if big else [1, 2, 4, 8]
    rc = recompute_candidates(model, trainer)
    fsdp = list(get_trainer(trainer).search.fsdp)
    disp = dispatcher_candidates(model, trainer, dispatchers)
    gpd = gpd_candidates(domain_sizes)
    values = dict(tp=tp, cp=cp, pp=pp, vpp=vpp, split=[0, 1, 2], ep=ep, etp=etp, dp=dp, mbs=mbs,
                  recompute=rc, fsdp=fsdp, dispatcher=disp, gbs=gbs, gpd=gpd)
    for k, vs in (extra or {}).items():
        for v in vs:
            if v not in values[k]:
                values[k].append(v)
        if k not in ("etp", "recompute", "dispatcher", "gpd", "fsdp"):
            values[k].sort()
    return Space(values=values, num_layers=L, gpus=gpus, domain_sizes=list(domain_sizes), trainer=trainer)


def config_of(space: Space, assignment: dict) -> tuple[ParallelConfig, int, int, int | None]:
    """(ParallelConfig, world, gbs, gpus_per_domain) for one assignment {var: value}."""
    a = dict(_NEUTRAL)
    a.update(assignment)
    sp = split_layers(space.num_layers, a["pp"], a["vpp"], a["split"])
    first, last = sp if sp else (None, None)
    cfg = parallel_config(a["tp"], a["pp"], a["vpp"], a["cp"], a["ep"], a["etp"], a["dp"], a["mbs"], a["fsdp"],
                          a["recompute"], a["dispatcher"], first, last)
    world = a["tp"] * a["cp"] * a["pp"] * a["dp"]
    return cfg, world, a["gbs"], a["gpd"]


def structural_ok(space: Space, a: dict) -> bool:
    """Canonical-form constraints that are not trainer rules (no two assignments mean the same run)."""
    if "vpp" in a and "pp" in a and a["vpp"] > 1 and a["pp"] < 2:
        return False   # vpp needs pp >= 2 (ParallelConfig)
    if "etp" in a and "tp" in a and a["etp"] == 1 and a["tp"] == 1:
        return False   # etp=1 is etp=None when tp=1
    if "split" in a and "pp" in a and "vpp" in a:
        if split_layers(space.num_layers, a["pp"], a["vpp"], a["split"]) is None:
            return False
    return True


def rule_tables(space: Space, model, training: Training) -> list[tuple[tuple[str, ...], list[tuple]]]:
    """For every rule of the target trainer: (variables, allowed tuples of candidate *indices*).

    Rules that read the same variables share one walk over their tuples (one ParallelConfig each). A
    rule that does not apply to the request (``Rule.applies``: e.g. a recipe setting left on auto)
    allows every tuple; when no rule of a walk reads the layout, the walk builds no ParallelConfig."""
    rules = list(get_trainer(space.trainer).rules)
    for rule in rules:
        if rule.name not in RULE_VARS:
            raise KeyError(f"planner.search.space.RULE_VARS has no entry for trainer rule {rule.name!r}")
    by_vars: dict[tuple[str, ...], list] = {}
    for rule in rules:
        by_vars.setdefault(RULE_VARS[rule.name], []).append(rule)
    allowed: dict[str, list] = {rule.name: [] for rule in rules}
    trainings: dict = {None: training}
    for vars_, group in by_vars.items():
        # the global batch is one of the walk's variables or the request's: applies reads the request's
        idle = "gbs" not in vars_ and all(r.applies is not None and not r.applies(model, training) for r in group)
        for idx in itertools.product(*(range(len(space.values[v])) for v in vars_)):
            a = {v: space.values[v][i] for v, i in zip(vars_, idx)}
            if not structural_ok(space, a):
                continue
            if idle:
                for rule in group:
                    allowed[rule.name].append(idx)
                continue
            cfg, world, gbs, _ = config_of(space, a)
            tr = trainings.get(gbs)
            if tr is None:
                tr = trainings[gbs] = training.model_copy(update={"global_batch": gbs})
            for rule in group:
                if rule.check(model, cfg, tr, world) is None:
                    allowed[rule.name].append(idx)
    return [(RULE_VARS[rule.name], allowed[rule.name]) for rule in rules]


def structural_tables(space: Space) -> list[tuple[tuple[str, ...], list[tuple]]]:
    out = []
    for vars_ in (("pp", "vpp", "split"), ("tp", "etp")):
        allowed = [idx for idx in itertools.product(*(range(len(space.values[v])) for v in vars_))
                   if structural_ok(space, {v: space.values[v][i] for v, i in zip(vars_, idx)})]
        out.append((vars_, allowed))
    return out
