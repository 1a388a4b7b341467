"""Megatron-LM / Megatron-Bridge rank logs: the arguments block, the iteration lines, the memory reports.

Every pattern below is written against a format string of megatron-core 0.19.2 (quoted above it);
``tests/test_runs_logs.py`` checks that each quoted string still occurs in that release's source and
reads log text printed by its own ``_print_args``.

- ``megatron/training/arguments.py`` ``_print_args(title, args)``::

      print(f'------------------------ {title} ------------------------', flush=True)
      dots = '.' * (48 - len(arg))
      str_list.append('  {} {} {}'.format(arg, dots, getattr(args, arg)))
      print(f'-------------------- end of {title} ---------------------', flush=True)

- ``megatron/training/training.py`` ``training_log`` (printed by the *last* rank, ``print_rank_last``)::

      log_string += ' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)
      log_string += ' consumed samples: {:12d} |'.format(args.consumed_train_samples)
      log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(
      log_string += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
      log_string += f' global batch size: {batch_size:5d} |'

- ``megatron/training/utils/common_utils.py`` ``report_memory(name)`` (data-parallel rank 0 of every
  model-parallel group; ``name`` is ``f'(after {iteration} iterations)'`` in ``training_log``)::

      string = name + ' memory (MB)'
      string += f" | allocated: {torch.cuda.memory_allocated() / mega_bytes:.2f}"
      string += f" | max allocated: {torch.cuda.max_memory_allocated() / mega_bytes:.2f}"
      string += f" | reserved: {torch.cuda.memory_reserved() / mega_bytes:.2f}"
      string += f" | max reserved: {torch.cuda.max_memory_reserved() / mega_bytes:.2f}"
      string += f" | total device memory used: {torch.cuda.device_memory_used() / mega_bytes:.2f}"
      print("[Rank {}] {}".format(torch.distributed.get_rank(), string), flush=True)
"""

from __future__ import annotations

import ast
import re
import statistics

from planner.errors import InputError
from planner.trainers.logs import median_after_warmup

ARGS_TITLE = "arguments"
_ARGS_OPEN = re.compile(r"^-{24} (\S+) -{24}$")
_ARGS_CLOSE = re.compile(r"^-{20} end of (\S+) -{21}$")
# '  {} {} {}'.format(arg, dots, value): dots is empty for names of 48 characters or more
_ARG = re.compile(r"^  ([A-Za-z_][A-Za-z0-9_]*) (?:\.+ |(?=\s))\s?(.*)$")
_ITER = re.compile(r" iteration +(\d+)/ *(\d+) \| consumed samples: +(\d+) \|")
_ELAPSED = re.compile(r" elapsed time per iteration \(ms\): ([0-9.]+(?:e[+-]?\d+)?|nan|inf) \|")
_THROUGHPUT = re.compile(r" throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+|nan|inf) \|")
_GBS = re.compile(r" global batch size: +(\d+) \|")
_MEM = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([0-9.]+) \| "
                  r"max allocated: ([0-9.]+) \| reserved: ([0-9.]+) \| max reserved: ([0-9.]+)"
                  r"(?: \| total device memory used: ([0-9.]+))?")
# Megatron-Bridge's training_log (src/megatron/bridge/training/utils/train_utils.py) prints the same
# iteration line and its own memory report, in GB (1e9 bytes) under torch.cuda.memory_stats names:
#   memory_string = f"(after {iteration} iterations) memory (GB)"
#   memory_string += f" | {metric}: {value}"      (mem-max-allocated-bytes, mem-max-reserved-bytes, ...)
#   print("[Rank {}] {}".format(torch.distributed.get_rank(), memory_string), flush=True)
_MEM_GB = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(GB\)((?: \| [A-Za-z0-9_-]+: [-+0-9.eE]+)*)")
_GB = 1e9 / 2**20   # MB (2**20 bytes, Megatron-LM's unit) per GB (1e9 bytes, Megatron-Bridge's)
# srun --label ("12: "), or a logger's "[time] " in front of the whole line
_PREFIX = re.compile(r"^(?:\s*\d+:\s?)")


def detect(text: str) -> bool:
    return bool(_ITER.search(text)) or "------------------------ arguments ------------------------" in text


def _value(text: str):
    """A printed argument value back into Python (``None``, ``True``, ``4``, ``['core_attn']``, ``'x'``)."""
    t = text.strip()
    try:
        return ast.literal_eval(t)
    except (ValueError, SyntaxError):
        return t   # enums and dtypes print as names (torch.bfloat16, AttnBackend.auto): keep the text


def parse(text: str, source: str) -> dict:
    """``{"args": {...}, "iterations": [(iteration, train_iters, ms, tflops, gbs)], "memory": [...]}``.

    Raises InputError naming ``source`` and the line when a line that starts one of the formats above
    cannot be read."""
    args: dict = {}
    iters: list[tuple] = []
    memory: list[tuple] = []
    in_args = False
    for n, raw in enumerate(text.splitlines(), 1):
        line = _PREFIX.sub("", raw, count=1).rstrip()
        if in_args:
            close = _ARGS_CLOSE.match(line)
            if close:
                in_args = False
                continue
            m = _ARG.match(line)
            if m:
                args[m.group(1)] = _value(m.group(2))
            continue   # anything else is another rank's output interleaved: the block goes on
        if _ARGS_OPEN.match(line) and _ARGS_OPEN.match(line).group(1) == ARGS_TITLE:
            in_args = True
            continue
        if " iteration " in line and "consumed samples:" in line:
            it = _ITER.search(line)
            el = _ELAPSED.search(line)
            if not it or not el:
                raise InputError(f"{source}:{n}: cannot read Megatron's iteration line (expected ' iteration N/ M | "
                                 f"consumed samples: ... | elapsed time per iteration (ms): ... |'): {line.strip()[:120]}")
            tp = _THROUGHPUT.search(line)
            gb = _GBS.search(line)
            iters.append((int(it.group(1)), int(it.group(2)), float(el.group(1)),
                          float(tp.group(1)) if tp else None, int(gb.group(1)) if gb else None, n))
            continue
        if "memory (GB)" in line and "[Rank " in line:
            m = _MEM_GB.search(line)
            if not m:
                raise InputError(f"{source}:{n}: cannot read Megatron-Bridge's memory report (expected '[Rank R] (after "
                                 f"N iterations) memory (GB) | name: value | ...'): {line.strip()[:120]}")
            vals = {k.strip(): float(v) for k, v in (kv.split(":", 1) for kv in m.group(3).split(" | ")[1:])}
            if "mem-max-allocated-bytes" in vals and "mem-max-reserved-bytes" in vals:
                memory.append((int(m.group(1)), int(m.group(2)), vals.get("mem-allocated-bytes", 0.0) * _GB,
                               vals["mem-max-allocated-bytes"] * _GB, vals.get("mem-reserved-bytes", 0.0) * _GB,
                               vals["mem-max-reserved-bytes"] * _GB, None))
            continue
        if "memory (MB)" in line and "[Rank " in line:
            m = _MEM.search(line)
            if not m:
                raise InputError(f"{source}:{n}: cannot read Megatron's memory report (expected '[Rank R] (after N "
                                 f"iterations) memory (MB) | allocated: ... | max reserved: ...'): {line.strip()[:120]}")
            memory.append((int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4)),
                           float(m.group(5)), float(m.group(6)), float(m.group(7)) if m.group(7) else None))
    return {"args": args, "iterations": iters, "memory": memory}


def _precision(a: dict) -> str:
    fp4, fp8 = a.get("fp4"), a.get("fp8")
    if fp4 not in (None, False, "None"):
        return "nvfp4"
    if fp8 not in (None, False, "None"):
        recipe = str(a.get("fp8_recipe") or "delayed").lower()
        return {"mxfp8": "mxfp8", "blockwise": "fp8-block"}.get(recipe, "fp8")
    return "bf16"


def _recompute(a: dict) -> str:
    gran = a.get("recompute_granularity")
    if gran == "full":
        return "full"
    if gran == "selective":
        mods = a.get("recompute_modules") or ["core_attn"]
        return "+".join(str(m) for m in (mods if isinstance(mods, (list, tuple)) else [mods]))
    return "none"


def _dispatcher(a: dict) -> str:
    kind = str(a.get("moe_token_dispatcher_type") or "").lower()
    if kind == "flex":
        return "flex-" + str(a.get("moe_flex_dispatcher_backend") or "deepep").lower()
    return kind if kind in ("alltoall", "allgather") else ""


def _int(a: dict, key: str, default: int | None = 1):
    v = a.get(key)
    return default if v in (None, "None", "") else int(v)


def row_fields(a: dict) -> dict:
    """The CSV fields (calibration.csv's schema) that Megatron's printed arguments give."""
    if not a:
        return {}
    out = {"tp": _int(a, "tensor_model_parallel_size"), "pp": _int(a, "pipeline_model_parallel_size"),
           "vpp": _int(a, "virtual_pipeline_model_parallel_size"), "cp": _int(a, "context_parallel_size"),
           "ep": _int(a, "expert_model_parallel_size"), "mbs": _int(a, "micro_batch_size"),
           "gbs": _int(a, "global_batch_size", None), "seq_len": _int(a, "seq_length", None),
           "num_gpus": _int(a, "world_size", None), "precision": _precision(a), "recompute": _recompute(a),
           "fsdp": 1 if (a.get("use_megatron_fsdp") is True or a.get("use_torch_fsdp2") is True) else 0}
    etp = _int(a, "expert_tensor_parallel_size", None)
    if etp is not None and a.get("num_experts") not in (None, "None"):
        out["etp"] = etp
    disp = _dispatcher(a) if a.get("num_experts") not in (None, "None") else ""
    if disp:
        out["dispatcher"] = disp
    impl = a.get("cuda_graph_impl")
    if impl is not None:
        out["cuda_graphs"] = "false" if str(impl).lower() == "none" else "true"
    if out["precision"] == "fp8":   # per-tensor FP8: --fp8-recipe delayed (megatron-core's default) or tensorwise
        out["fp8_recipe"] = str(a.get("fp8_recipe") or "delayed").lower()
    return out


def model_shape(a: dict) -> dict:
    """What identifies the model in the arguments (compared with the catalog)."""
    if not a.get("num_layers"):
        return {}
    return {"num_layers": _int(a, "num_layers"), "hidden_size": _int(a, "hidden_size"),
            "num_attention_heads": _int(a, "num_attention_heads"),
            "num_experts": _int(a, "num_experts", 0) or 0}


def run_fields(text: str, source: str) -> dict:
    """What a Megatron rank log says of its run (``planner.calibration.runs.Run`` fields): the median iteration time
    after the warm-up, its own TFLOP/s figure, the latest memory report of the worst rank."""
    p = parse(text, source)
    iters = p["iterations"]
    step_ms, used, skip = median_after_warmup([(it[0], it[2]) for it in iters], source, "iteration")
    tfl = [it[3] for it in iters if it[0] > skip and it[3] is not None]
    fields = row_fields(p["args"])
    gbs = [it[4] for it in iters if it[4] is not None]
    if gbs and "gbs" not in fields:
        fields["gbs"] = gbs[-1]
    run = dict(fields=fields, shape=model_shape(p["args"]), step_s=step_ms / 1000.0,
               logged_tflops_per_gpu=statistics.median(tfl) if tfl else None, iters_used=used, iters_skipped=skip)
    if p["memory"]:
        last = max(m[1] for m in p["memory"])
        final = [m for m in p["memory"] if m[1] == last]   # the latest report, one line per model-parallel rank
        run["peak_allocated_gib"] = max(m[3] for m in final) / 1024.0
        run["peak_reserved_gib"] = max(m[5] for m in final) / 1024.0
        dev = [m[6] for m in final if m[6] is not None]
        run["device_used_gib"] = max(dev) / 1024.0 if dev else None
    return run
