"""Measured runs from trainer logs: each log becomes a row in calibration.csv's schema.

``read_log(path)`` recognises the trainer (``megatron``, ``torchtitan``, ``maxtext``: one module each)
and returns a :class:`Run`: the settings the log prints (layout, batch, sequence, precision,
recompute, dispatcher, CUDA graphs), the per-iteration step times after the warm-up, and the peak
memory when printed. ``run_row(run, base)`` turns it into a CSV row for ``planner.calibration.validate``
and ``planner.calibration.calibrate``; what a log cannot tell (the model when the catalog holds no single
match, the GPU for Megatron) comes from ``base`` (a CSV row, or ``--model`` / ``--cluster``), and a
non-empty field of ``base`` always wins over the log.

Warm-up and averaging: the first ``warmup_iters(last)`` = max(2, ceil(last / 5)) iterations are
dropped (CUDA-graph capture, allocator growth, NCCL set-up); the step time is the median of the rest
(at least ``MIN_ITERS`` of them), and ``Run.iters_used`` says how many.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from planner.calibration.priors import base_profile
from planner.cost.profiles import load_profile
from planner.cost.runs import maxtext, megatron, torchtitan
from planner.errors import InputError
from planner.model.flops import flops_per_token, param_counts
from planner.model.spec import catalog, load_model

MIN_ITERS = 3
LOG_SUFFIXES = (".log", ".out", ".txt", ".err")
GPU_KEYS = ("GB300", "GB200", "B300", "B200", "H200", "H100")


def warmup_iters(last: int) -> int:
    """Iterations dropped at the start of a run of ``last`` iterations."""
    return max(2, math.ceil(last / 5))


@dataclass
class Run:
    source: str
    trainer: str                     # megatron | torchtitan | maxtext
    fields: dict                     # CSV fields read from the log (tp, pp, ..., precision, recompute)
    shape: dict = field(default_factory=dict)   # model shape, matched against the catalog
    gpu: str | None = None           # GPU catalog key when the log names the device
    step_s: float | None = None      # median step time of the iterations used
    tokens_per_s_per_gpu: float | None = None   # when the trainer logs it (TorchTitan, MaxText)
    logged_tflops_per_gpu: float | None = None  # the trainer's own figure (its FLOP convention)
    iters_used: int = 0
    iters_skipped: int = 0
    peak_reserved_gib: float | None = None       # worst rank, torch allocator (max reserved)
    peak_allocated_gib: float | None = None      # worst rank, max allocated
    device_used_gib: float | None = None         # worst rank, whole device (when printed)


def _median_after_warmup(points: list[tuple[int, float]], source: str, what: str) -> tuple[float, int, int]:
    """(median value, points used, iterations skipped) of ``(iteration, value)`` after the warm-up."""
    if not points:
        raise InputError(f"{source}: no {what} lines; log every iteration (Megatron --log-interval 1, TorchTitan "
                         "--metrics.log_freq 1) and run at least 10 iterations")
    last = max(i for i, _ in points)
    skip = warmup_iters(last)
    used = [v for i, v in points if i > skip and math.isfinite(v)]
    if len(used) < MIN_ITERS:
        raise InputError(f"{source}: {len(used)} {what} lines after the {skip}-iteration warm-up (of {last}); "
                         f"need {MIN_ITERS}: run more iterations (topoplan trial --iters 20)")
    return statistics.median(used), len(used), skip


def _gpu_key(name: str | None) -> str | None:
    if not name:
        return None
    up = "".join(ch for ch in name.upper() if ch.isalnum() or ch == " ")
    for k in GPU_KEYS:
        if any(tok.startswith(k) for tok in up.split()):
            return k
    return None


def _megatron(text: str, source: str) -> Run:
    p = megatron.parse(text, source)
    iters = p["iterations"]
    step_ms, used, skip = _median_after_warmup([(it[0], it[2]) for it in iters], source, "iteration")
    tfl = [it[3] for it in iters if it[0] > skip and it[3] is not None]
    fields = megatron.row_fields(p["args"])
    gbs = [it[4] for it in iters if it[4] is not None]
    if gbs and "gbs" not in fields:
        fields["gbs"] = gbs[-1]
    run = Run(source, "megatron", fields, megatron.model_shape(p["args"]), step_s=step_ms / 1000.0,
              logged_tflops_per_gpu=statistics.median(tfl) if tfl else None, iters_used=used, iters_skipped=skip)
    if p["memory"]:
        last = max(m[1] for m in p["memory"])
        final = [m for m in p["memory"] if m[1] == last]   # the latest report, one line per model-parallel rank
        run.peak_allocated_gib = max(m[3] for m in final) / 1024.0
        run.peak_reserved_gib = max(m[5] for m in final) / 1024.0
        dev = [m[6] for m in final if m[6] is not None]
        run.device_used_gib = max(dev) / 1024.0 if dev else None
    return run


def _torchtitan(text: str, source: str) -> Run:
    p = torchtitan.parse(text, source)
    steps = p["steps"]
    tps, used, skip = _median_after_warmup([(s[0], s[2]) for s in steps], source, "step")
    kept = [s for s in steps if s[0] > skip]
    return Run(source, "torchtitan", torchtitan.row_fields(p), torchtitan.model_shape(p), gpu=_gpu_key(p["device"]),
               tokens_per_s_per_gpu=tps, logged_tflops_per_gpu=statistics.median(s[3] for s in kept),
               iters_used=used, iters_skipped=skip, peak_reserved_gib=max(s[1] for s in kept))


def _maxtext(text: str, source: str) -> Run:
    p = maxtext.parse(text, source)
    steps = p["steps"]
    sec, used, skip = _median_after_warmup([(s[0], s[1]) for s in steps], source, "step")
    kept = [s for s in steps if s[0] > skip]
    tok = [s[3] for s in kept if s[3] is not None]
    return Run(source, "maxtext", maxtext.row_fields(p), maxtext.model_shape(p), step_s=sec,
               tokens_per_s_per_gpu=statistics.median(tok) if tok else None,
               logged_tflops_per_gpu=statistics.median(s[2] for s in kept), iters_used=used, iters_skipped=skip)


def read_log(path: str | Path) -> Run:
    """The run a rank log records (the trainer is recognised from the text)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such log file")
    text = path.read_text(errors="replace")
    for name, mod, reader in (("megatron", megatron, _megatron), ("torchtitan", torchtitan, _torchtitan),
                              ("maxtext", maxtext, _maxtext)):
        if mod.detect(text):
            return reader(text, str(path))
    raise InputError(f"{path}: not a Megatron, TorchTitan or MaxText log (no iteration or step lines and no "
                     "argument listing); give the rank log the trainer printed")


def log_files(path: str | Path) -> list[Path]:
    """A log file, or the logs under a directory (``*.log``, ``*.out``, ``*.txt``, ``*.err``, recursively),
    skipping files that are not trainer logs (the launch files a trial directory also holds)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{path}: no such log file or directory")
    found = []
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.suffix in LOG_SUFFIXES and p.name not in ("args.txt", "command.txt", "overrides.txt"):
            head = p.read_text(errors="replace")
            if megatron.detect(head) or torchtitan.detect(head) or maxtext.detect(head):
                found.append(p)
    if not found:
        raise InputError(f"{path}: no trainer logs found (looked for *.log, *.out, *.txt, *.err with iteration or "
                         "step lines)")
    return found


SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_experts")
PARAMS_TOLERANCE = 0.05   # TorchTitan's size line against planner.model.flops.param_counts (MTP, padding)


def shape_mismatch(model, shape: dict) -> str | None:
    """How the log's model differs from ``model`` (None when the log agrees or prints no shape)."""
    for key in SHAPE_KEYS:
        if key in shape and shape[key] != (getattr(model, key) or 0):
            return f"{key} {shape[key]} in the log, {getattr(model, key) or 0} in {model.name}"
    if shape.get("params"):
        counts = param_counts(model)
        lo, hi = counts.total, counts.total + counts.mtp
        if not lo * (1 - PARAMS_TOLERANCE) <= shape["params"] <= hi * (1 + PARAMS_TOLERANCE):
            return f"{shape['params'] / 1e9:.2f}B parameters in the log, {lo / 1e9:.2f}B in {model.name}"
    return None


def check_model(run: "Run", model_name: str, where: str) -> None:
    """Refuse a log of another model than ``model_name`` (``where``: the option or column that named it)."""
    why = shape_mismatch(load_model(model_name), run.shape)
    if why:
        raise InputError(f"{run.source}: the log is of another model than {where} {model_name} ({why}); "
                         f"give the log's own model as {where}, or leave it out to match the log against the catalog")


def match_model(shape: dict, source: str) -> str | None:
    """The catalog model whose layers, width, heads and experts the log prints (None: no unique match)."""
    if not shape or not all(k in shape for k in SHAPE_KEYS):
        return None
    hits = []
    for name in catalog():
        try:
            m = load_model(name)
        except InputError:
            continue
        if (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_experts) == (
                shape["num_layers"], shape["hidden_size"], shape["num_attention_heads"], shape["num_experts"]):
            hits.append(m)
    if not hits:
        return None
    same = {m.model_copy(update={"name": "", "source": "", "max_position_embeddings": None, "family": ""})
            for m in hits}
    return hits[0].name if len(same) == 1 else None


DEFAULT_STACK = {"megatron": "megatron-26.08", "torchtitan": "torchtitan", "maxtext": "maxtext"}


def gpu_of(cluster: str | None) -> str | None:
    """``--cluster`` as a GPU name: a preset (dgx-h100, gb200-nvl72) or a GPU (H100, GB200)."""
    if not cluster:
        return None
    return _gpu_key(cluster.replace("-", " ").replace("_", " "))


def run_row(run: Run, base: dict | None = None, *, rid: str | None = None, model_from: str = "--model") -> dict:
    """A row in calibration.csv's schema: ``base``'s non-empty fields, else what the log says, with the
    measured tokens/s and model TFLOP/s per GPU (the stack profile's FLOP convention)."""
    base = {k: v for k, v in (base or {}).items() if v not in (None, "")}
    row = {k: str(v) for k, v in run.fields.items() if v not in (None, "")}
    row.update({k: str(v) for k, v in base.items()})
    row.setdefault("id", rid or Path(run.source).stem)
    row.setdefault("stack", DEFAULT_STACK[run.trainer])
    if "model" in base:
        check_model(run, row["model"], model_from)
    if "model" not in row:
        name = match_model(run.shape, run.source)
        if name is None:
            raise InputError(f"{run.source}: the log does not name a catalog model (no unique match for its layers, "
                             "width, heads and experts); give --model (or a model column)")
        row["model"] = name
    if "gpu" not in row:
        if run.gpu is None:
            raise InputError(f"{run.source}: the log does not name the GPU; give --cluster (a preset such as "
                             "dgx-h100, or the GPU: H100, GB200, ...) or a gpu column")
        row["gpu"] = run.gpu
    for key in ("num_gpus", "seq_len", "gbs", "precision"):
        if key not in row:
            hint = {"precision": "a precision column (bf16, fp8, mxfp8, ...)"}.get(key, f"a {key} column")
            raise InputError(f"{run.source}: the log does not print {key}; give {hint} in the runs CSV")
    n, seq, gbs = int(row["num_gpus"]), int(row["seq_len"]), int(row["gbs"])
    if run.step_s is not None and run.trainer == "megatron":
        tok = gbs * seq / run.step_s / n
    elif run.tokens_per_s_per_gpu is not None:
        tok = run.tokens_per_s_per_gpu
    else:
        tok = gbs * seq / run.step_s / n
    row["tokens_per_s_per_gpu"] = f"{tok:.1f}"
    row["model_tflops_per_gpu"] = f"{tok * _flops_per_token(row) / 1e12:.1f}"
    row["iters_used"] = str(run.iters_used)
    row["log"] = run.source
    for key, val in (("peak_reserved_gib", run.peak_reserved_gib), ("peak_allocated_gib", run.peak_allocated_gib),
                     ("device_used_gib", run.device_used_gib)):
        if val is not None and key not in row:
            row[key] = f"{val:.2f}"
    return row


def _flops_per_token(row: dict) -> float:
    try:
        prof = load_profile(row["stack"])
    except InputError:   # a stack no profile describes yet (calibrate starts it from the priors)
        prof = base_profile(row["stack"])
    return flops_per_token(load_model(row["model"]), int(row["seq_len"]), tp=int(row.get("tp") or 1),
                           formula=prof.flops_formula)


LOG_REQUIRED = ("id", "stack", "model", "gpu", "num_gpus")


def rows_from_logs(paths: list, *, model: str | None = None, cluster: str | None = None,
                   stack: str | None = None) -> list[dict]:
    """Rows for every log under ``paths`` (files or directories), with ``--model`` / ``--cluster`` /
    ``--stack`` filling what the logs cannot tell."""
    base = {"model": model, "gpu": gpu_of(cluster), "stack": stack}
    if cluster and base["gpu"] is None:
        raise InputError(f"--cluster {cluster!r}: name a preset (dgx-h100, gb200-nvl72, ...) or a GPU (H100, GB200, ...)")
    rows, seen = [], set()
    for p in paths:
        if (Path(p) / TRIALS_MANIFEST).is_file():   # a directory written by topoplan trial
            rows += [dict(r, stack=stack or r["stack"], **({"model": model} if model else {}))
                     for r in rows_from_trials(p)]
            continue
        for f in log_files(p):
            rid = f.parent.name if f.parent.name and f.stem in ("log", "train", "rank0", "stdout") else f.stem
            while rid in seen:
                rid += "'"
            seen.add(rid)
            rows.append(run_row(read_log(f), base, rid=rid))
    return rows


def rows_from_csv_logs(rows: list[dict], csv_path: str | Path) -> list[dict]:
    """A runs CSV whose ``log`` column names each run's rank log (relative to the CSV): the row's
    non-empty columns win, the log gives the rest (and always the measured step time)."""
    out = []
    for r in rows:
        log = (r.get("log") or "").strip()
        if not log:
            out.append(r)
            continue
        missing = [c for c in LOG_REQUIRED if not (r.get(c) or "").strip()]
        if missing:
            raise InputError(f"{csv_path}: row {r.get('id', '?')}: column {missing[0]!r} is empty; a row with a log "
                             f"needs {', '.join(LOG_REQUIRED)}")
        p = Path(log)
        if not p.is_absolute():
            p = Path(csv_path).parent / p
        base = {k: v for k, v in r.items() if k not in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "log")}
        out.append(run_row(read_log(p), base, model_from=f"{csv_path}: row {r.get('id', '?')}: model"))
    return out


TRIALS_MANIFEST = "trials.json"


def rows_from_trials(out: str | Path) -> list[dict]:
    """Rows for the trials of a ``topoplan trial`` directory whose logs exist: the manifest
    (``trials.json``) gives the model, GPU, stack and GPUs, each ``trial-*/logs/`` the rest."""
    man = json.loads((Path(out) / TRIALS_MANIFEST).read_text())
    rows = []
    for t in man["trials"]:
        logs = Path(out) / t["id"] / "logs"
        try:
            files = log_files(logs)
        except InputError:
            continue   # not run yet
        base = {"id": t["id"], "stack": t["stack"], "model": t["model"], "gpu": t["gpu"],
                "num_gpus": str(t["num_gpus"])}
        rows.append(run_row(read_log(files[-1]), base, model_from=f"{TRIALS_MANIFEST} model"))
    if not rows:
        raise InputError(f"{out}: no trial has logs yet (trial-*/logs/ is empty); run submit_all.sh first")
    return rows
