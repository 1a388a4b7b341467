"""Normalise the JSON documents of ``plan``, ``scale`` and ``place-experts`` for the report.

The report takes exactly what those commands print with ``--json`` (docs/report.md lists the keys
it reads). These functions pull the figures' inputs out of a document and refuse, with an
``InputError`` naming the missing key, a document that lacks what a figure needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.cost.prediction import Prediction
from planner.errors import InputError
from planner.search.document import load_scale


def _num(x) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def stage_memory(prediction: Prediction) -> list[dict[str, float]]:
    """The memory components (GiB) of a plan's prediction, as one stage: the worst pipeline stage,
    which is what ``predict`` reports (``Prediction.memory``); ``memory_gib_per_gpu`` when it carries
    no components."""
    comps = {k: float(v) for k, v in prediction.memory.items() if _num(v) is not None}
    return [comps] if comps else [{"total": prediction.memory_gib_per_gpu}]


def scale_points(doc) -> list[dict]:
    """The rows of a ``scale --json`` document (``planner.search.document.ScaleDocument``), sorted by
    GPU count: gpus, tokens_per_s, tokens_per_s_per_gpu, tflops_per_gpu, retention, label, and the
    best plan's breakdown. InputError naming the field for a document that is not one."""
    rows = sorted(load_scale(doc).rows, key=lambda r: r.gpus)
    return [{"gpus": r.gpus, "tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
             "tflops_per_gpu": r.tflops_per_gpu, "retention": r.retention, "label": r.layout,
             "step_time_s": r.step_time_s, "breakdown": dict(r.breakdown)} for r in rows]


def _layer_metric(layers: Sequence, names: Sequence[str]) -> list[float] | None:
    vals = []
    for layer in layers:
        if not isinstance(layer, Mapping):
            return None
        src = layer.get("metrics") if isinstance(layer.get("metrics"), Mapping) else layer
        v = next((_num(src.get(n)) for n in names if _num(src.get(n)) is not None), None)
        if v is None:
            return None
        vals.append(v)
    return vals


_BALANCE = ("balance", "max_mean", "gpu_max_mean")
_REMOTE = ("remote_domains_per_token", "domains_per_token", "expected_remote_domains")


def _metric_series(doc: Mapping, names: Sequence[str]) -> list[float] | None:
    """A per-layer series from ``layers[i](.metrics).<name>`` or ``metrics.<name>`` (a list) or
    ``metrics.per_layer.<name>`` or ``<name>_per_layer``."""
    per_layer_lists = [doc.get("layers"), doc.get("metrics"), doc.get("per_layer")]
    if isinstance(doc.get("metrics"), Mapping):
        per_layer_lists.append(doc["metrics"].get("per_layer"))
    for lst in per_layer_lists:  # a list of per-layer objects
        if isinstance(lst, list) and lst and isinstance(lst[0], Mapping):
            got = _layer_metric(lst, names)
            if got is not None:
                return got
    metrics = doc.get("metrics") if isinstance(doc.get("metrics"), Mapping) else {}
    for src in (metrics, metrics.get("per_layer") if isinstance(metrics.get("per_layer"), Mapping) else {}, doc):
        for n in names:
            for key in (n, f"{n}_per_layer"):
                v = src.get(key)
                if isinstance(v, list) and v and all(_num(x) is not None for x in v):
                    return [float(x) for x in v]
    return None


def expert_series(doc: Mapping) -> dict:
    """Per-layer balance and remote domains per token for topoplan's placement and, where the
    document carries them (``eplb`` / ``baseline``, one policy or a dict of policies), for EPLB.

    Returns {"balance": [...], "remote": [...] or None, "baselines": {name: {"balance", "remote"}},
    "lower_bound": [...] or None (a proven lower bound on the balance of the layer's replica counts, when given),
    "ep_rank_domain": [...] or None, "slots": [[logical expert per slot] per layer] or None}."""
    if not isinstance(doc, Mapping):
        raise InputError("place-experts document: expected a JSON object")
    balance = _metric_series(doc, _BALANCE)
    if balance is None:
        raise InputError("place-experts document: no per-layer 'balance' (layers[i].metrics.balance or "
                         "metrics.balance); pass the output of 'topoplan place-experts --json'")
    remote = _metric_series(doc, _REMOTE)
    baselines: dict[str, dict] = {}
    for key in ("eplb", "baseline", "baselines"):
        b = doc.get(key)
        if not isinstance(b, Mapping):
            continue
        if _metric_series(b, _BALANCE) is not None:
            baselines[key if key != "baselines" else "baseline"] = {
                "balance": _metric_series(b, _BALANCE), "remote": _metric_series(b, _REMOTE)}
        else:
            for name, sub in b.items():
                if isinstance(sub, Mapping) and _metric_series(sub, _BALANCE) is not None:
                    baselines[f"EPLB {name}" if key == "eplb" else name] = {
                        "balance": _metric_series(sub, _BALANCE), "remote": _metric_series(sub, _REMOTE)}
    dom = doc.get("ep_rank_domain")
    slots = None
    layers = doc.get("layers") if isinstance(doc.get("layers"), list) else None
    if layers and isinstance(layers[0], Mapping):
        if dom is None:
            dom = layers[0].get("ep_rank_domain")
        if all(isinstance(layer.get("physical_to_logical"), list) for layer in layers):
            slots = [layer["physical_to_logical"] for layer in layers]
    elif isinstance(doc.get("physical_to_logical"), list) and doc["physical_to_logical"] \
            and isinstance(doc["physical_to_logical"][0], list):
        slots = doc["physical_to_logical"]
    if dom is None:
        dom = doc.get("rank_domain")
    lower = _metric_series(doc, ("lower_bound", "balance_lower_bound"))
    return {"balance": balance, "remote": remote, "baselines": baselines, "lower_bound": lower,
            "ep_rank_domain": dom if isinstance(dom, list) else None, "slots": slots}
