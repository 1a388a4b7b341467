"""Trial jobs (issue 13): short runs of a plan's leading layouts, with the logging the log readers need.

``write_trials(plan_doc, out, top, iters, compare, trainer)`` writes, for plan entries 0..top-1 (and
a ``--compare`` layout, priced and placed like a plan entry), one directory ``trial-NN-<layout>/`` of
launch files made by the emitters (``planner.output.emit.emit_plan``), then sets the run length and
logging in the trainer's file:

- Megatron-LM ``megatron/args.txt``: ``--train-iters N``, ``--log-interval 1``, ``--log-throughput``,
  ``--log-memory-interval N`` (``report_memory`` after the last iteration: the whole run's peak) and
  ``--log-device-memory-used`` (the whole device, CUDA context and NCCL buffers included);
- Megatron-Bridge ``bridge/overrides.txt``: ``train.train_iters=N``, ``logger.log_interval=1``,
  ``logger.log_throughput=true``;
- TorchTitan ``torchtitan/command.txt`` and ``job.toml``: ``--training.steps N``,
  ``--metrics.log_freq 1``, ``--debug.print_config`` (the config dump gives batch and sequence);
- MaxText ``maxtext/overrides.yml``: ``steps: N``.

Plus ``submit_all.sh`` (one ``sbatch`` per trial, output in ``trial-NN-*/logs/``), ``trials.json``
(the manifest: each trial's layout and predicted figures, what ``topoplan calibrate DIR`` and
``topoplan trial-report DIR`` read back) and a README. Everything is staged and moved at once.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from planner.cost.placement import group_shapes, make_placement
from planner.cost.predict import predict
from planner.cost.profiles import load_profile
from planner.calibration.runs import rows_from_trials
from planner.calibration.validate import validate_rows
from planner.errors import InputError
from planner.io import atomic_dir, current_umask
from planner.output.emit import emit_plan
from planner.rules import check
from planner.search.document import load_launch
from planner.search.plan import PlanEntry, PlanResult
from planner.trainers import DEFAULT, EMITTER_OWNER, owner_of

MANIFEST = "trials.json"
TRAINERS = tuple(EMITTER_OWNER)   # every trainer emitter (planner.trainers): each edits its files for a trial


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower()


def compare_plan_entry(doc: dict, cfg) -> dict:
    """A plan entry (config, prediction, placement) for the layout ``cfg`` (a ParallelConfig, e.g.
    ``planner.cli.plan.parse_layout("TP1,PP2")``) on the plan's job."""
    launch = load_launch(doc)
    model, cluster, training = launch.model.spec, launch.cluster, launch.training
    best = doc["plans"][0]["config"]
    training = training.model_copy(update={"global_batch": best.get("gbs") or training.global_batch})
    world = cfg.world(int(best.get("world") or cluster.num_gpus))
    if cfg.dp is None:
        cfg = cfg.model_copy(update={"dp": world // cfg.model_parallel})
    if cfg.dispatcher is None:
        cfg = cfg.model_copy(update={"dispatcher": load_profile(training.stack).dispatcher})
    check(model, cfg, training, world)
    placement = make_placement(cluster, cfg, world)
    pred = predict(model, cluster, cfg, training, placement=placement)
    entry = PlanEntry(config=cfg, prediction=pred, placement=placement, world=world, gbs=training.global_batch,
                      shapes={ax: (None, None, sh.domains) for ax, sh in group_shapes(cluster, cfg, placement).items()})
    res = PlanResult(plans=[entry], solver={}, model=model, cluster=cluster, training=training)
    return res.to_dict()["plans"][0]


SUBMIT = """#!/usr/bin/env bash
# Submit every trial of this directory (written by topoplan trial): one sbatch per layout, each
# running {iters} iterations with {trainer}; the rank logs land in trial-NN-*/logs/.
# Fill in the FILL_ME_* values of each trial's slurm/sbatch.sh first, or export them here (sbatch
# passes the environment on), e.g. TOPOPLAN_CONTAINER_IMAGE, MEGATRON_LM, TOPOPLAN_DATA_ARGS.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
export TOPOPLAN_TRAINER={trainer}
for d in {dirs}; do
  mkdir -p "$HERE/$d/logs"
  (cd "$HERE/$d" && TOPOPLAN_DIR="$HERE/$d" sbatch --job-name="topoplan-$d" --output="$HERE/$d/logs/slurm-%j.out" slurm/sbatch.sh)
done
"""

README = """# Trial jobs written by topoplan

{n} layouts of the plan for {model} on {gpus} x {gpu} ({stack}, {trainer}), {iters} iterations each.

| trial | layout | predicted TFLOP/s per GPU | step time (s) | memory (GiB per GPU) |
|---|---|---|---|---|
{table}

1. Fill in the `FILL_ME_*` values of each `trial-*/slurm/sbatch.sh` (or export them), then
   `bash submit_all.sh`. Each trial writes its rank logs to `trial-*/logs/`.
2. When they have run: `topoplan trial-report .` shows predicted against measured per trial;
   `topoplan calibrate . --stack my-stack -o fitted.yaml` fits a stack profile (and the memory
   reserve) to the measured runs; `topoplan trial-report . --profile fitted.yaml` adds the refitted
   prediction; `topoplan plan ... --stack fitted.yaml` plans again with it.

The first max(2, N/5) iterations of each run are dropped as warm-up and the median of the rest is
used (docs/closed_loop.md).
"""


def write_trials(plan_doc: dict, out: Path, *, top: int = 3, iters: int = 20, compare=None,
                 trainer: str | None = None) -> list[dict]:
    """Write the trial directories, ``submit_all.sh``, ``trials.json`` and ``README.md`` into ``out``."""
    if iters < 5:
        raise InputError(f"--iters {iters}: run at least 5 iterations (the first max(2, N/5) are warm-up and the "
                         "median needs 3 more); 20 is a good default")
    doc = copy.deepcopy(plan_doc)
    launch = load_launch(doc)
    trainer = (trainer or launch.training.trainer or DEFAULT).lower()
    if trainer not in TRAINERS:
        raise InputError(f"--trainer {trainer!r}: use one of {', '.join(TRAINERS)}")
    plans = doc.get("plans") or []
    if not plans:
        raise InputError("plan.json holds no plans; run topoplan plan --save-plan first")
    n_plans = len(plans)
    picks = list(range(min(top, n_plans)))
    if compare is not None:   # a ParallelConfig
        doc["plans"].append(compare_plan_entry(doc, compare))
        picks.append(len(doc["plans"]) - 1)
    model = launch.model.spec
    gpu = launch.cluster.gpu_spec.name.upper()
    trials = []
    out = Path(out)
    with atomic_dir(out) as stage:
        for k, idx in enumerate(picks):
            entry = doc["plans"][idx]
            name = f"trial-{k:02d}-{_slug(entry['label'])}"
            d = stage / name
            emit_plan(doc, [trainer, "slurm"], d, index=idx)
            owner_of(trainer).emitter(trainer).for_trial(d, iters)
            (d / "logs").mkdir(exist_ok=True)
            pred = entry["prediction"]
            cfg = entry["config"]
            trials.append({"id": name, "plan_index": idx, "compare": idx >= n_plans, "label": entry["label"],
                           "model": model.name, "gpu": gpu, "num_gpus": cfg["world"], "stack": launch.training.stack,
                           "trainer": trainer, "iters": iters, "config": cfg,
                           "predicted": {k2: pred[k2] for k2 in ("tflops_per_gpu", "tokens_per_s_per_gpu",
                                                                  "step_time_s", "memory_gib_per_gpu")}})
        dirs = " ".join(t["id"] for t in trials)
        (stage / "submit_all.sh").write_text(SUBMIT.format(iters=iters, trainer=trainer, dirs=dirs))
        (stage / "submit_all.sh").chmod(0o777 & ~current_umask())
        (stage / MANIFEST).write_text(json.dumps({"trials": trials}, indent=1) + "\n")
        table = "\n".join(f"| {t['id']} | {t['label']}{' (compare)' if t['compare'] else ''} | "
                          f"{t['predicted']['tflops_per_gpu']:.0f} | {t['predicted']['step_time_s']:.2f} | "
                          f"{t['predicted']['memory_gib_per_gpu']:.1f} |" for t in trials)
        (stage / "README.md").write_text(README.format(n=len(trials), model=model.name, gpus=trials[0]["num_gpus"],
                                                       gpu=gpu, stack=launch.training.stack, trainer=trainer,
                                                       iters=iters, table=table))
    return trials


def report(out: Path, profile=None) -> dict:
    """Predicted (at planning time), measured and, with ``profile``, refitted figures per trial."""
    man = json.loads((Path(out) / MANIFEST).read_text())
    rows = {r["id"]: r for r in rows_from_trials(out)}
    refit = {}
    if profile is not None:
        res = validate_rows(list(rows.values()), stack=None, profile=profile, source=str(out))
        refit = {r["id"]: r for r in res["rows"]}
    lines = []
    for t in man["trials"]:
        r = rows.get(t["id"])
        pred = t["predicted"]["tflops_per_gpu"]
        item = {"id": t["id"], "label": t["label"], "predicted_tflops_per_gpu": round(pred, 1),
                "predicted_memory_gib": round(t["predicted"]["memory_gib_per_gpu"], 1)}
        if r is not None:
            meas = float(r["model_tflops_per_gpu"])
            item.update(measured_tflops_per_gpu=meas, error_pct=round(100 * (pred - meas) / meas, 2),
                        iters_used=int(r["iters_used"]), log=r["log"])
            mem = r.get("device_used_gib") or r.get("peak_reserved_gib")
            if mem:
                item["measured_memory_gib"] = float(mem)
        if t["id"] in refit:
            item["refitted_tflops_per_gpu"] = refit[t["id"]]["predicted_tflops_per_gpu"]
            item["refitted_error_pct"] = refit[t["id"]]["error_pct"]
        lines.append(item)
    errs = [abs(x["error_pct"]) for x in lines if "error_pct" in x]
    rerr = [abs(x["refitted_error_pct"]) for x in lines if x.get("refitted_error_pct") is not None]
    return {"trials": lines, "mape_pct": round(sum(errs) / len(errs), 2) if errs else None,
            "refitted_mape_pct": round(sum(rerr) / len(rerr), 2) if rerr else None}
