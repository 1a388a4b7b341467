"""TorchTitan 0.3.0 rank logs: the device mesh, the optional config dump and the step lines.

Format strings of torchtitan 0.3.0 (quoted; ``tests/test_runs_logs.py`` checks each still occurs in
the installed package):

- ``torchtitan/components/metrics.py`` ``MetricsProcessor.log`` (every ``--metrics.log_freq`` steps and
  step 1; ``tps`` is tokens per second per GPU, ``tflops`` per GPU; ``memory`` is the peak reserved
  since the last log line; ``mfu`` is ``N/A`` when a quantisation converter (FP8/MX) is active)::

      f"{color.red}step: {step:2}  "
      f"{color.turquoise}memory: {device_mem_stats.max_reserved_gib:5.2f}GiB"
      f"({device_mem_stats.max_reserved_pct:.2f}%)  "
      f"{color.blue}tps: {round(tps):,}  "
      f"{color.cyan}tflops: {tflops:,.2f}  "
      f"{color.magenta}mfu: {mfu_str}{color.reset}"

- ``torchtitan/distributed/parallel_dims.py``::

      f"Building device mesh with parallelism: "
      f"pp={self.pp}, dp_replicate={self.dp_replicate}, dp_shard={self.dp_shard}, "
      f"cp={self.cp}, tp={self.tp}, ep={self.ep}"

- ``torchtitan/components/metrics.py`` ``build_device_memory_monitor``::

      f"{device_type.upper()} capacity: {device_memory_monitor.device_name} "
      f"with {device_memory_monitor.device_capacity_gib:.2f}GiB memory"

- ``torchtitan/trainer.py`` (the model's size, ``get_nparams_and_flops``: every parameter)::

      f"{color.red}size: {model_param_count:,} total parameters{color.reset}"

- ``torchtitan/trainer.py`` (``--debug.print_config``)::

      f"Running with configs: {json.dumps(self.to_dict(), indent=2, ensure_ascii=False)}"
"""

from __future__ import annotations

import json
import re
import statistics

from planner.errors import InputError
from planner.trainers.logs import gpu_key, median_after_warmup

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"step: *(\d+)  .*?memory: *([0-9.]+)GiB\(([0-9.]+)%\)  tps: ([0-9,]+)  tflops: ([0-9,.]+)  "
                   r"mfu: ([0-9.]+%|N/A)")
_MESH = re.compile(r"Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(-?\d+), "
                   r"cp=(\d+), tp=(\d+), ep=(\d+)")
_CAPACITY = re.compile(r"[A-Z]+ capacity: (.+?) with ([0-9.]+)GiB memory")
_CONFIG = "Running with configs: "
_SIZE = re.compile(r"size: ([0-9,]+) total parameters")


def detect(text: str) -> bool:
    return "Building device mesh with parallelism:" in text or bool(_STEP.search(_ANSI.sub("", text)))


def parse(text: str, source: str) -> dict:
    """``{"steps": [(step, mem_gib, tps, tflops, mfu, line)], "mesh": {...}, "config": {...}, "device": str,
    "params": int | None}`` (params: the model's size line)."""
    steps, mesh, config, device, params = [], {}, {}, None, None
    lines = _ANSI.sub("", text).splitlines()
    i = 0
    while i < len(lines):
        line, n = lines[i], i + 1
        i += 1
        if _CONFIG in line:   # a JSON object over the next lines
            buf = line.split(_CONFIG, 1)[1]
            while buf.count("{") > buf.count("}") and i < len(lines):
                buf += "\n" + lines[i]
                i += 1
            try:
                config = json.loads(buf)
            except json.JSONDecodeError:
                raise InputError(f"{source}:{n}: cannot read TorchTitan's config dump ('Running with configs: "
                                 "{...}')") from None
            continue
        if "step:" in line and "tps:" in line and "validate step" not in line:
            m = _STEP.search(line)
            if not m:
                raise InputError(f"{source}:{n}: cannot read TorchTitan's step line (expected 'step: N  loss: ...  "
                                 f"memory: X GiB(P%)  tps: T  tflops: F  mfu: M'): {line.strip()[:120]}")
            mfu = None if m.group(6) == "N/A" else float(m.group(6)[:-1])
            steps.append((int(m.group(1)), float(m.group(2)), float(m.group(4).replace(",", "")),
                          float(m.group(5).replace(",", "")), mfu, n))
            continue
        m = _MESH.search(line)
        if m:
            mesh = dict(zip(("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep"), (int(x) for x in m.groups())))
            continue
        m = _CAPACITY.search(line)
        if m and device is None:
            device = m.group(1).strip()
            continue
        m = _SIZE.search(line)
        if m:
            params = int(m.group(1).replace(",", ""))
    return {"steps": steps, "mesh": mesh, "config": config, "device": device, "params": params}


def row_fields(parsed: dict) -> dict:
    """The CSV fields the mesh line and (when printed) the config give."""
    out: dict = {}
    mesh = parsed["mesh"]
    if mesh:
        out.update(tp=mesh["tp"], pp=mesh["pp"], cp=mesh["cp"], ep=mesh["ep"], vpp=1,
                   num_gpus=mesh["pp"] * mesh["dp_replicate"] * max(mesh["dp_shard"], 1) * mesh["cp"] * mesh["tp"],
                   fsdp=1 if mesh["dp_shard"] > 1 else 0)
    cfg = parsed["config"]
    tr = cfg.get("training") or {}
    if tr.get("seq_len"):
        out["seq_len"] = int(tr["seq_len"])
    if tr.get("local_batch_size"):   # the pipeline's micro-batch under PP, else the local batch
        pp_mbs = (cfg.get("parallelism") or {}).get("pipeline_parallel_microbatch_size")
        out["mbs"] = int(pp_mbs if pp_mbs and mesh.get("pp", 1) > 1 else tr["local_batch_size"])
    if tr.get("global_batch_size") and int(tr["global_batch_size"]) > 0:
        out["gbs"] = int(tr["global_batch_size"])
    elif tr.get("local_batch_size") and mesh:
        out["gbs"] = int(tr["local_batch_size"]) * mesh["dp_replicate"] * max(mesh["dp_shard"], 1)
    if "activation_checkpoint" in cfg:   # a subcommand: null for activation-checkpoint:none
        ac = cfg["activation_checkpoint"] or {"mode": "none"}
        out["recompute"] = {"none": "none", "full": "full", "selective": "core_attn"}.get(str(ac.get("mode")), "")
    steps = parsed["steps"]
    if steps and all(s[4] is not None for s in steps):
        out["precision"] = "bf16"   # mfu is printed only without a quantisation converter
    return out


def model_shape(parsed: dict) -> dict:
    """What identifies the model in the log: its parameter count, when printed."""
    return {"params": parsed["params"]} if parsed.get("params") else {}


def run_fields(text: str, source: str) -> dict:
    """What a TorchTitan log says of its run (``planner.calibration.runs.Run`` fields): the median tokens/s per GPU
    after the warm-up, its own TFLOP/s figure, the device it names, the peak reserved memory."""
    p = parse(text, source)
    steps = p["steps"]
    tps, used, skip = median_after_warmup([(s[0], s[2]) for s in steps], source, "step")
    kept = [s for s in steps if s[0] > skip]
    return dict(fields=row_fields(p), shape=model_shape(p), gpu=gpu_key(p["device"]),
                tokens_per_s_per_gpu=tps, logged_tflops_per_gpu=statistics.median(s[3] for s in kept),
                iters_used=used, iters_skipped=skip, peak_reserved_gib=max(s[1] for s in kept))
