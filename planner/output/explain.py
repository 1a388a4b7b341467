"""Terminal explanations of a plan: why the winner wins, where its time and memory go, where it sits.

Everything here reads the **plan document** (``planner.search.document.PlanDocument``, what
``PlanResult.to_dict()`` writes; see docs/architecture.md) or parts of it, so the same code explains
a fresh ``topoplan plan`` and a saved plan file; ``render_plan`` validates the document first (a bad
one is refused naming the field). Nothing here predicts or solves; it only renders numbers that the
planner already computed.

The API, for ``topoplan plan`` and friends (all renderables are ``rich`` objects; ``.plain`` gives
the text without colour):

``categorize(breakdown, step_time_s=None) -> dict[str, float]``
    Folds a prediction's ``breakdown`` (the step-time model's terms, ``planner.cost.steptime.TERMS``,
    -> seconds) into the categories in ``CATEGORIES`` through ``TERM_CATEGORY``, the one mapping
    from term to category: compute, exposed TP, exposed CP, exposed EP all-to-all, expert
    imbalance, pipeline bubble and P2P, exposed DP, optimizer, other. A term the model does not
    emit is refused (InputError). With ``step_time_s`` the gap between the step time and the sum
    of the terms goes to "other" (when positive), so the bar adds up to the step time.
``breakdown_bar(breakdown, step_time_s=None, width=40) -> Text``
    One stacked bar of those categories plus a legend with milliseconds and percentages.
``memory_bar(used_gib, hbm_gib, width=30) -> Text``
    Memory per GPU against HBM; red and marked "does not fit" above capacity.
``why_not(best, alt, domain_word="domains") -> str``
    One line saying why ``alt`` (a plan entry) lost to ``best``: "TP2 PP8 EP32: 6% slower, EP
    all-to-all crosses racks". The reason is the breakdown category that grew most, made concrete
    with the placement (a group spanning several domains) or the layout (PP, VPP, DP degree).
``why_not_lines(doc, n=3, rejected=None) -> list[str]``
    Those lines for the runners-up in ``doc["plans"][1:]`` and for any extra alternatives a caller
    passes in ``rejected`` (plan entries that may carry a ``"reason"`` string, e.g. "does not fit:
    212 GiB > 186 GiB"; a given reason is used verbatim).
``placement_map(plan, domain_sizes, max_rows=12) -> Text``
    A compact map: one row per NVLink domain (rack or node), one glyph per GPU showing its
    pipeline stage (0-9, a-z), unused or failed GPUs as ``.``; runs of identical rows collapse.
``domain_sizes_of(doc) -> list[int]``
    Healthy GPUs per NVLink domain of the document's ``cluster`` (``Cluster.domain_sizes()``).
``render_plan(doc, console=None, top=None, hbm_gib=None, rejected=None)``
    Prints all of the above for the top plans: a table, then per plan its bar, memory and map,
    then the "why not" lines.

Rank arithmetic follows Megatron's ``RankGenerator``: in the order string (default
``tp-cp-ep-dp-pp``) the first axis varies fastest. The attention grid uses tp, cp, dp, pp (ep is
1 there); the expert grid uses etp (in tp's place), ep, edp (in dp's place), pp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from planner.config import ParallelConfig
from planner.cost.compose import EXTRA_TERMS
from planner.errors import InputError
from planner.search.document import PlanDocument, load_document
from planner.search.offload import offload_line
from topologies.cluster import Cluster
from topologies.hostlist import compress

# Every term of the step-time model's breakdown (planner.cost.steptime.TERMS) and the category its
# seconds are drawn in; tests/test_report.py checks that the keys are exactly the model's terms.
TERM_CATEGORY: dict[str, str] = {
    "compute": "compute",
    "tp_comm": "tp",
    "cp_comm": "cp",
    "ep_a2a": "ep",
    "imbalance": "imbalance",   # slowest pipeline rank over the mean, busiest expert GPU over the mean
    "pp_bubble": "bubble",
    "pp_p2p": "bubble",
    "dp_comm": "dp",
    "optimizer": "optimizer",
    "other": "other",           # per-layer launch overhead (and, in the bar, any unexplained remainder)
    "offload": "other",         # CPU activation offload copies that the layers' compute does not hide
    "sync": "sync",             # the wait for the slowest of the world's GPUs (terms/sync.py)
    **{t.name: t.category for t in EXTRA_TERMS},   # planner.cost.compose: each term says where it is drawn
}
# The categories of a step, in drawing order, with their label and colour (rich and matplotlib both
# understand these names).
CATEGORIES: tuple[str, ...] = ("compute", "tp", "cp", "ep", "imbalance", "bubble", "dp", "optimizer", "sync", "other")
CATEGORY_LABELS: dict[str, str] = {
    "compute": "compute",
    "tp": "exposed TP",
    "cp": "exposed CP",
    "ep": "exposed EP all-to-all",
    "imbalance": "expert imbalance",
    "bubble": "pipeline bubble and P2P",
    "dp": "exposed DP",
    "optimizer": "optimizer",
    "sync": "slowest-GPU wait",
    "other": "other",
}
CATEGORY_COLORS: dict[str, str] = {
    "compute": "#4c78a8",
    "tp": "#f58518",
    "cp": "#9d755d",
    "ep": "#e45756",
    "imbalance": "#eeca3b",
    "bubble": "#72b7b2",
    "dp": "#54a24b",
    "optimizer": "#b279a2",
    "sync": "#ff9da6",
    "other": "#b8b8b8",
}

# Prose names of the step-time terms for the terminal (JSON keeps the keys of TERM_CATEGORY)
TERM_LABELS: dict[str, str] = {
    "compute": "compute",
    "tp_comm": "exposed TP",
    "cp_comm": "exposed CP",
    "ep_a2a": "exposed EP all-to-all",
    "imbalance": "expert imbalance",
    "pp_bubble": "pipeline bubble",
    "pp_p2p": "pipeline P2P",
    "dp_comm": "exposed DP",
    "optimizer": "optimizer",
    "other": "other",
    "offload": "exposed CPU offload",
    "sync": "slowest-GPU wait",
    "cpu_optimizer": "CPU optimizer (offload)",
    "fp8_amax": "FP8 amax all-reduce",
}

# Prose names of the memory components (planner.cost.memory's breakdown keys) for the terminal
MEMORY_LABELS: dict[str, str] = {
    "weights": "weights",
    "weight_copies": "weight copies",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "fsdp_buffers": "FSDP gather buffers",
    "activations": "activations",
    "expert_imbalance": "expert imbalance",
    "cuda_graphs": "CUDA graphs",
    "logits": "logits",
    "reserve": "reserve",
}

_STAGE_GLYPHS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_STAGE_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")

def category_of(term: str) -> str:
    """The category (one of ``CATEGORIES``) of a step-time term; InputError for any other name."""
    try:
        return TERM_CATEGORY[term]
    except KeyError:
        raise InputError(f"breakdown term {term!r} is not a term of the step-time model; the terms are "
                         f"{', '.join(TERM_CATEGORY)} (write the plan again with 'topoplan plan --save-plan')") from None


def categorize(breakdown: Mapping | None, step_time_s: float | None = None) -> dict[str, float]:
    """Seconds per category (every key of ``CATEGORIES`` present), each the sum of its terms. With
    ``step_time_s`` any positive remainder goes to "other"."""
    out = {c: 0.0 for c in CATEGORIES}
    for name, secs in (breakdown or {}).items():
        out[category_of(name)] += float(secs)
    if step_time_s is not None:
        gap = float(step_time_s) - sum(out.values())
        if gap > 1e-12:
            out["other"] += gap
    return out


def _fmt_s(secs: float) -> str:
    if secs >= 1.0:
        return f"{secs:.2f} s"
    return f"{secs * 1e3:.1f} ms"


def breakdown_bar(breakdown: Mapping | None, step_time_s: float | None = None, width: int = 40,
                  line_width: int | None = None) -> Text:
    """A stacked bar of the categories (``width`` cells) followed by a legend line; with
    ``line_width`` the legend breaks between items (never inside one) to stay within it."""
    cats = categorize(breakdown, step_time_s)
    total = sum(cats.values())
    text = Text()
    if total <= 0:
        text.append("(no breakdown)", style="dim")
        return text
    # largest-remainder rounding so that the cells add up to exactly ``width``
    raw = {c: cats[c] / total * width for c in CATEGORIES}
    cells = {c: int(raw[c]) for c in CATEGORIES}
    for c in sorted(CATEGORIES, key=lambda c: raw[c] - cells[c], reverse=True)[: width - sum(cells.values())]:
        cells[c] += 1
    for c in CATEGORIES:
        if cells[c]:
            text.append("█" * cells[c], style=CATEGORY_COLORS[c])
    text.append(f"  {_fmt_s(total)}\n")
    legend = []
    for c in CATEGORIES:
        if cats[c] > 0:
            legend.append((c, f"{CATEGORY_LABELS[c]} {_fmt_s(cats[c])} ({cats[c] / total:.0%})"))
    col = 0
    for i, (c, label) in enumerate(legend):
        if i and line_width and col + 2 + len(label) + 2 > line_width:
            text.append("\n")
            col = 0
        elif i:
            text.append("  ")
            col += 2
        text.append("■ ", style=CATEGORY_COLORS[c])
        text.append(label)
        col += 2 + len(label)
    return text


def memory_bar(used_gib: float, hbm_gib: float | None, width: int = 30) -> Text:
    """``[██████░░░░] 162.0 / 288 GiB (56%)``; red with "does not fit" above capacity."""
    text = Text()
    if not hbm_gib or hbm_gib <= 0:
        text.append(f"{used_gib:.1f} GiB per GPU (HBM capacity unknown)")
        return text
    frac = used_gib / hbm_gib
    fits = frac <= 1.0
    filled = min(width, round(frac * width))
    style = "green" if frac <= 0.9 else ("yellow" if fits else "red")
    text.append("[")
    text.append("█" * filled, style=style)
    text.append("░" * (width - filled), style="dim")
    text.append("]")
    text.append(f" {used_gib:.1f} / {hbm_gib:.0f} GiB ({frac:.0%})")
    if not fits:
        text.append(f"  does not fit: {used_gib - hbm_gib:.1f} GiB over", style="bold red")
    return text


# ---------------------------------------------------------------------------------------- layouts

def config_label(config: Mapping) -> str:
    """``TP1 PP2 VPP8 EP32`` from a plan's ``config`` dict (degrees of 1 left out except TP and PP)."""
    parts = [f"TP{config.get('tp', 1)}", f"PP{config.get('pp', 1)}"]
    for key in ("vpp", "cp", "ep"):
        v = config.get(key) or 1
        if v > 1:
            parts.append(f"{key.upper()}{v}")
    etp = config.get("etp")
    if etp is not None and etp != config.get("tp", 1):
        parts.append(f"ETP{etp}")
    if config.get("fsdp"):
        parts.append("FSDP")
    if config.get("mbs"):
        parts.append(f"MBS{config['mbs']}")
    rc = config.get("recompute")
    if rc and rc != "none":
        parts.append(f"RC:{rc}")
    return " ".join(parts)


def _extras(entry: Mapping) -> dict[str, str]:
    """Facts beyond the degrees that can tell two plans apart, as short labels."""
    cfg = entry.get("config") or {}
    pl = entry.get("placement") or {}
    per = pl.get("gpus_per_domain")
    return {
        "dispatcher": str(cfg.get("dispatcher") or ""),
        "gpus_per_domain": f"{per} GPUs per domain" if per else "domains filled",
        "order": str(pl.get("order") or ""),
        "dp": f"DP{cfg.get('dp')}" if cfg.get("dp") else "",
        "gbs": f"GBS{cfg.get('gbs')}" if cfg.get("gbs") else "",
        # an uneven pipeline split: decoder layers on the first / last stage
        "pp_split": (f"first/last stage {cfg.get('pp_first')}/{cfg.get('pp_last')} layers"
                     if cfg.get("pp_first") is not None or cfg.get("pp_last") is not None else "even PP split"),
    }


def plan_labels(entries: Sequence[Mapping]) -> list[str]:
    """``config_label`` of each entry, extended where two entries would read the same with what
    differs between them (dispatcher, GPUs used per NVLink domain, rank order, DP, GBS, the
    layers on the first and last pipeline stage)."""
    base = [config_label(e.get("config") or {}) for e in entries]
    out = list(base)
    for lab in set(base):
        idx = [i for i, b in enumerate(base) if b == lab]
        if len(idx) < 2:
            continue
        extras = [_extras(entries[i]) for i in idx]
        keys = [k for k in extras[0] if len({x[k] for x in extras}) > 1]
        for i, x in zip(idx, extras):
            extra = ", ".join(x[k] for k in keys if x[k])
            if extra:
                out[i] = f"{lab} ({extra})"
    return out


def _grid_sizes(config: Mapping, world: int, grid: str) -> dict[str, int]:
    """Axis sizes of the attention or the expert grid: the degrees of ``config`` (a plan's config or
    any subset of ParallelConfig's fields) on ``world`` ranks, derived by ``ParallelConfig.on``."""
    lay = ParallelConfig.model_validate({k: config[k] for k in ("tp", "pp", "cp", "ep", "etp")
                                         if config.get(k) is not None}).on(world)
    c = lay.config
    if grid == "attention":
        return {"tp": c.tp, "cp": c.cp, "ep": 1, "dp": lay.dp, "pp": c.pp}
    return {"tp": c.etp_eff, "cp": 1, "ep": c.ep, "dp": lay.edp, "pp": c.pp}


def rank_coords(rank: int, config: Mapping, world: int, order: str = "tp-cp-ep-dp-pp",
                grid: str = "attention") -> dict[str, int]:
    """Coordinates of a global rank on Megatron's attention or expert grid (first axis fastest)."""
    sizes = _grid_sizes(config, world, grid)
    coords = {}
    rest = rank
    for axis in order.split("-"):
        coords[axis] = rest % sizes[axis]
        rest //= sizes[axis]
    return coords


def pipeline_stage(rank: int, config: Mapping, world: int, order: str = "tp-cp-ep-dp-pp") -> int:
    return rank_coords(rank, config, world, order)["pp"]


def ep_group(rank: int, config: Mapping, world: int, order: str = "tp-cp-ep-dp-pp") -> int:
    """Index of the EP group a rank belongs to (ranks sharing every expert-grid coordinate but ep)."""
    sizes = _grid_sizes(config, world, "expert")
    c = rank_coords(rank, config, world, order, grid="expert")
    idx = 0
    for axis in order.split("-"):
        if axis == "ep":
            continue
        idx = idx * sizes[axis] + c[axis]
    return idx


def domain_sizes_of(doc) -> list[int]:
    """Healthy GPUs per NVLink domain of the plan document's cluster (a PlanDocument or its JSON)."""
    if isinstance(doc, PlanDocument):
        return list(doc.cluster.domain_sizes())
    return list(Cluster.model_validate(doc["cluster"]).domain_sizes())


def domain_names_of(doc) -> list[str]:
    """Names of the NVLink domains (``Cluster.domain_names()``), in the order of ``domain_sizes_of``."""
    if isinstance(doc, PlanDocument):
        return list(doc.cluster.domain_names())
    return list(Cluster.model_validate(doc["cluster"]).domain_names())


def _stage_glyph(stage: int) -> str:
    return _STAGE_GLYPHS[stage] if stage < len(_STAGE_GLYPHS) else "#"


def _coords_all(config: Mapping, world: int, order: str, grid: str):
    """Coordinates of every rank at once (numpy), same arithmetic as ``rank_coords``."""
    sizes = _grid_sizes(config, world, grid)
    rest = np.arange(world, dtype=np.int64)
    coords = {}
    for axis in order.split("-"):
        coords[axis] = rest % sizes[axis]
        rest = rest // sizes[axis]
    return coords, sizes


def _per_gpu_grid(plan: Mapping, domain_sizes: Sequence[int], what: str) -> list[list[int]]:
    config = plan.get("config") or {}
    pl = plan.get("placement") or {}
    rank_to_gpu = np.asarray(pl.get("rank_to_gpu") or [], dtype=np.int64)
    order = pl.get("order") or "tp-cp-ep-dp-pp"
    world = len(rank_to_gpu)
    total = int(sum(domain_sizes))
    flat = np.full(total, -1, dtype=np.int64)
    if world:
        if what == "stage":
            coords, _ = _coords_all(config, world, order, "attention")
            value = coords["pp"]
        else:  # EP group: mixed-radix index over every expert-grid axis but ep
            coords, sizes = _coords_all(config, world, order, "expert")
            value = np.zeros(world, dtype=np.int64)
            for axis in order.split("-"):
                if axis != "ep":
                    value = value * sizes[axis] + coords[axis]
        ok = (rank_to_gpu >= 0) & (rank_to_gpu < total)
        flat[rank_to_gpu[ok]] = value[ok]
    out, start = [], 0
    for n in domain_sizes:
        out.append(flat[start:start + n].tolist())
        start += n
    return out


def gpu_stage_grid(plan: Mapping, domain_sizes: Sequence[int]) -> list[list[int]]:
    """Per domain, per GPU (canonical order): the pipeline stage on it, or -1 when unused."""
    return _per_gpu_grid(plan, domain_sizes, "stage")


def gpu_ep_grid(plan: Mapping, domain_sizes: Sequence[int]) -> list[list[int]]:
    """Per domain, per GPU: the EP group index on it (``ep_group``), or -1 when unused."""
    return _per_gpu_grid(plan, domain_sizes, "ep")


def domain_word(domain_sizes: Sequence[int], plural: bool = True) -> str:
    """"racks" for NVL72-sized domains, "nodes" for HGX-sized ones."""
    big = max(domain_sizes, default=8) > 8
    return ("racks" if plural else "rack") if big else ("nodes" if plural else "node")


def _run_label(word: str, a: int, b: int, names: Sequence[str] | None) -> str:
    """``rack 3`` / ``racks 0-3``, or with the cluster's domain names ``rack gb300-r04`` /
    ``racks gb300-r[01-04]`` (a hostlist expression)."""
    if names and len(names) > b:
        if a == b:
            return f"{word} {names[a]}"
        return f"{word}s {compress(list(names[a:b + 1]))}"
    return f"{word} {a}" if a == b else f"{word}s {a}-{b}"


def placement_map(plan: Mapping, domain_sizes: Sequence[int], max_rows: int = 12,
                  names: Sequence[str] | None = None, line_width: int | None = None) -> Text:
    """One row per domain, one glyph per GPU = its pipeline stage; identical neighbours collapse.
    Domains are labelled with ``names`` (the cluster's domain names) when given, else numbered
    from 0. When a row does not fit in ``line_width`` the label goes on a line of its own."""
    grid = gpu_stage_grid(plan, domain_sizes)
    word = domain_word(domain_sizes, plural=False)
    rows: list[tuple[int, int, list[int]]] = []  # (first, last, pattern)
    for i, row in enumerate(grid):
        if rows and rows[-1][2] == row:
            rows[-1] = (rows[-1][0], i, row)
        else:
            rows.append((i, i, row))
    text = Text()
    shown = rows if len(rows) <= max_rows else rows[: max_rows - 1]
    label_w = max((len(_run_label(word, a, b, names)) for a, b, _ in shown), default=0)
    row_w = max((len(r) for _, _, r in shown), default=0)
    split = bool(line_width) and label_w + 2 + row_w + len("  72/72 GPUs") > line_width
    for a, b, row in shown:
        label = _run_label(word, a, b, names)
        used = sum(1 for s in row if s >= 0)
        if split:
            text.append(f"{label}: {used}/{len(row)} GPUs\n")
        else:
            text.append(label.ljust(label_w) + "  ")
        for s in row:
            if s < 0:
                text.append(".", style="dim")
            else:
                text.append(_stage_glyph(s), style=_STAGE_STYLES[s % len(_STAGE_STYLES)])
        text.append("\n" if split else f"  {used}/{len(row)} GPUs\n")
    if len(rows) > len(shown):
        hidden = rows[len(shown):]
        text.append(f"... {sum(b - a + 1 for a, b, _ in hidden)} more {word}s\n", style="dim")
    text.append("glyph = pipeline stage, . = unused", style="dim")
    domains = (plan.get("placement") or {}).get("domains") or {}
    if domains:
        spans = ", ".join(f"{k.upper()} {v}" for k, v in domains.items())
        text.append(f"; NVLink {word}s per group: {spans}", style="dim")
    return text


# ---------------------------------------------------------------------------------------- why not

def _pred(entry: Mapping) -> Mapping:
    return entry.get("prediction") or {}


def _throughput(entry: Mapping) -> float:
    p = _pred(entry)
    return float(p.get("tokens_per_s_per_gpu") or p.get("tflops_per_gpu") or 0.0)


def why_not(best: Mapping, alt: Mapping, domain_word: str = "domains", hbm_gib: float | None = None,
            label: str | None = None) -> str:
    """One line: why ``alt`` lost to ``best`` (both plan entries of the plan.json document)."""
    label = label or config_label(alt.get("config") or {})
    if alt.get("reason"):
        return f"{label}: {alt['reason']}"
    pa = _pred(alt)
    mem = pa.get("memory_gib_per_gpu")
    cap = pa.get("hbm_gib") or hbm_gib
    if pa.get("fits") is False or (mem is not None and cap and mem > cap):
        if mem is not None and cap:
            return f"{label}: does not fit, {mem:.0f} GiB per GPU > {cap:.0f} GiB HBM"
        return f"{label}: does not fit in HBM"
    tb, ta = _throughput(best), _throughput(alt)
    if tb <= 0 or ta <= 0:
        return f"{label}: no prediction"
    slower = 1.0 - ta / tb
    head = f"{label}: {slower:.0%} slower" if slower >= 0.005 else f"{label}: as fast (within 0.5%)"
    # per-token time per category, so that plans with different batch shapes compare fairly
    cb = categorize(_pred(best).get("breakdown"), _pred(best).get("step_time_s"))
    ca = categorize(pa.get("breakdown"), pa.get("step_time_s"))
    sb = float(_pred(best).get("step_time_s") or sum(cb.values()) or 1.0)
    sa = float(pa.get("step_time_s") or sum(ca.values()) or 1.0)
    fb = {c: cb[c] / sb for c in CATEGORIES}
    fa = {c: ca[c] / sa for c in CATEGORIES}
    # the category whose share of the step grew most; compute share shrinking is a symptom
    grew = max((c for c in CATEGORIES if c != "compute"), key=lambda c: fa[c] - fb[c])
    if fa[grew] - fb[grew] > 0.005:
        return f"{head}, {_reason(grew, alt, best, domain_word, fa[grew], fb[grew])}"
    if ca["compute"] - cb["compute"] > 0.005 * sb:  # the same step shape, more arithmetic
        extra = _fmt_s(ca["compute"] - cb["compute"])
        rc = (alt.get("config") or {}).get("recompute")
        if rc and rc != "none" and rc != (best.get("config") or {}).get("recompute"):
            return f"{head}, recompute ({rc}) adds {extra} of compute per step"
        return f"{head}, {extra} more compute per step"
    return head


def _reason(cat: str, alt: Mapping, best: Mapping, word: str, fa: float, fb: float) -> str:
    cfg = alt.get("config") or {}
    doms = (alt.get("placement") or {}).get("domains") or {}
    share = f" ({_pct_pair(fa, fb)})"
    if cat == "ep":
        if int(doms.get("ep") or 1) > 1:
            return f"EP all-to-all crosses {word}{share}"
        return f"more exposed EP all-to-all{share}"
    if cat == "tp":
        if int(doms.get("tp") or 1) > 1:
            return f"TP collectives cross {word}{share}"
        return f"more exposed TP communication{share}"
    if cat == "bubble":
        pp, vpp = int(cfg.get("pp") or 1), int(cfg.get("vpp") or 1)
        return f"larger pipeline bubble with PP{pp}" + (f" VPP{vpp}" if vpp > 1 else "") + share
    if cat == "dp":
        if int(doms.get("dp") or 1) > 1:
            return f"exposed data-parallel traffic over the scale-out fabric{share}"
        return f"more exposed data-parallel traffic{share}"
    if cat == "cp":
        cp = int(cfg.get("cp") or 1)
        if int(doms.get("cp") or 1) > 1:
            return f"CP{cp} exchange crosses {word}{share}"
        return f"more exposed context-parallel exchange with CP{cp}{share}"
    if cat == "imbalance":
        return f"more expert imbalance (the slowest rank or busiest expert GPU waits longer){share}"
    if cat == "optimizer":
        return f"longer optimizer step{share}"
    return f"more per-layer launch overhead{share}"


def _pct_pair(fa: float, fb: float) -> str:
    """"3% of the step vs 1%", with a decimal where whole percents would read the same."""
    digits = 0
    while digits < 3 and f"{fa:.{digits}%}" == f"{fb:.{digits}%}":
        digits += 1
    return f"{fa:.{digits}%} of the step vs {fb:.{digits}%}"


def why_not_lines(doc: Mapping, n: int = 3, rejected: Sequence[Mapping] | None = None,
                  hbm_gib: float | None = None) -> list[str]:
    """"Why not" lines for the best ``n`` alternatives (runners-up first, then ``rejected``)."""
    plans = list(doc.get("plans") or [])
    if not plans:
        return []
    sizes = domain_sizes_of(doc)
    word = domain_word(sizes) if sizes else "domains"
    cap = hbm_gib if hbm_gib is not None else hbm_of(doc)
    alts = (plans[1:] + list(rejected or []))[:n]
    labels = plan_labels([plans[0], *alts])[1:]
    ranked_below: dict = {}   # extrapolated rank -> the first (highest) covered plan promoted above it
    for note in (doc.get("solver") or {}).get("safe_order") or []:
        ranked_below.setdefault(note["extrapolated"], note)

    def line(k, a, label):
        note = ranked_below.get(k + 1) if k + 1 < len(plans) else None
        if note is None:
            return why_not(plans[0], a, word, cap, label)
        return safe_order_line(plans[note["covered"]], a, label, note)
    return [line(k, a, label) for k, (a, label) in enumerate(zip(alts, labels))]


def safe_order_line(covered: Mapping, alt: Mapping, label: str, note: Mapping) -> str:
    """Why a plan predicted faster than a covered plan ranks below it: extrapolated, and the covered
    plan lies inside its band (``solver.safe_order``; planner.search.plan._safe_rank)."""
    pa, pc = _pred(alt), _pred(covered)
    rank = f"#{int(note['covered']) + 1}"
    why = str(note.get("why") or "").removesuffix(": extrapolated")
    band = ""
    if pa.get("tflops_per_gpu_low") and pa.get("tflops_per_gpu_high"):
        band = (f"; its band {pa['tflops_per_gpu_low']:,.0f}-{pa['tflops_per_gpu_high']:,.0f} TFLOP/s holds "
                f"{rank}'s {float(pc.get('tflops_per_gpu') or 0):,.0f}")
    return (f"{label}: predicted {note['lead']:.1%} faster than {rank}, but extrapolated ({why}){band}: "
            f"the lead is inside the uncertainty, so the covered plan {rank} ranks above it")


def band_text(pred: Mapping) -> str:
    """``low-high`` TFLOP/s of a prediction's uncertainty band, ``*`` when extrapolated ("-" without a band)."""
    if not pred.get("tflops_per_gpu_high"):
        return "-"
    return f"{pred['tflops_per_gpu_low']:,.0f}-{pred['tflops_per_gpu_high']:,.0f}" + ("*" if pred.get("extrapolated") else "")


def uncertainty_lines(doc: Mapping) -> list[tuple[str, str | None]]:
    """Each plan's band, its lead over the next and the --compare layout, as (line, extrapolation note or
    None): what ``topoplan plan`` prints under its table and the HTML report shows (docs/uncertainty.md)."""
    out: list[tuple[str, str | None]] = []
    for i, entry in enumerate(doc.get("plans") or []):
        p = entry.get("prediction") or {}
        if not p.get("tflops_per_gpu_high"):
            continue
        line = (f"#{i + 1} {entry.get('label') or config_label(entry['config'])}: {p['tflops_per_gpu']:,.0f} "
                f"TFLOP/s/GPU, band {p['tflops_per_gpu_low']:,.0f}-{p['tflops_per_gpu_high']:,.0f} ({p['regime']})")
        if "lead_over_next" in entry:
            line += f"; lead over #{i + 2} {entry['lead_over_next']:+.1%}" + (
                ": within the model's uncertainty" if entry["within_uncertainty"] else "")
        out.append((line, p.get("extrapolated") or None))
    cmp_ = doc.get("compare")
    if cmp_:
        p = cmp_["prediction"]
        verdict = "within the model's uncertainty" if cmp_["within_uncertainty"] else "outside the model's uncertainty"
        out.append((f"compare {cmp_['label']}: {p['tflops_per_gpu']:,.0f} TFLOP/s/GPU, band "
                    f"{p['tflops_per_gpu_low']:,.0f}-{p['tflops_per_gpu_high']:,.0f} ({p['regime']})"
                    + ("" if p["fits"] else ", does not fit in memory")
                    + f"; plan #1 leads by {cmp_['plan_lead']:+.1%}: {verdict}", p.get("extrapolated") or None))
    return out


def hbm_of(doc: Mapping) -> float | None:
    """HBM per GPU (GiB) of the document's plans (what each prediction compared its memory with)."""
    plans = doc.get("plans") or []
    return float(_pred(plans[0])["hbm_gib"]) if plans and _pred(plans[0]).get("hbm_gib") else None


# ---------------------------------------------------------------------------------------- render

def plans_table(doc: Mapping, top: int | None = None, hbm_gib: float | None = None,
                width: int | None = None) -> Table:
    """The top plans as a table: layout, TFLOP/s and tokens/s per GPU, step time, memory, band.
    Figures never wrap or truncate; the units sit in the caption. When the table would not fit in
    ``width`` the layout wraps between its tokens, and then the band column is dropped (the band is
    printed with each plan's lead below the table)."""
    cap = hbm_gib if hbm_gib is not None else hbm_of(doc)
    entries = (doc.get("plans") or [])[: top or None]
    labels = plan_labels(entries)
    rows = []
    for i, (entry, label) in enumerate(zip(entries, labels)):
        p = _pred(entry)
        mem = p.get("memory_gib_per_gpu")
        rows.append([
            str(i + 1), label,
            f"{p.get('tflops_per_gpu', 0):,.0f}",
            f"{p.get('tokens_per_s_per_gpu', 0):,.0f}",
            _fmt_s(float(p.get("step_time_s") or 0.0)),
            "-" if mem is None else f"{mem:.0f}",
            band_text(p),   # the uncertainty band (docs/uncertainty.md); * = extrapolated regime
        ])
    mem_note = f"GiB: memory per GPU of {cap:.0f} GiB HBM" if cap else "GiB: memory per GPU"
    caption = f"TFLOP/s (model) and tokens/s per GPU; {mem_note}; band: TFLOP/s uncertainty (* extrapolated)"
    cols = [("#", "right"), ("layout", "left"), ("TFLOP/s", "right"), ("tokens/s", "right"), ("step", "right"),
            ("GiB", "right"), ("band", "right")]

    def build(keep: list[int]) -> Table:
        table = compact_table(title="plans", caption=caption if 6 in keep else caption.split("; band")[0])
        for k in keep:
            name, just = cols[k]
            if name == "layout":
                longest = max((len(t) for r in rows for t in r[1].split()), default=6)
                table.add_column(name, justify=just, overflow="fold", min_width=max(6, longest))
            else:
                table.add_column(name, justify=just, no_wrap=True)
        for r in rows:
            table.add_row(*(r[k] for k in keep))
        return table

    return first_that_fits([build(list(range(7))), build(list(range(6)))], width)


def compact_table(**kw) -> Table:
    """A table for terminal views: a rule under the header, two spaces between columns, no frame."""
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True, **kw)


def figure_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *, wrap: Sequence[str] = (),
                 right: Sequence[str] = (), caption: str | None = None) -> Table:
    """A compact table whose cells never truncate: the ``wrap`` columns (names, prose) wrap between
    their words and are never narrower than their longest word; every other cell stays on one line."""
    t = compact_table(title=title, caption=caption)
    for k, col in enumerate(columns):
        just = "right" if col in right else "left"
        if col in wrap:
            t.add_column(col, justify=just, overflow="fold",
                         min_width=max(len(col.split()[0]) if col.split() else 1,
                                       longest_token(r[k] for r in rows)))
        else:
            t.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        t.add_row(*r)
    return t


def longest_token(values) -> int:
    """Width of the longest whitespace-separated token of ``values`` (a column's cells): the
    narrowest a column may get if it wraps only between tokens."""
    return max((len(t) for v in values for t in str(v).split()), default=1)


def first_that_fits(tables, width: int | None):
    """The first of ``tables`` (widest first) that renders in ``width`` columns with every word of
    every cell whole (rich shortens or crops cells when a table cannot fit), else the last: views
    drop or move columns at narrow widths instead of truncating figures."""
    tables = list(tables)
    if not width:
        return tables[0]
    for t in tables:
        con = Console(width=width, record=True, file=_NullFile(), color_system=None)
        con.print(t)
        out = con.export_text()
        words = set(out.split())
        if "…" not in out and all(w in words for w in _cell_words(t)):
            return t
    return tables[-1]


def _cell_words(table: Table) -> set[str]:
    out: set[str] = set()
    for col in table.columns:
        for cell in col._cells:
            text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
            out.update(text.split())
    return out


class _NullFile:
    def write(self, _text):
        return 0

    def flush(self):
        pass


def plan_details(doc: Mapping, index: int, hbm_gib: float | None = None, width: int = 40,
                 line_width: int | None = None) -> Group:
    """Breakdown bar, memory bar and placement map of plan ``index`` (lines kept within
    ``line_width`` when given: legends break between items, map rows put their label above)."""
    entry = doc["plans"][index]
    p = _pred(entry)
    cap = hbm_gib if hbm_gib is not None else hbm_of(doc)
    title = Text(f"#{index + 1} {plan_labels(doc['plans'])[index]}", style="bold")
    parts = [title, Text("step   ") + breakdown_bar(p.get("breakdown"), p.get("step_time_s"), width, line_width)]
    if p.get("memory_gib_per_gpu") is not None:
        parts.append(Text("memory ") + memory_bar(float(p["memory_gib_per_gpu"]), cap, width=width))
    if p.get("host_gib_per_node"):   # Megatron's optimizer CPU offload
        parts.append(Text(f"host   {p['host_gib_per_node']:,.0f} of {p['host_usable_gib']:,.0f} GiB usable per node "
                          "(offloaded optimizer state)"))
    sizes = domain_sizes_of(doc)
    if sizes and (entry.get("placement") or {}).get("rank_to_gpu"):
        parts.append(placement_map(entry, sizes, names=domain_names_of(doc), line_width=line_width))
    return Group(*parts)


def solver_line(solver: Mapping) -> str:
    """The search in one plain line: status, time, best objective and proven bound, space size."""
    if not solver:
        return ""
    line = f"solver: {solver.get('status', '?')} in {float(solver.get('wall_s') or 0):.2f} s"
    obj, bound = solver.get("objective"), solver.get("bound")
    if obj is not None:
        unit = {"tokens_per_s": "tokens/s", "tflops_per_gpu": "TFLOP/s per GPU",
                "goodput_tokens_per_s": "goodput tokens/s"}.get(
            solver.get("objective_name") or "", str(solver.get("objective_name") or ""))
        line += f", best {float(obj):,.0f} {unit}".rstrip()
        if bound is not None:
            line += f", proven bound {float(bound):,.0f}"
            if float(obj):
                line += f" (gap {abs(float(bound) - float(obj)) / abs(float(obj)):.2%})"
    if solver.get("layouts_in_space"):
        line += f", {int(solver['layouts_in_space']):,} layouts in the space"
    return line


def render_plan(doc: Mapping, console: Console | None = None, top: int | None = None,
                hbm_gib: float | None = None, rejected: Sequence[Mapping] | None = None) -> None:
    """Print the whole explanation of a plan document (a ``PlanDocument`` or its JSON object, which
    is validated first) to ``console`` (stdout by default), within the console's width."""
    doc = load_document(doc, "plan document").dump()
    console = console or Console()
    plans = doc.get("plans") or []
    if not plans:
        console.print("no plans")
        return
    width = console.width
    console.print(plans_table(doc, top, hbm_gib, width=width))
    for i in range(min(len(plans), top or len(plans))):
        console.print(plan_details(doc, i, hbm_gib, line_width=width))
        console.print()
    lines = why_not_lines(doc, n=3, rejected=rejected, hbm_gib=hbm_gib)
    offload = offload_line(doc.get("solver") or {})
    if offload:
        console.print(Text(offload, style="yellow"))
    if lines:
        console.print(Text("why not", style="bold"))
        for line in lines:
            console.print(Text(f"  {line}"))
    line = solver_line(doc.get("solver") or {})
    if line:
        console.print(Text(line, style="dim"))


def idle_note(doc: Mapping, offered: int | None, reason: str = "") -> str:
    """A line when the best plan leaves offered GPUs idle: how many, the share of the cluster that is,
    and ``reason`` (why, and what to try; the caller works it out with the model). Empty otherwise."""
    plans = doc.get("plans") or []
    if not plans or not offered:
        return ""
    cfg = plans[0].get("config") or {}
    world = int(cfg.get("world") or len((plans[0].get("placement") or {}).get("rank_to_gpu") or []) or 0)
    if not world or world >= offered:
        return ""
    idle = offered - world
    line = f"note: {idle} of {offered} GPUs idle ({idle / offered:.0%} of the cluster); the plan runs on {world}"
    return line + (f": {reason}" if reason else "")
