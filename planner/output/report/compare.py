"""``topoplan compare --html FILE``: one self-contained page (the plot embedded as a PNG data URI)
with the comparison table and a plot of $ per million tokens against days to train, each candidate
with its uncertainty band."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from planner.output.report.pages import _e, _page, _table

DPI = 110


def compare_figure_png(candidates) -> bytes:
    """$ per million tokens (y) against days to train (x), error bars spanning the band."""
    fig = Figure(figsize=(7.0, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for c in candidates:
        x, y = c["days"], c["usd_per_million_tokens"]
        ax.errorbar([x], [y], xerr=[[x - c["days_low"]], [c["days_high"] - x]],
                    yerr=[[y - c["usd_per_million_tokens_low"]], [c["usd_per_million_tokens_high"] - y]],
                    fmt="o", capsize=4, label=f"{c['candidate']} ({c['layout']})")
        ax.annotate(f"{c['kwh_per_million_tokens']:.2f} kWh/Mtok", (x, y), textcoords="offset points",
                    xytext=(6, 6), fontsize=8)
    ax.set_xlabel("days to train (at goodput)")
    ax.set_ylabel("$ per million tokens")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return buf.getvalue()


def compare_page(doc: Mapping) -> str:
    """The HTML page of a ``compare`` document."""
    cands = doc["candidates"]
    png = base64.b64encode(compare_figure_png(cands)).decode("ascii")
    rows = [[c["candidate"], f"{c['layout']} on {c['world']}", f"{c['tokens_per_s']:,.0f}",
             f"{c['goodput_tokens_per_s']:,.0f}", f"{c['effective_fraction']:.1%}",
             f"{c['days']:,.1f} [{c['days_low']:,.1f}-{c['days_high']:,.1f}]",
             f"{c['usd_per_million_tokens']:,.3f} ({c['usd_per_gpu_hour_source']})",
             f"{c['kwh_per_million_tokens']:,.3f} (PUE {c['pue']:g}, {c['pue_source']})"] for c in cands]
    formulas = "".join(f"<li><code>{_e(k)} = {_e(v)}</code></li>" for k, v in doc.get("formulas", {}).items())
    body = [_table(["candidate", "layout", "tokens/s", "goodput tokens/s", "effective", "days [band]",
                    "$ / M tokens", "kWh / M tokens"], rows, left=2),
            f"<figure><img src=\"data:image/png;base64,{png}\" alt=\"$ per million tokens against days\">"
            "<figcaption>$ per million tokens against days to train; bars: the model's uncertainty band"
            "</figcaption></figure>",
            f"<h2>How each figure follows</h2><ul>{formulas}</ul>",
            "<p class=\"meta\">Prices and PUE marked assumed are placeholders (planner/data/power.yaml): set them "
            "with --candidate ...:usd_per_gpu_hour=X and --pue.</p>"]
    return _page(f"compare: {doc.get('model', '')}", f"{doc.get('tokens', 0):,.3g} tokens", body)
