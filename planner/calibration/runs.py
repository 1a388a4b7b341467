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
from dataclasses import dataclass, field
from pathlib import Path

from planner.calibration.priors import base_profile
from planner.cost.profiles import load_profile
from planner.errors import InputError
from planner.model.flops import flops_per_token, param_counts
from planner.model.spec import catalog, load_model
from planner.trainers import TRAINERS, get_trainer
from planner.trainers.logs import MIN_ITERS, gpu_key, warmup_iters  # noqa: F401 (the docstring's names)

LOG_SUFFIXES = (".log", ".out", ".txt", ".err")


@dataclass
class Run:
    source: str
    trainer: str                     # planner.trainers name of the trainer that wrote the log
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


def read_log(path: str | Path) -> Run:
    """The run a rank log records (the trainer is recognised from the text)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such log file")
    text = path.read_text(errors="replace")
    for trainer in TRAINERS.values():
        if trainer.logs.detect(text):
            return Run(str(path), trainer.name, **trainer.logs.run_fields(text, str(path)))
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
            if any(t.logs.detect(head) for t in TRAINERS.values()):
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


def gpu_of(cluster: str | None) -> str | None:
    """``--cluster`` as a GPU name: a preset (dgx-h100, gb200-nvl72) or a GPU (H100, GB200)."""
    if not cluster:
        return None
    return gpu_key(cluster.replace("-", " ").replace("_", " "))


def run_row(run: Run, base: dict | None = None, *, rid: str | None = None, model_from: str = "--model") -> dict:
    """A row in calibration.csv's schema: ``base``'s non-empty fields, else what the log says, with the
    measured tokens/s and model TFLOP/s per GPU (the stack profile's FLOP convention)."""
    base = {k: v for k, v in (base or {}).items() if v not in (None, "")}
    row = {k: str(v) for k, v in run.fields.items() if v not in (None, "")}
    row.update({k: str(v) for k, v in base.items()})
    row.setdefault("id", rid or Path(run.source).stem)
    row.setdefault("stack", get_trainer(run.trainer).default_stack)
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
    if run.tokens_per_s_per_gpu is not None:   # the trainer's own tokens/s (TorchTitan, MaxText)
        tok = run.tokens_per_s_per_gpu
    else:                                      # from the step time (Megatron)
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
