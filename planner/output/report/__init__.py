"""HTML reports with matplotlib figures for ``plan``, ``scale`` and ``place-experts``.

``write_report(kind, data, out_dir) -> list[Path]`` takes the JSON document the command prints with
``--json`` (``plan``: the plan.json document; ``scale``: the sweep; ``place-experts``: the
placement) and writes into ``out_dir``, atomically (all files appear or none):

- ``index.html``: one page with no external resources besides the PNGs next to it (no scripts, no
  web fonts, no CDN), readable offline and in a headless browser;
- the PNG figures it references (which ones depends on the kind, see ``FIGURES``);
- ``data.json``: the document the page was made from.

The keys read from each document are listed in docs/report.md. A document missing what a figure
needs is refused with ``InputError`` (exit 2) before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from planner.errors import InputError
from planner.io import atomic_dir, atomic_write_text

KINDS = ("plan", "scale", "place-experts")

# kind -> figure files the page may reference (each written when its data is present)
FIGURES = {
    "plan": ("breakdown.png", "memory.png", "placement.png"),
    "scale": ("scaling.png", "breakdown.png"),
    "place-experts": ("experts.png", "expert_slots.png"),
}


def write_report(kind: str, data, out_dir) -> list[Path]:
    """Write ``index.html`` + PNG figures + ``data.json`` for ``kind`` into ``out_dir``.

    Returns the paths written (inside ``out_dir``), ``index.html`` first."""
    from planner.output.report import pages  # lazy: its figures load matplotlib (~0.3 s), for --report only

    if kind not in KINDS:
        raise InputError(f"report kind {kind!r} is unknown; use one of {', '.join(KINDS)}")
    builder = {"plan": pages.plan_page, "scale": pages.scale_page, "place-experts": pages.experts_page}[kind]
    # validate before any file appears
    pages.validate(kind, data)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--report {out_dir}: exists and is not a directory; give a directory path")
    with atomic_dir(out_dir) as stage:
        html_text, figures = builder(data, stage)
        (stage / "index.html").write_text(html_text, encoding="utf-8")
        (stage / "data.json").write_text(json.dumps(_jsonable(data), indent=1), encoding="utf-8")
        names = ["index.html"] + [f.name for f in figures] + ["data.json"]
    return [out_dir / n for n in names]


def write_compare_html(doc: Mapping, path) -> Path:
    """``topoplan compare --html FILE``: one self-contained HTML page (plot embedded), written atomically."""
    from planner.output.report.compare import compare_page  # lazy: matplotlib, for --html only

    path = Path(path)
    atomic_write_text(path, compare_page(doc), option="--html")
    return path


def _jsonable(data):
    if isinstance(data, Mapping):
        return {str(k): _jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_jsonable(v) for v in data]
    if hasattr(data, "tolist"):
        return data.tolist()
    return data


__all__ = ["write_report", "KINDS", "FIGURES"]
