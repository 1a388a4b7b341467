"""Run megatron-core 0.19.2's own argument checks and process-group construction on emitted configs.

Usage: ``python megatron_check.py JOBS.json RESULTS.json`` with megatron-core's wheel unpacked on
PYTHONPATH. JOBS.json is a list of ``{"id", "args": [...], "env": {...}, "sm": 90}``. For each job
this runs, in one process (imports cost ~10 s, each check well under a second):

1. ``parse_args()`` with ``sys.argv = ["pretrain_gpt.py", *args]`` and the job's environment,
2. ``validate_args(args)``,
3. ``core_transformer_config_from_args(args)`` (TransformerConfig.__post_init__: pipeline layout,
   MoE and precision rules),
4. ``parallel_state.initialize_model_parallel(...)`` on torch's fake process group, recording every
   rank list Megatron passes to ``create_group`` (all groups of every rank, not only rank 0's).
5. the first training step's schedule checks, on the same process groups (rank 0): megatron's own
   micro-batch calculator (``init_num_microbatches_calculator`` with the parsed GBS, MBS and DP:
   GBS % (MBS*DP) == 0, M >= 1), then the real ``schedules.get_forward_backward_func()`` called as
   ``train_step`` calls it, with M, the TransformerConfig of step 3 (microbatch group size N,
   overlap_p2p_comm) and one stand-in module per virtual stage. The interleaved schedule checks
   PP <= N <= M and M % N (schedules.py, forward_backward_pipelining_with_interleaving) before its
   first forward step; our forward_step_func raises a sentinel there, so reaching it means every
   step-start check passed. No layer runs: the stand-ins only carry the config.

Each result also carries ``flops_per_token``: megatron's own ``num_floating_point_operations(args, 1)``
(megatron/training/training.py, the figure behind its logged TFLOP/s) over the sequence length.

RESULTS.json holds ``{"fields": {"model": TransformerConfig fields, "ddp": DistributedDataParallelConfig
fields}, "results": [...]}`` with per job ``{"id", "ok", "stage", "error", "dp", "vpp",
"groups": {axis: [[ranks]]}, "config": {...}}``. Shims (trainers.md section 1.4): ``typing.override`` on Python 3.11, a stub for the
one triton-importing module, a fake GPU of the job's compute capability and a current
Transformer Engine version. For step 5: the schedule allocates one token counter with
``device="cuda"`` before its checks, so ``torch.zeros`` maps cuda to cpu, and p2p receive buffers and
``torch.cuda.synchronize`` point at the CPU (the fake group's p2p is a no-op).
"""

from __future__ import annotations

import importlib.util
import dataclasses
import json
import os
import sys
import traceback
import types
import typing

if sys.version_info < (3, 12) and not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override
if importlib.util.find_spec("triton") is None:
    _m = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
    _m.GLOBAL_BLOCK_SIZE = 1024

    def _no_triton(*a, **k):  # noqa: ARG001
        raise RuntimeError("no triton on this machine")

    _m.paged_stash_copy_kernel = _m.paged_stash_pop_kernel = _no_triton
    sys.modules[_m.__name__] = _m

import torch  # noqa: E402

_SM = {"sm": 90}
torch.cuda.get_device_capability = lambda *a, **k: (_SM["sm"] // 10, _SM["sm"] % 10)
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
    major=_SM["sm"] // 10, minor=_SM["sm"] % 10, name=f"fake sm_{_SM['sm']}", total_memory=80 * 2**30)

import megatron.core.utils as _mu  # noqa: E402
from packaging.version import Version  # noqa: E402

_mu._te_version = Version("2.12.0")

import megatron.core.models.common.embeddings.rope_utils as _rope  # noqa: E402

def _no_te(*a, **k):  # noqa: ARG001
    raise RuntimeError("no Transformer Engine on this machine")


if _rope.fused_apply_rotary_pos_emb is None:  # TE's fused RoPE, present on any GPU install with TE
    _rope.fused_apply_rotary_pos_emb = _no_te
    _rope.fused_apply_rotary_pos_emb_thd = _no_te

_orig_zeros = torch.zeros


def _zeros_on_cpu(*a, **k):  # schedules.py: total_num_tokens = torch.zeros([], ..., device="cuda")
    if str(k.get("device", "")).startswith("cuda"):
        k["device"] = "cpu"
    return _orig_zeros(*a, **k)


torch.zeros = _zeros_on_cpu
torch.cuda.current_device = lambda: "cpu"          # p2p receive buffers (no-ops on the fake group)
torch.cuda.synchronize = lambda *a, **k: None      # after batched p2p when overlap_p2p_comm is off

import megatron.core.transformer.moe.moe_utils as _moe_utils  # noqa: E402

for _name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
              "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
    if getattr(_moe_utils, _name, None) is None:  # TE's fused permutation (--moe-permute-fusion), on any TE >= 2.1
        setattr(_moe_utils, _name, _no_te)

import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.training.argument_utils import core_transformer_config_from_args  # noqa: E402
from megatron.training.arguments import parse_args, validate_args  # noqa: E402
from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding  # noqa: E402
from megatron.training.training import num_floating_point_operations  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

GROUPS = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP": "dp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp",
    "EXPERT_DATA_PARALLEL_GROUP": "edp",
}
CONFIG_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
    "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "mtp_num_layers", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "recompute_granularity", "recompute_modules",
    "recompute_method", "recompute_num_layers", "fp8", "fp8_recipe", "fp4", "fp4_recipe", "bf16",
    "moe_router_num_groups", "moe_router_group_topk", "qk_layernorm", "gated_linear_unit",
    "rotary_interleaved", "no_rope_freq", "qk_l2_norm", "moe_router_score_function", "moe_apply_probs_on_input",
    "moe_shared_expert_overlap", "rope_scaling", "rope_scaling_factor", "cpu_offloading", "cpu_offloading_num_layers",
    "cpu_offloading_activations", "cpu_offloading_weights", "fp8_param", "fp4_param",
    # the model as the config sets it (tests/test_emit_fidelity.py): norm, RoPE (MLA's own YaRN fields
    # and the yarn_* attributes argument_utils sets for other attention), router, activation
    "layernorm_epsilon", "normalization", "rope_type", "rotary_base", "rotary_percent", "rotary_scaling_factor",
    "mscale", "mscale_all_dim", "original_max_position_embeddings", "beta_fast", "beta_slow",
    "yarn_rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_mscale", "yarn_mscale_all_dim", "yarn_correction_range_round_to_int", "moe_router_enable_expert_bias",
    "moe_router_pre_softmax", "moe_router_topk_scaling_factor", "activation_func",
    # hybrid mixers (issue 23 hybrids): Gated DeltaNet, DeepSeek sparse attention, Mamba-2
    "experimental_attention_variant", "linear_attention_freq", "linear_key_head_dim", "linear_value_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_conv_kernel_dim", "attention_output_gate",
    "dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk", "is_hybrid_model", "mamba_state_dim",
    "mamba_head_dim", "mamba_num_groups", "mamba_num_heads", "moe_shared_expert_gate", "layernorm_zero_centered_gamma",
)

# argparse values the round-trip test compares with topoplan's own reader (planner.output.emit.readback)
OPTIMIZER_FIELDS = ("optimizer_cpu_offload", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d",
                    "use_precision_aware_optimizer", "use_distributed_optimizer", "pin_cpu_grads", "pin_cpu_params")
ARG_FIELDS = (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size", "global_batch_size",
    "seq_length", "recompute_granularity", "recompute_modules", "use_megatron_fsdp", "use_torch_fsdp2",
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "fp8", "fp8_recipe", "fp4", "fp4_recipe",
    "cuda_graph_impl", "cuda_graph_modules", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
    "tp_comm_overlap", "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion",
    "moe_router_enable_expert_bias", "use_tp_pp_dp_mapping", "virtual_pipeline_model_parallel_size",
    "rotary_percent", "rotary_base", "fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag", "fp4_param_gather",
    # what pretrain_gpt.py's model_provider hands GPTModel besides the TransformerConfig
    "position_embedding_type", "use_rope_scaling", "rope_scaling_factor", "rotary_seq_len_interpolation_factor",
    "untie_embeddings_and_output_weights", "vocab_size", "make_vocab_size_divisible_by",
    "hybrid_layer_pattern",   # pretrain_hybrid.py's HybridModel reads it from the args
)

_recorded: list[tuple[str, list[int]]] = []
_orig_create_group = ps.create_group


def _recording_create_group(ranks=None, *a, group_desc=None, **k):
    if ranks is not None and group_desc in GROUPS:
        _recorded.append((GROUPS[group_desc], list(ranks)))
    return _orig_create_group(ranks, *a, group_desc=group_desc, **k)


ps.create_group = _recording_create_group


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if callable(v) and hasattr(v, "__name__"):   # activation_func: F.silu -> "silu"
        return v.__name__
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


class _ReachedForward(Exception):
    """Raised by the forward step: the schedule passed every check it makes before computing."""


class _Chunk(torch.nn.Module):
    """Stands in for one model chunk (virtual stage): what the schedule reads before the forward step."""

    def __init__(self, config):
        super().__init__()
        from megatron.core.enums import ModelType

        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.lin = torch.nn.Linear(1, 1)

    def set_input_tensor(self, input_tensor):
        self.input_tensor = input_tensor


def _forward_step(data_iterator, model, *a, **k):  # noqa: ARG001
    raise _ReachedForward()


def schedule_check(args, cfg, out: dict) -> None:
    """Step 5: megatron's micro-batch calculator and pipeline schedule, as train_step runs them."""
    from megatron.core.num_microbatches_calculator import (destroy_num_microbatches_calculator,
                                                           get_num_microbatches, init_num_microbatches_calculator)
    from megatron.core.pipeline_parallel import schedules

    out["stage"] = "num_microbatches"
    destroy_num_microbatches_calculator()
    init_num_microbatches_calculator(rank=0, rampup_batch_size=None, global_batch_size=args.global_batch_size,
                                     micro_batch_size=args.micro_batch_size,
                                     data_parallel_size=args.data_parallel_size)
    try:
        m = get_num_microbatches()
    finally:
        destroy_num_microbatches_calculator()
    out["num_microbatches"] = m
    out["microbatch_group"] = cfg.microbatch_group_size_per_vp_stage
    out["stage"] = "pipeline schedule"
    if getattr(cfg, "overlap_moe_expert_parallel_comm", False):
        # the 1F1B all-to-all overlap schedule (combined_1f1b) opens CUDA streams before any check;
        # its micro-batch checks are the interleaved schedule's, so drive that one on a copy
        import copy

        cfg = copy.copy(cfg)
        cfg.overlap_moe_expert_parallel_comm = False
        cfg.delay_wgrad_compute = False
    chunks = [_Chunk(cfg) for _ in range(args.virtual_pipeline_model_parallel_size or 1)]
    func = schedules.get_forward_backward_func()
    out["schedule"] = func.__name__
    try:
        func(forward_step_func=_forward_step, data_iterator=[iter(())] * len(chunks),
             model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=m, seq_length=args.seq_length,
             micro_batch_size=args.micro_batch_size, forward_only=False)
    except _ReachedForward:
        return
    raise RuntimeError("the schedule returned without calling the forward step")


def check(job: dict) -> dict:
    out = {"id": job["id"], "ok": False, "stage": "parse_args", "error": None}
    env_keys = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "CUDA_DEVICE_MAX_CONNECTIONS")
    saved = {k: os.environ.get(k) for k in env_keys}
    for k in env_keys:
        os.environ.pop(k, None)
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0"})
    os.environ.update({k: str(v) for k, v in job.get("env", {}).items()})
    _SM["sm"] = int(job.get("sm", 90))
    sys.argv = ["pretrain_gpt.py", *job["args"]]
    try:
        args = parse_args()
        out["stage"] = "validate_args"
        validate_args(args)
        out["stage"] = "TransformerConfig"
        cfg = core_transformer_config_from_args(args)
        out["stage"] = "OptimizerConfig"   # as megatron/training/training.py:1962-1969 builds it from the args
        from megatron.core.optimizer import OptimizerConfig
        opt = OptimizerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(OptimizerConfig)
                                 if hasattr(args, f.name)})
        out["optimizer"] = {f: _jsonable(getattr(opt, f, None)) for f in OPTIMIZER_FIELDS}
        out["args"] = {f: _jsonable(getattr(args, f, None)) for f in ARG_FIELDS}
        out["config"] = {f: _jsonable(getattr(cfg, f, None)) for f in CONFIG_FIELDS}
        out["dp"] = args.data_parallel_size
        out["vpp"] = args.virtual_pipeline_model_parallel_size
        out["stage"] = "num_floating_point_operations"
        # the FLOPs megatron logs as throughput (training.py), per token of one sequence; the padded
        # vocabulary as its tokenizer setup pads it (build_tokenizer.py)
        args.padded_vocab_size = vocab_size_with_padding(args.vocab_size, args, logging_enabled=False)
        out["flops_per_token"] = num_floating_point_operations(args, 1) / args.seq_length
        out["stage"] = "initialize_model_parallel"
        _recorded.clear()
        dist.init_process_group("fake", rank=0, world_size=args.world_size, store=FakeStore())
        try:
            ps.initialize_model_parallel(
                tensor_model_parallel_size=args.tensor_model_parallel_size,
                pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
                context_parallel_size=args.context_parallel_size,
                expert_model_parallel_size=args.expert_model_parallel_size,
                expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                num_distributed_optimizer_instances=args.num_distributed_optimizer_instances,
                order="tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp",
                create_gloo_process_groups=False,
            )
            if job.get("schedule", True):
                schedule_check(args, cfg, out)
        finally:
            ps.destroy_model_parallel()
            dist.destroy_process_group()
        groups: dict[str, list[list[int]]] = {}
        for axis, ranks in _recorded:
            groups.setdefault(axis, [])
            if ranks not in groups[axis]:
                groups[axis].append(ranks)
        out["groups"] = groups
        out["stage"] = "done"
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - report any refusal (SystemExit from argparse too)
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" [{os.path.basename(last.filename)}:{last.lineno}]" if last else ""
        out["error"] = f"{type(exc).__name__}: {exc}{where}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def main() -> int:
    jobs_path, results_path = sys.argv[1], sys.argv[2]  # check() rewrites sys.argv
    jobs = json.load(open(jobs_path))
    results = []
    import contextlib

    for job in jobs:
        with contextlib.redirect_stdout(open(os.devnull, "w")):  # Megatron prints every argument
            r = check(job)
        results.append(r)
        print(f"megatron-core check {job['id']}: {'OK' if r['ok'] else 'REJECTED at ' + r['stage']}"
              + ("" if r["ok"] else f": {r['error']}"), file=sys.stderr)
    import dataclasses

    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    from megatron.core.optimizer import OptimizerConfig

    fields = {"model": sorted(f.name for f in dataclasses.fields(TransformerConfig)),
              "optimizer": sorted(f.name for f in dataclasses.fields(OptimizerConfig)),
              "ddp": sorted(f.name for f in dataclasses.fields(DistributedDataParallelConfig))}
    with open(results_path, "w") as fh:
        json.dump({"fields": fields, "results": results}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
