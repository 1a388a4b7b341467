"""MaxText logs: the ``Config param`` lines and the step lines.

Format strings (AI-Hypercomputer/maxtext, ``MetricLogger.log_metrics`` in metric_logger.py; the
``Config param`` lines are pyconfig's listing of the resolved configuration)::

    f"completed step: {step}, seconds: {metrics['scalar']['perf/step_time_seconds']:.3f}, "
    f"TFLOP/s/device: {metrics['scalar']['perf/per_device_tflops_per_sec']:.3f}, "
    f"Tokens/s/device: {metrics['scalar']['perf/per_device_tokens_per_sec']:.3f}, "
"""

from __future__ import annotations

import re
import statistics

from planner.errors import InputError
from planner.trainers.logs import median_after_warmup

_STEP = re.compile(r"completed step: (\d+), seconds: ([0-9.]+), TFLOP/s/device: ([0-9.]+)"
                   r"(?:, Tokens/s/device: ([0-9.]+))?")
_PARAM = re.compile(r"Config param ([A-Za-z0-9_]+): (.*)$")


def detect(text: str) -> bool:
    return "completed step: " in text


def parse(text: str, source: str) -> dict:
    steps, params = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        if "completed step: " in line:
            m = _STEP.search(line)
            if not m:
                raise InputError(f"{source}:{n}: cannot read MaxText's step line (expected 'completed step: N, "
                                 f"seconds: S, TFLOP/s/device: F, ...'): {line.strip()[:120]}")
            steps.append((int(m.group(1)), float(m.group(2)), float(m.group(3)),
                          float(m.group(4)) if m.group(4) else None, n))
            continue
        m = _PARAM.search(line)
        if m:
            params[m.group(1)] = m.group(2).strip()
    return {"steps": steps, "params": params}


def _p(params: dict, key: str, default: int = 1) -> int:
    try:
        return int(float(params.get(key, default)))
    except ValueError:
        return default


def row_fields(parsed: dict) -> dict:
    p = parsed["params"]
    if not p:
        return {}
    deg = {ax: _p(p, f"ici_{ax}_parallelism") * _p(p, f"dcn_{ax}_parallelism")
           for ax in ("tensor", "pipeline", "context", "expert", "fsdp", "data")}
    # the circular pipeline's repeats are the virtual stages (MaxText prints the derived value; -1 = not derived)
    repeats = _p(p, "num_pipeline_repeats")
    out = {"tp": deg["tensor"], "pp": deg["pipeline"], "cp": deg["context"], "ep": deg["expert"],
           "vpp": repeats if deg["pipeline"] > 1 and repeats > 0 else 1, "fsdp": 1 if deg["fsdp"] > 1 else 0}
    if "max_target_length" in p:
        out["seq_len"] = _p(p, "max_target_length")
    if "per_device_batch_size" in p:
        dev = 1
        for v in deg.values():
            dev *= v
        out["num_gpus"] = dev
        pdb = float(p["per_device_batch_size"])
        out["gbs"] = int(round(pdb * dev * max(1, _p(p, "gradient_accumulation_steps"))))
        out["mbs"] = max(1, int(pdb))
    return out


def model_shape(parsed: dict) -> dict:
    """What identifies the model in the ``Config param`` listing (compared with the model's spec)."""
    p = parsed["params"]
    if "base_num_decoder_layers" not in p or "base_emb_dim" not in p:
        return {}
    return {"num_layers": _p(p, "base_num_decoder_layers"), "hidden_size": _p(p, "base_emb_dim"),
            "num_attention_heads": _p(p, "base_num_query_heads", 0),
            "num_experts": experts if (experts := _p(p, "num_experts", 1)) > 1 else 0}   # MaxText: dense = 1


def run_fields(text: str, source: str) -> dict:
    """What a MaxText log says of its run (``planner.calibration.runs.Run`` fields): the median step time after the
    warm-up, tokens/s per GPU where it logs them, its own TFLOP/s figure."""
    p = parse(text, source)
    steps = p["steps"]
    sec, used, skip = median_after_warmup([(s[0], s[1]) for s in steps], source, "step")
    kept = [s for s in steps if s[0] > skip]
    tok = [s[3] for s in kept if s[3] is not None]
    return dict(fields=row_fields(p), shape=model_shape(p), step_s=sec,
                tokens_per_s_per_gpu=statistics.median(tok) if tok else None,
                logged_tflops_per_gpu=statistics.median(s[2] for s in kept), iters_used=used, iters_skipped=skip)
