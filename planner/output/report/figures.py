"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no pyplot, no
global backend switch, no display needed). Each function takes already-normalised data and writes
one PNG, returning its path.
"""

from __future__ import annotations

import colorsys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.output.explain import CATEGORIES, CATEGORY_COLORS, CATEGORY_LABELS, categorize, plan_labels

DPI = 110
_TAB20 = [
    "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
    "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
    "#17becf", "#9edae5",
]


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", facecolor="white")
    return path


def breakdown_figure(plans: Sequence[Mapping], path: Path, labels: Sequence[str] | None = None,
                     title: str = "Step-time breakdown of the top plans") -> Path:
    """Stacked horizontal bars: the step time of each plan split into the categories of ``CATEGORIES``."""
    labels = list(labels) if labels else [f"#{i + 1} {lab}" for i, lab in enumerate(plan_labels(plans))]
    cats = [categorize((p.get("prediction") or {}).get("breakdown"),
                       (p.get("prediction") or {}).get("step_time_s")) for p in plans]
    fig = Figure(figsize=(9, 0.8 + 0.55 * len(plans)))
    ax = fig.add_subplot()
    ys = list(range(len(plans)))[::-1]
    left = [0.0] * len(plans)
    for c in CATEGORIES:
        widths = [d[c] for d in cats]
        if not any(widths):
            continue
        ax.barh(ys, widths, left=left, color=CATEGORY_COLORS[c], label=CATEGORY_LABELS[c], height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    for y, total, p in zip(ys, left, plans):
        tf = (p.get("prediction") or {}).get("tflops_per_gpu")
        note = f"{total:.2f} s" + (f", {tf:,.0f} TFLOP/s/GPU" if tf else "")
        ax.text(total, y, "  " + note, va="center", fontsize=8)
    ax.set_yticks(ys, labels, fontsize=9)
    ax.set_xlabel("step time (s)")
    ax.set_xlim(0, max(left + [1e-9]) * 1.35)
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.3 / len(plans)), fontsize=8, ncol=5,
              frameon=False)
    return _save(fig, path)


def memory_figure(stages: Sequence[Mapping[str, float]], hbm_gib: float | None, path: Path,
                  title: str = "") -> Path:
    """Stacked bars of memory components per pipeline stage with the HBM capacity as a line."""
    comps: list[str] = []
    for st in stages:
        for k, v in st.items():
            if k not in comps and v > 0:  # components that are zero on every stage stay out of the legend
                comps.append(k)
    fig = Figure(figsize=(max(5, 0.5 * len(stages) + 3), 3.8))
    ax = fig.add_subplot()
    xs = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for j, k in enumerate(comps):
        vals = [float(st.get(k, 0.0)) for st in stages]
        ax.bar(xs, vals, bottom=bottom, color=_TAB20[(2 * j) % 20], label=k, width=0.7)
        bottom = [a + b for a, b in zip(bottom, vals)]
    top = max(bottom + [1e-9])
    if hbm_gib:
        ax.axhline(hbm_gib, color="#d62728", lw=1.5, ls="--", label=f"HBM {hbm_gib:.0f} GiB")
        top = max(top, hbm_gib)
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(xs, [str(i) for i in xs])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title or "Memory per GPU by pipeline stage")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return _save(fig, path)


def group_colors(n: int) -> list:
    """``n`` colours, none repeated: tab20's pairs' dark halves up to 10, tab20 up to 20, beyond that
    hues stepped by the golden ratio around the circle (neighbouring groups far apart in hue, lightness
    alternating), so that groups 0 and 20 no longer share a colour."""
    if n <= 10:
        return [_TAB20[2 * k] for k in range(n)]
    if n <= 20:
        return [_TAB20[k] for k in range(n)]
    out = []
    for k in range(n):
        h = (k * 0.6180339887498949) % 1.0
        light = (0.45, 0.62, 0.78)[k % 3]
        sat = (0.85, 0.6)[(k // 3) % 2]
        out.append(colorsys.hls_to_rgb(h, light, sat))
    return out


def _grid_panel(ax, grid: Sequence[Sequence[int]], title: str, label: str, word: str,
                names: Sequence[str] | None = None) -> None:
    width = max((len(r) for r in grid), default=1)
    arr = np.full((len(grid), width), np.nan)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            arr[i, j] = v if v >= 0 else np.nan
    n = int(np.nanmax(arr)) + 1 if np.isfinite(arr).any() else 1
    colors = group_colors(n)
    cmap = ListedColormap(colors).with_extremes(bad="#eeeeee")
    ax.imshow(np.ma.masked_invalid(arr), cmap=cmap, vmin=-0.5, vmax=n - 0.5, aspect="auto",
              interpolation="nearest")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("GPU within " + word)
    ax.set_ylabel(word)
    if names and len(names) == len(grid) and len(grid) <= 64:   # the cluster file's domain names
        ax.set_yticks(range(len(grid)))
        ax.set_yticklabels(names, fontsize=6 if len(grid) > 16 else 8)
    if n <= 12:
        handles = [Patch(color=colors[k], label=f"{label} {k}") for k in range(n)]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if n > 12 and len(grid) <= 64:   # no legend: each run of a group's GPUs carries its number
        for i, row in enumerate(grid):
            j = 0
            while j < len(row):
                k = j
                while k + 1 < len(row) and row[k + 1] == row[j]:
                    k += 1
                if row[j] >= 0 and k - j >= 1:
                    ax.text((j + k) / 2, i, str(row[j]), ha="center", va="center", fontsize=5, color="black")
                j = k + 1
    if len(grid) <= 64:  # domain borders, while they can be told apart
        for i in range(len(grid) + 1):
            ax.axhline(i - 0.5, color="white", lw=1.2)


def placement_figure(stage_grid: Sequence[Sequence[int]], ep_grid: Sequence[Sequence[int]] | None,
                     word: str, path: Path, title: str = "", names: Sequence[str] | None = None) -> Path:
    """Domains (rows, labelled with ``names`` when given) x GPUs (columns) coloured by pipeline stage
    and, beside it, by EP group."""
    panels = 2 if ep_grid is not None else 1
    rows = len(stage_grid)
    fig = Figure(figsize=(6.5 * panels, min(12, max(2.8, 1.2 + 0.35 * rows))))
    axes = [fig.add_subplot(1, panels, k + 1) for k in range(panels)]
    _grid_panel(axes[0], stage_grid, "pipeline stage", "stage", word, names)
    if ep_grid is not None:
        _grid_panel(axes[1], ep_grid, "EP group", "EP group", word, names)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def scaling_figure(points: Sequence[Mapping], path: Path, title: str = "") -> Path:
    """Left: cluster tokens/s against GPUs with the linear ideal from the smallest size. Right:
    TFLOP/s per GPU against GPUs, each point labelled with its per-GPU retention."""
    gpus = [p["gpus"] for p in points]
    tps = [p["tokens_per_s"] for p in points]
    tfl = [p["tflops_per_gpu"] for p in points]
    fig = Figure(figsize=(11, 4))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    ideal = [tps[0] * g / gpus[0] for g in gpus]
    ax1.plot(gpus, ideal, ls="--", color="#999999", label="linear from smallest size")
    ax1.plot(gpus, tps, marker="o", color="#4c78a8", label="predicted")
    if len(set(gpus)) > 1:
        ax1.set_xscale("log", base=2)
        ax1.set_yscale("log")
    ax1.set_xlabel("GPUs")
    ax1.set_ylabel("tokens/s (cluster)")
    ax1.set_title("Throughput")
    ax1.legend(fontsize=8, frameon=False)
    ax2.plot(gpus, tfl, marker="o", color="#e45756")
    for g, t, p in zip(gpus, tfl, points):
        ret = p.get("retention")
        if ret is not None:
            ax2.annotate(f"{ret:.1%}", (g, t), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    if len(set(gpus)) > 1:
        ax2.set_xscale("log", base=2)
    ax2.set_ylim(0, max(tfl) * 1.2)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel("model TFLOP/s per GPU")
    ax2.set_title("Per-GPU throughput (labels: retention vs smallest size)")
    for ax in (ax1, ax2):
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def experts_figure(series: Mapping, path: Path, title: str = "") -> Path:
    """Balance (max/mean GPU load) per MoE layer for topoplan and the EPLB baselines; below it,
    expected remote domains per token when the document has them."""
    has_remote = series.get("remote") is not None or any(
        b.get("remote") is not None for b in series.get("baselines", {}).values())
    fig = Figure(figsize=(10, 6.5 if has_remote else 3.8))
    ax1 = fig.add_subplot(2 if has_remote else 1, 1, 1)
    layers = list(range(len(series["balance"])))
    ax1.plot(layers, series["balance"], marker=".", color="#4c78a8", label="topoplan", lw=1.5)
    styles = ["#e45756", "#f58518", "#54a24b", "#b279a2"]
    for k, (name, b) in enumerate(series.get("baselines", {}).items()):
        ax1.plot(range(len(b["balance"])), b["balance"], marker=".", color=styles[k % 4], label=name, lw=1)
    lb = series.get("lower_bound")
    if lb is not None and any(v >= 1.0 for v in lb):  # a balance bound below 1 means "none proven"
        ax1.plot(range(len(lb)), [v if v >= 1.0 else float("nan") for v in lb], color="#999999", ls="--", lw=1,
                 label="proven lower bound")
    ax1.axhline(1.0, color="#999999", lw=0.8, ls=":")
    ax1.set_ylabel("GPU load max / mean")
    ax1.set_title(title or "Expert-load balance per MoE layer")
    ax1.legend(fontsize=8, frameon=False)
    ax1.grid(alpha=0.3)
    if has_remote:
        ax2 = fig.add_subplot(2, 1, 2, sharex=ax1)
        if series.get("remote") is not None:
            ax2.plot(range(len(series["remote"])), series["remote"], marker=".", color="#4c78a8", label="topoplan")
        for k, (name, b) in enumerate(series.get("baselines", {}).items()):
            if b.get("remote") is not None:
                ax2.plot(range(len(b["remote"])), b["remote"], marker=".", color=styles[k % 4], label=name, lw=1)
        ax2.set_ylabel("remote domains per token")
        ax2.legend(fontsize=8, frameon=False)
        ax2.grid(alpha=0.3)
        ax2.set_xlabel("MoE layer")
    else:
        ax1.set_xlabel("MoE layer")
    fig.tight_layout()
    return _save(fig, path)


def expert_slots_figure(slots: Sequence[Sequence[int]], slots_per_gpu: int, domains: Sequence[int] | None,
                        path: Path) -> Path:
    """Layers (rows) x EP ranks (columns): how many slots of each GPU hold a replicated expert
    (an expert with more than one slot in that layer), with domain borders."""
    n_layers = len(slots)
    n_slots = max(len(s) for s in slots)
    ranks = max(1, n_slots // max(1, slots_per_gpu))
    arr = np.zeros((n_layers, ranks))
    for i, layer in enumerate(slots):
        counts: dict[int, int] = {}
        for e in layer:
            counts[e] = counts.get(e, 0) + 1
        for s, e in enumerate(layer):
            if counts.get(e, 0) > 1 and s // slots_per_gpu < ranks:
                arr[i, s // slots_per_gpu] += 1
    fig = Figure(figsize=(10, min(10, 1.5 + 0.12 * n_layers)))
    ax = fig.add_subplot()
    im = ax.imshow(arr, aspect="auto", cmap="Blues", interpolation="nearest", vmin=0, vmax=max(1, slots_per_gpu))
    if domains:
        for r in range(1, len(domains)):
            if domains[r] != domains[r - 1]:
                ax.axvline(r - 0.5, color="#d62728", lw=1)
    ax.set_xlabel("EP rank (red lines: NVLink domain borders)")
    ax.set_ylabel("MoE layer")
    ax.set_title("Replica slots per GPU and layer")
    fig.colorbar(im, ax=ax, label="slots holding a replicated expert")
    return _save(fig, path)
