"""Write SYNTHESIZED Megatron-LM rank logs for published runs (rows of calibration.csv).

No GPU ran these files: each is built from one published measurement (its step time follows from the
row's tokens/s per GPU) with the format strings of megatron-core 0.19.2, so that the closed loop
(``examples/closed_loop.py``) can be walked on shipped data. Every file says so in its first line and
in its name (``*.synthesized.log``). The strings are the ones ``planner/trainers/megatron/logs.py`` quotes:
``_print_args`` (arguments.py), ``training_log`` (training.py), ``report_memory`` (utils/common_utils.py).

    python examples/logs/synthesize.py planner/data/profiles/calibration.csv ID [ID ...] --out examples/logs
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

HEADER = ("# SYNTHESIZED by examples/logs/synthesize.py from calibration.csv row {id} ({source}); no GPU ran it: "
          "the step time is the published tokens/s per GPU, the format is megatron-core 0.19.2's")
ITERS = 20


def _args(row: dict, model) -> dict:
    """The arguments a Megatron-LM run of this row prints (the subset topoplan reads, plus a few); an
    empty recompute or ETP is what ``planner.calibration.validate`` resolves for the row (the run printed one)."""
    from planner.cost.profiles import load_profile
    from planner.calibration.validate import resolve_case, row_case

    case = resolve_case(row_case(row))
    prec = row["precision"]
    rc = case.config.recompute
    disp = case.config.dispatcher or load_profile(row["stack"]).dispatcher
    a = {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads, "ffn_hidden_size": model.ffn_hidden_size,
        "num_experts": model.num_experts or None, "seq_length": int(row["seq_len"]),
        "tensor_model_parallel_size": int(row["tp"]), "pipeline_model_parallel_size": int(row["pp"]),
        "virtual_pipeline_model_parallel_size": (int(row["vpp"]) if int(row["vpp"] or 1) > 1 else None),
        "context_parallel_size": int(row["cp"] or 1), "expert_model_parallel_size": int(row["ep"] or 1),
        "expert_tensor_parallel_size": case.config.etp_eff,
        "micro_batch_size": int(row["mbs"]), "global_batch_size": int(row["gbs"]),
        "world_size": int(row["num_gpus"]), "bf16": True,
        "fp8": None if prec in ("bf16", "nvfp4") else "e4m3",
        "fp8_recipe": {"mxfp8": "mxfp8", "fp8-block": "blockwise"}.get(prec, "delayed"),
        "fp4": "e2m1" if prec == "nvfp4" else None, "fp4_recipe": "nvfp4",
        "recompute_granularity": None if rc == "none" else ("full" if rc == "full" else "selective"),
        "recompute_modules": ["core_attn"] if rc in ("none", "full") else rc.replace("+", " ").split(),
        "moe_token_dispatcher_type": "flex" if disp.startswith("flex") else disp,
        "moe_flex_dispatcher_backend": disp.split("-", 1)[1] if disp.startswith("flex") else "deepep",
        "cuda_graph_impl": "transformer_engine" if case.training.cuda_graphs else "none", "use_megatron_fsdp": bool(int(row.get("fsdp") or 0)),
        "use_distributed_optimizer": True, "log_interval": 1, "log_throughput": True, "train_iters": ITERS,
    }
    return a


def megatron_log(row: dict, seed: int = 0) -> str:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from planner.model.spec import load_model

    model = load_model(row["model"])
    a = _args(row, model)
    lines = [HEADER.format(**row)]
    # _print_args: title line, '  {} {} {}'.format(arg, '.' * (48 - len(arg)), value) sorted, end line
    lines.append("------------------------ arguments ------------------------")
    str_list = ["  {} {} {}".format(k, "." * (48 - len(k)), v) for k, v in a.items()]
    lines += sorted(str_list, key=lambda x: x.lower())
    lines.append("-------------------- end of arguments ---------------------")
    n, seq, gbs = int(row["num_gpus"]), int(row["seq_len"]), int(row["gbs"])
    step_ms = gbs * seq / float(row["tokens_per_s_per_gpu"]) / n * 1000.0
    tflops = float(row["model_tflops_per_gpu"])
    rng = random.Random(f"{row['id']}-{seed}")
    consumed = 0
    for it in range(1, ITERS + 1):
        slow = {1: 6.0, 2: 1.4}.get(it, 1.0)          # first iterations: graph capture, allocator growth
        t = step_ms * slow * (1.0 + rng.gauss(0.0, 0.01))
        consumed += gbs
        s = f" [2026-01-01 00:00:{it:02d}.000000]"
        s += " iteration {:8d}/{:8d} |".format(it, ITERS)
        s += " consumed samples: {:12d} |".format(consumed)
        s += " elapsed time per iteration (ms): {:.1f} |".format(t)
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops * step_ms / t:.1f} |"
        s += f" learning rate: {1e-4:.6E} |"
        s += f" global batch size: {gbs:5d} |"
        s += " lm loss: {:.6E} |".format(10.0 - 0.1 * it)
        s += f" loss scale: {1.0:.1f} |"
        s += f" grad norm: {1.5:.3f} |"
        s += " number of skipped iterations: {:3d} |".format(0)
        s += " number of nan iterations: {:3d} |".format(0)
        lines.append(s)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv", type=Path)
    ap.add_argument("ids", nargs="+")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = ap.parse_args()
    rows = {r["id"]: r for r in csv.DictReader(args.csv.open())}
    for rid in args.ids:
        path = args.out / f"{rid}.synthesized.log"
        path.write_text(megatron_log(rows[rid]))
        print(path)


if __name__ == "__main__":
    main()
