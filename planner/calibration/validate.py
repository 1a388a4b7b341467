"""Predicted against measured: rows in the schema of calibration.csv.

Columns: ``id, stack, model, gpu, num_gpus, precision, seq_len, gbs, mbs, tp, pp, vpp, cp, ep, etp,
fsdp, recompute, tokens_per_s_per_gpu, model_tflops_per_gpu`` (``source`` and other columns are
ignored). An empty ``etp`` is the trainer default (ETP = TP), or ETP = 1 when the expert grid
cannot hold the default (the published run then set it, as Megatron-Bridge's MoE recipes do); ``fsdp`` is empty/0 (distributed
optimizer) or 1 / the FSDP sharding degree (Megatron-Bridge's tables use both);
an empty ``recompute`` means the cheapest recompute that fits in memory (none, then the selective
sets, then full); text after the recompute value in brackets or after a space is a comment.
An optional ``dispatcher`` column (alltoall, allgather, flex-deepep, flex-hybridep; empty = the
stack's) gives the MoE token dispatcher the recipe used. Optional ``tp_comm_overlap`` and
``overlap_moe_expert_parallel_comm`` columns (true / false; empty = the trainer's default per layout)
switch those overlaps; an optional ``cuda_graph_scope`` column names the captured modules
(``attn+moe_router+moe_preprocess``, ``full_iteration``; empty = the trainer's default scope); an optional
``cpu_offload_layers`` column (an integer; empty or 0 = none) gives the decoder layers whose activations
the run offloaded to the CPU (``Recipe.cpu_offload_layers``; such a row is priced without recompute,
which megatron-core refuses beside offloading); an optional ``fp8_param_gather`` column (true / false; empty =
auto, on for fp8 and mxfp8 as NVIDIA's recipes) says whether the run kept FP8 parameters
(``Recipe.fp8_param_gather``), and an optional ``fp4_param_gather`` column likewise for NVFP4 parameters
(empty = auto, on for nvfp4; ``Recipe.fp4_param_gather``); an optional ``fp8_recipe`` column (delayed /
tensorwise; empty = tensorwise) gives a precision-fp8 run's --fp8-recipe (``Recipe.fp8_recipe``: delayed scaling
adds the amax all-reduce of planner/cost/terms/fp8_scaling.py). An optional ``optimizer_offload_fraction`` column (0 to 1;
empty = none) gives the share of the optimizer a Megatron run kept on the host (``Recipe.optimizer_offload_fraction``,
priced by the ``cpu_optimizer`` term: a measured run with it is what that term lacks). A published run that planner/data/published_recipes.yaml records (id, model,
gpu, num_gpus and precision equal) gets its recorded settings in the columns it leaves empty. An optional ``cuda_graphs`` column (true / false; empty = true) says whether the recipe captured
CUDA graphs; for Megatron that also fuses its elementwise ops, so false rows are priced with the profile's
``mem.elementwise_eager`` (``Training.cuda_graphs``). An optional ``torch_compile`` column (true / false; empty
= what the model's TorchTitan 0.3.0 registry function does) says whether a TorchTitan run compiled the model
(``Recipe.torch_compile``): TorchTitan's fused regime, false rows are priced with ``mem.elementwise_eager``
whatever their ``cuda_graphs``; other stacks refuse the column's value.

Each row's cluster is the preset of its GPU (H100 -> dgx-h100, H200 -> dgx-h200, B200 -> dgx-b200,
B300 -> dgx-b300, GB200 -> gb200-nvl72, GB300 -> gb300-nvl72) sized by ``num_gpus``; on NVL72 racks
the GPUs used per rack are chosen so that the innermost parallel groups (tp*cp, etp*ep) stay whole
inside a rack, as launchers do (e.g. 64 of 72 GPUs per rack for EP32/EP64), unless the optional
``usable_per_rack`` column (or ``validate --usable-per-rack``) fixes them. Measured runs are judged
against the whole HBM (``memory_headroom`` 0: they ran).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from planner.config import ParallelConfig, Training
from planner.cost.placement import inner_block
from planner.cost.predict import predict
from planner.cost.prediction import Prediction
from planner.cost.profiles import load_profile
from planner.calibration.runs import LOG_REQUIRED, rows_from_csv_logs, rows_from_logs
from planner.errors import InputError, not_utf8, pydantic_message
from planner.model.spec import load_model
from planner.rules import offload_layers, violations
from planner.trainers.megatron.recipe import CUDA_GRAPH_MODULES
from topologies.loader import load_cluster

GPU_PRESETS = {"H100": "dgx-h100", "H200": "dgx-h200", "B200": "dgx-b200", "B300": "dgx-b300",
               "GB200": "gb200-nvl72", "GB300": "gb300-nvl72"}
REQUIRED = ("id", "model", "gpu", "num_gpus", "precision", "seq_len", "gbs", "mbs", "tp", "pp")
# cheapest first: recompute candidates tried when a row leaves recompute empty
RECOMPUTE_LADDER = ("none", "moe_act", "layernorm+moe_act", "mla_up_proj+moe_act", "core_attn", "mlp",
                    "core_attn+mlp", "moe", "full")


@dataclass
class Case:
    id: str
    stack: str
    model: object
    cluster: object
    config: ParallelConfig
    training: Training
    measured_tflops: float | None
    measured_tokens: float | None
    auto_recompute: bool
    graphs_stated: bool = True   # the row's cuda_graphs column says whether the run captured graphs
    num_gpus: int = 0            # the row's GPUs (the world its layout is judged on)


def read_rows(path: str | Path, *, model: str | None = None, cluster: str | None = None,
              stack: str | None = None) -> list[dict]:
    """Rows of a CSV in calibration.csv's schema; a trainer log or a directory of logs (issue 13: read
    by ``planner.calibration.runs``, ``model``/``cluster``/``stack`` fill what a log cannot tell); a CSV with a
    ``log`` column needs only ``id, stack, model, gpu, num_gpus`` and reads the rest from each log."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file; give a CSV in the schema of calibration.csv, a trainer log or a "
                         "directory of logs")
    if path.is_dir() or path.suffix.lower() != ".csv":
        return rows_from_logs([path], model=model, cluster=cluster, stack=stack)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc, "CSV") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    cols = reader.fieldnames or []
    missing = [c for c in (LOG_REQUIRED if "log" in cols else REQUIRED) if c not in cols]
    if missing:
        raise InputError(f"{path}: missing column {missing[0]!r} (see the schema of calibration.csv)")
    rows = [dict(r) for r in reader]
    if not rows:
        raise InputError(f"{path}: no rows under the header; add one row per measured run (see the schema of "
                         "calibration.csv)")
    return rows_from_csv_logs(rows, path) if "log" in cols else rows


def _int(row, key, default=None, path="CSV"):
    v = (row.get(key) or "").strip()
    if v == "":
        if default is None:
            raise InputError(f"{path}: row {row.get('id', '?')}: column {key!r} is empty; give an integer")
        return default
    try:
        return int(float(v))
    except ValueError:
        raise InputError(f"{path}: row {row.get('id', '?')}: column {key!r} = {v!r} is not an integer") from None


def _float(row, key):
    v = (row.get(key) or "").strip()
    return float(v) if v else None


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def _cuda_graphs(row, source) -> bool:
    """The optional ``cuda_graphs`` column: empty or absent = the stack's usual regime (graphs on)."""
    v = (row.get("cuda_graphs") or "").strip().lower()
    if not v or v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise InputError(f"{source}: row {row.get('id', '?')}: column 'cuda_graphs' = {v!r}; use true or false "
                     "(or leave it empty for the stack's usual regime)")


RECIPE_COLUMNS = ("tp_comm_overlap", "overlap_moe_expert_parallel_comm", "fp8_param_gather",
                  "fp4_param_gather", "torch_compile")  # optional true/false
_PUBLISHED: dict | None = None


def published_recipe(row: dict) -> dict:
    """The recipe settings planner/data/published_recipes.yaml records for a published run (issue 12):
    {setting: value, "source": ...} when the row's id, model, gpu, num_gpus and precision match an
    entry, else {}."""
    global _PUBLISHED
    if _PUBLISHED is None:
        path = Path(__file__).resolve().parents[1] / "data" / "published_recipes.yaml"
        _PUBLISHED = (yaml.safe_load(path.read_text()) or {}).get("runs") or {}
    entry = _PUBLISHED.get((row.get("id") or "").strip())
    if not entry:
        return {}
    if any(str(row.get(k) or "").strip().lower() != str(v).lower() for k, v in entry["match"].items()):
        return {}
    return {k: v for k, v in entry.items() if k != "match"}


def with_published_recipe(row: dict) -> dict:
    """The row with the recorded recipe settings of its published run in the columns it leaves empty."""
    facts = published_recipe(row)
    out = dict(row)
    for key in ("cuda_graphs", "cuda_graph_scope", "dispatcher", "cpu_offload_layers", "recompute",
                "fp8_recipe") + RECIPE_COLUMNS:
        if key in facts and not (row.get(key) or "").strip():
            out[key] = str(facts[key]).lower()
    return out


def _offload_fraction(row, source) -> float | None:
    """The optional ``optimizer_offload_fraction`` column: the share of the optimizer the run kept on the host
    (Megatron's --optimizer-offload-fraction with --optimizer-cpu-offload; empty = none)."""
    v = (row.get("optimizer_offload_fraction") or "").strip()
    if not v:
        return None
    try:
        f = float(v)
    except ValueError:
        f = -1.0
    if not 0.0 <= f <= 1.0:
        raise InputError(f"{source}: row {row.get('id', '?')}: column 'optimizer_offload_fraction' = {v!r}; use the "
                         "share of the optimizer state the run kept on the host, 0 to 1 (empty = none)")
    return f


def _recipe(row, source):
    """The optional recipe columns (true / false; empty = auto, as the trainer decides per layout) and
    ``cuda_graph_scope`` (the captured modules joined with '+', e.g. ``attn+moe_router+moe_preprocess``,
    or ``full_iteration``; empty = the trainer's default scope)."""
    settings = {}
    rid = row.get("id", "?")
    for key in RECIPE_COLUMNS:
        v = (row.get(key) or "").strip().lower()
        if v and v not in _TRUE + _FALSE:
            raise InputError(f"{source}: row {rid}: column {key!r} = {v!r}; use true or false "
                             "(or leave it empty for the trainer's default)")
        if v:
            settings[key] = v in _TRUE
    off = (row.get("cpu_offload_layers") or "").strip()
    if off:
        if not off.isdigit():
            raise InputError(f"{source}: row {rid}: column 'cpu_offload_layers' = {off!r}; use the number of decoder "
                             "layers whose activations the run offloaded to the CPU (0 or empty = none)")
        settings["cpu_offload_layers"] = int(off) or None
    fp8r = (row.get("fp8_recipe") or "").strip().lower()
    if fp8r:
        if fp8r not in ("delayed", "tensorwise"):
            raise InputError(f"{source}: row {rid}: column 'fp8_recipe' = {fp8r!r}; use delayed or tensorwise "
                             "(the run's --fp8-recipe with precision fp8), or leave it empty for tensorwise")
        settings["fp8_recipe"] = fp8r
    frac = _offload_fraction(row, source)
    if frac is not None:
        settings["optimizer_offload_fraction"] = frac
    scope = (row.get("cuda_graph_scope") or "").strip().lower()
    if scope:
        if not _cuda_graphs(row, source):
            raise InputError(f"{source}: row {rid}: column 'cuda_graph_scope' = {scope!r} but cuda_graphs is "
                             "false; leave the scope empty for a run without CUDA graphs")
        mods = scope.replace("+", " ").replace(",", " ").split()
        if "full_iteration" in mods:
            settings["cuda_graph_impl"] = "full_iteration"
        else:
            bad = [m for m in mods if m not in CUDA_GRAPH_MODULES]
            if bad:
                raise InputError(f"{source}: row {rid}: column 'cuda_graph_scope' names {bad[0]!r}; use modules of "
                                 f"{', '.join(CUDA_GRAPH_MODULES)} joined with '+', or full_iteration")
            settings["cuda_graph_modules"] = tuple(mods)
    return settings


def _recompute(text: str) -> str:
    """The recompute column without comments in brackets: ``none (recompute_modules=[])`` -> ``none``,
    ``mla_up_proj moe_act`` stays a module list (separators: space, comma, +)."""
    t = (text or "").split("(", 1)[0].split("[", 1)[0]
    return t.strip().strip('"').strip()


_CLUSTER_CACHE: dict = {}


def cluster_for(gpu: str, num_gpus: int, config: ParallelConfig, source: str = "CSV", usable: int | None = None):
    """The preset cluster for a row's GPU, sized by ``num_gpus``, racks used so inner groups stay whole."""
    key = "".join(ch for ch in gpu.upper() if ch.isalnum())
    preset = next((GPU_PRESETS[k] for k in ("GB300", "GB200", "B300", "B200", "H200", "H100") if key.startswith(k)),
                  None)
    if preset is None:
        raise InputError(f"{source}: gpu {gpu!r} has no preset; use one of {', '.join(GPU_PRESETS)}")
    return preset_cluster(preset, num_gpus, config, usable)


def preset_cluster(preset: str, num_gpus: int, config: ParallelConfig, usable: int | None = None):
    """A preset cluster of ``num_gpus`` GPUs; NVL72 racks run the most GPUs per rack that keeps the
    inner parallel groups (tp*cp, etp*ep) whole and divides ``num_gpus`` (64 of 72 for EP32/EP64)."""
    # ``usable`` (the row's usable_per_rack column or validate --usable-per-rack): the same cluster
    # as topologies.loader.load_job(preset, num_gpus, usable) builds for plan and predict
    if usable is None and preset.lower().endswith("nvl72") and num_gpus > 72:
        block = inner_block(config)
        for g in range(72, 3, -4):  # whole 4-GPU trays
            if (g % block == 0 or block % g == 0) and num_gpus % g == 0:
                usable = g
                break
    key = (preset, num_gpus, usable)
    if key not in _CLUSTER_CACHE:
        _CLUSTER_CACHE[key] = load_cluster(preset, gpus=num_gpus, usable_per_domain=usable)
    return _CLUSTER_CACHE[key]


def row_case(row: dict, stack: str | None = None, source: str = "CSV", profile=None,
             usable_per_rack: int | None = None) -> Case:
    row = with_published_recipe(row)
    rid = row.get("id") or "?"
    fsdp_deg = _int(row, "fsdp", 0, source)
    rc = _recompute(row.get("recompute", ""))
    etp = (row.get("etp") or "").strip()
    try:
        config = ParallelConfig(
            tp=_int(row, "tp", 1, source), pp=_int(row, "pp", 1, source), vpp=_int(row, "vpp", 1, source),
            cp=_int(row, "cp", 1, source), ep=_int(row, "ep", 1, source), etp=int(etp) if etp else None,
            mbs=_int(row, "mbs", 1, source), fsdp=fsdp_deg >= 1, recompute=rc or "none")
        st = (stack or row.get("stack") or "megatron-26.08").strip()
        prof = profile if profile is not None else load_profile(st)
        disp = (row.get("dispatcher") or "").strip().lower()
        config = ParallelConfig.model_validate(config.model_dump() | {"dispatcher": disp or prof.dispatcher})
        training = Training(seq_len=_int(row, "seq_len", None, source), global_batch=_int(row, "gbs", None, source),
                            precision=(row.get("precision") or "bf16").strip().lower(), stack=st,
                            trainer=prof.trainer, cuda_graphs=_cuda_graphs(row, source),
                            recipe=_recipe(row, source),
                            memory_headroom="0")  # a measured run ran: it is judged against the whole HBM
    except ValidationError as exc:
        raise InputError(pydantic_message(exc, f"{source}: row {rid}")) from None
    except ValueError as exc:
        raise InputError(f"{source}: row {rid}: {str(exc).splitlines()[0]}") from None
    model = load_model(row["model"].strip())
    mtp = (row.get("mtp_layers") or "").strip()   # optional column: a run with another MTP depth than the config's
    if mtp:
        depth = _int(row, "mtp_layers", 0, source)
        if depth < 0:
            raise InputError(f"{source}: row {rid}: column 'mtp_layers' = {depth} is negative; give 0 or more")
        model = model.model_copy(update={"mtp_layers": depth})
    n = _int(row, "num_gpus", None, source)
    if not etp and model.is_moe and config.tp > 1:
        # Megatron's default ETP = TP; a published run whose expert grid cannot hold that default
        # (etp*ep*pp does not divide the GPUs) set ETP = 1, as Megatron-Bridge's MoE recipes do
        if any(v.rule == "expert_grid_div_world" for v in violations(model, config, training, n)):
            config = config.model_copy(update={"etp": 1})
    usable = _int(row, "usable_per_rack", 0, source) or usable_per_rack  # optional column, else the option
    cluster = cluster_for(row["gpu"], n, config, source, usable or None)
    return Case(rid, st, model, cluster, config, training, _float(row, "model_tflops_per_gpu"),
                _float(row, "tokens_per_s_per_gpu"), not rc, bool((row.get("cuda_graphs") or "").strip()), n)


def refusal(case: Case) -> str | None:
    """``"rule: message"`` for the first rule of the row's trainer (planner.rules) that its layout breaks:
    the trainer would not run it, so it has no prediction and no fit uses it (None: the trainer runs it)."""
    broken = violations(case.model, case.config, case.training, case.num_gpus)
    return f"{broken[0].rule}: {broken[0].message}" if broken else None


def fits_as_run(p: Prediction, case: Case) -> bool:
    """Whether a measured run fits as published: in the whole HBM (validate's headroom is 0), with the
    CUDA-graph static buffers when its row says the recipe captured graphs; a row that does not say is
    priced in the stack's usual regime (graphs on) but not refused on that assumption, so it also fits
    when it fits without the buffers (e.g. Llama 3.1 405B on GB200, whose Megatron-Bridge recipe sets
    no cuda_graph_impl, at 195 GiB with them and 186 without)."""
    if p.fits or case.graphs_stated:
        return bool(p.fits)
    room = p.usable_gib if p.usable_gib is not None else p.hbm_gib
    return p.memory_gib_per_gpu - p.memory.get("cuda_graphs", 0.0) <= room


def predict_case(case: Case, profile=None) -> Prediction:
    """Predict a row; an empty recompute takes the cheapest candidate that fits (none only when the row
    offloads activations to the CPU: megatron-core refuses recompute with it, planner.rules)."""
    if not case.auto_recompute or offload_layers(case.training):
        return predict(case.model, case.cluster, case.config, case.training, profile=profile)
    first = None
    for rc in RECOMPUTE_LADDER:
        mods = rc.split("+")
        if rc not in ("none", "full"):
            if "mla_up_proj" in mods and case.model.attention != "mla":
                continue
            if any(m_ in ("moe", "moe_act") for m_ in mods) and not case.model.is_moe:
                continue
            if "mlp" in mods and not any(not x for x in case.model.moe_layers or (False,)):
                continue
        cfg = case.config.model_copy(update={"recompute": rc})
        p = predict(case.model, case.cluster, cfg, case.training, profile=profile)
        if first is None:
            first = p
        if fits_as_run(p, case):
            return p
    return first


def error_pct(pred: float, measured: float) -> float:
    return 100.0 * (pred - measured) / measured


def compared(case: Case, row: dict, p: Prediction | None, refused: str | None = None) -> dict:
    """One ``validate --json`` row: the measured run beside its ``Prediction`` (None when the trainer
    refuses the layout: ``refused`` names the rule). The predicted fields are the prediction's own,
    rounded for print."""
    meas = case.measured_tflops
    err = error_pct(p.tflops_per_gpu, meas) if p is not None and meas else None
    return {"id": case.id, "stack": case.stack, "model": case.model.name, "gpu": row["gpu"],
            "num_gpus": int(row["num_gpus"]), "precision": case.training.precision,
            "config": (case.config if p is None else p.config).short(),
            "predicted_tflops_per_gpu": None if p is None else round(p.tflops_per_gpu, 1),
            "predicted_tokens_per_s_per_gpu": None if p is None else round(p.tokens_per_s_per_gpu, 1),
            "measured_tflops_per_gpu": meas, "measured_tokens_per_s_per_gpu": case.measured_tokens,
            "error_pct": None if err is None else round(err, 2),
            "fits": None if p is None else fits_as_run(p, case), "refused": refused,
            "breakdown": {} if p is None else {k: round(v, 4) for k, v in p.breakdown.items()},
            "step_time_s": None if p is None else p.step_time_s}


def validate_rows(rows: list[dict], stack: str | None = None, profile=None, source: str = "CSV",
                  progress=None, usable_per_rack: int | None = None) -> dict:
    """Predict every row: ``{"rows": [...], "mape_pct": ...}`` (the ``validate --json`` document, each row
    :func:`compared`). A row whose layout breaks a rule of its trainer is not predicted: ``refused``
    names the rule (:func:`refusal`)."""
    out = []
    for row in rows:
        case = row_case(row, stack, source, profile=profile, usable_per_rack=usable_per_rack)
        refused = refusal(case)
        out.append(compared(case, row, None if refused else predict_case(case, profile), refused))
        if progress is not None:
            progress.advance()
    errs = [abs(r["error_pct"]) for r in out if r["error_pct"] is not None]
    return {"rows": out, "mape_pct": round(sum(errs) / len(errs), 2) if errs else None,
            "max_abs_error_pct": round(max(errs), 2) if errs else None}


def resolve_case(case: Case, profile=None) -> Case:
    """The case with its recompute fixed (the cheapest that fits when the row left it empty)."""
    if not case.auto_recompute:
        return case
    p = predict_case(case, profile)
    return dataclasses.replace(case, config=p.config, auto_recompute=False)
