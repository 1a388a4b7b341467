"""megatron-core 0.19.2's own memory arithmetic (``megatron/training/theoretical_memory_usage.py``) on
emitted Megatron arguments.

Usage: ``python megatron_memory.py JOBS.json RESULTS.json`` with megatron-core's wheel unpacked on
PYTHONPATH. JOBS.json is a list of ``{"id", "args": [...], "env": {...}, "sm": 90}`` (as for
megatron_check.py, whose CPU shims this imports). Per job, in one process: ``parse_args()`` and
``validate_args()`` on the arguments, the padded vocabulary from megatron's own tokenizer builder
(``build_tokenizer`` + ``_set_padded_vocab_size``, what ``pretrain_gpt.py`` does), the micro-batches per
step ``GBS / (MBS * DP)``, then:

- ``weights_optimizer``: ``compute_weight_and_optimizer_memory(args)`` (bytes),
- ``act_sp``: ``compute_activation_memory(args, M)`` (bytes; Korthikanti Table 2 with sequence
  parallelism and selective recompute),
- ``act_no_sp``: ``compute_activation_memory_without_sp(args, M)`` (bytes),
- ``report``: which of the two ``report_theoretical_memory`` prints (``sp`` when sequence parallel
  and selective recompute, else ``no_sp``),
- ``args``: the parsed values the comparison needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_check  # noqa: E402,F401  (CPU shims: typing.override, triton stub, fake GPU, TE version)
from megatron.training.arguments import parse_args, validate_args  # noqa: E402
from megatron.training.theoretical_memory_usage import (  # noqa: E402
    compute_activation_memory,
    compute_activation_memory_without_sp,
    compute_weight_and_optimizer_memory,
)

FIELDS = ("world_size", "data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
          "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
          "expert_tensor_parallel_size", "padded_vocab_size", "swiglu", "use_distributed_optimizer",
          "use_megatron_fsdp", "sequence_parallel", "recompute_granularity", "add_bias_linear", "qk_layernorm",
          "untie_embeddings_and_output_weights", "accumulate_allreduce_grads_in_fp32", "ffn_hidden_size",
          "num_layers", "hidden_size", "seq_length", "micro_batch_size", "global_batch_size", "fp8_param_gather",
          "fp4_param_gather")


def padded_vocab(args) -> int:
    from megatron.core.tokenizers.utils.build_tokenizer import _set_padded_vocab_size, build_tokenizer

    _set_padded_vocab_size(args, build_tokenizer(args))
    return args.padded_vocab_size


def run(job: dict) -> dict:
    env_keys = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "CUDA_DEVICE_MAX_CONNECTIONS")
    for k in env_keys:
        os.environ.pop(k, None)
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0"})
    os.environ.update({k: str(v) for k, v in job.get("env", {}).items()})
    megatron_check._SM["sm"] = int(job.get("sm", 90))
    sys.argv = ["pretrain_gpt.py", *job["args"]]
    args = parse_args()
    validate_args(args)
    padded_vocab(args)
    m = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    out = {"id": job["id"], "num_microbatches": m,
           "args": {f: megatron_check._jsonable(getattr(args, f, None)) for f in FIELDS}}
    out["weights_optimizer"] = compute_weight_and_optimizer_memory(args)
    out["act_sp"] = compute_activation_memory(args, m)
    out["act_no_sp"] = compute_activation_memory_without_sp(args, m)
    out["report"] = "sp" if args.sequence_parallel and args.recompute_granularity == "selective" else "no_sp"
    return out


def main() -> int:
    jobs_path, results_path = sys.argv[1], sys.argv[2]
    results = []
    for job in json.load(open(jobs_path)):
        with contextlib.redirect_stdout(open(os.devnull, "w")):  # Megatron prints every argument
            try:
                results.append(run(job))
            except BaseException as exc:  # noqa: BLE001 - a refusal is a result (SystemExit from argparse too)
                results.append({"id": job["id"], "error": f"{type(exc).__name__}: {exc}"})
    with open(results_path, "w") as fh:
        json.dump(results, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
