"""Run torchtitan 0.3.0's own config parsing and device-mesh construction on emitted command lines.

Usage: ``python torchtitan_check.py JOBS.json RESULTS.json``. JOBS.json is a list of
``{"id", "args": [...], "world": N, "sm": 90, "path": dir-or-null}`` (``path`` holds an emitted
``topoplan_config.py`` registry when the model needs one). Per job, in one process:

1. ``ConfigManager().parse_args(args)`` (tyro: unknown keys, Trainer.Config.__post_init__ rules such
   as local_batch_size % pipeline microbatch, CUDA graphs with PP/EP, the model registry),
2. ``ParallelDims.from_config(cfg.parallelism, world_size=N)`` (product of degrees == world),
3. ``build_mesh()`` on torch's fake process group (EP must divide dp_shard*cp*tp), recording every
   rank list DeviceMesh passes to ``new_group`` (all groups of every mesh dimension),
4. the global-batch rule of ``Trainer.__init__`` (re-implemented: it needs the full trainer):
   global_batch_size % (local_batch_size * dp_replicate * dp_shard) == 0.

Shims (trainers.md section 2.5): a stub for the one triton-importing module, and a fake GPU of the
job's compute capability for the float8 converters (``has_cuda_capability``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import traceback
import types

if importlib.util.find_spec("triton") is None:
    class _NoTriton(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)

            def _fail(*a, **k):
                raise RuntimeError("no triton on this machine")
            return _fail

    _k = "torchtitan.distributed.minimal_async_ep.kernels"
    sys.modules[_k] = _NoTriton(_k)

_SM = {"sm": 90}


def _fake_capability(major: int, minor: int) -> bool:
    return (_SM["sm"] // 10, _SM["sm"] % 10) >= (major, minor)


import torchtitan.tools.utils as _tu  # noqa: E402

_tu.has_cuda_capability = _fake_capability
for _name in ("float8", "mx", "nvfp4"):
    with contextlib.suppress(ImportError):
        _mod = importlib.import_module(f"torchtitan.components.quantization.{_name}")
        if hasattr(_mod, "has_cuda_capability"):
            _mod.has_cuda_capability = _fake_capability

import torch.distributed as dist  # noqa: E402
import torch.distributed.device_mesh as _dm  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402

_recorded: list[tuple[str, list[int]]] = []
_orig_new_group = _dm.new_group


def _recording_new_group(*a, ranks=None, group_desc=None, **k):
    if ranks is not None and group_desc and group_desc.startswith("mesh_"):
        _recorded.append((group_desc[5:], list(ranks)))
    return _orig_new_group(*a, ranks=ranks, group_desc=group_desc, **k)


_dm.new_group = _recording_new_group
AXES = {"tp": "tp", "cp": "cp", "pp": "pp", "ep": "ep", "dp_shard": "dp_shard", "dp_replicate": "dp_replicate",
        "efsdp": "efsdp", "batch": "batch"}


def low_precision(cfg) -> dict:
    """Counts of Linear / grouped-expert configs by the converter torchtitan applied (0.3.0 applies
    converters inside model_registry, so the precision lives only in cfg.model_spec)."""
    from torchtitan.components.quantization.float8 import Float8Linear, _float8_experts_cache
    from torchtitan.components.quantization.mx import MXFP8Linear, _mxfp8_experts_cache
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import GroupedExperts

    linear = {"bf16": 0, "float8": 0, "mxfp8": 0}
    recipes = set()
    for _fqn, lc, _p, _a in cfg.model_spec.traverse(Linear.Config):
        if isinstance(lc, Float8Linear.Config):
            linear["float8"] += 1
            gran = lc._torchao_config.cast_config_input.scaling_granularity.name
            recipes.add("tensorwise" if gran == "TENSORWISE" else "rowwise")
        elif isinstance(lc, MXFP8Linear.Config):
            linear["mxfp8"] += 1
        else:
            linear["bf16"] += 1
    experts = {"bf16": 0, "float8": 0, "mxfp8": 0}
    f8e = tuple(c.Config for c in _float8_experts_cache.values())
    mxe = tuple(c.Config for c in _mxfp8_experts_cache.values())
    for _fqn, ec, _p, _a in cfg.model_spec.traverse(GroupedExperts.Config):
        kind = "float8" if f8e and isinstance(ec, f8e) else ("mxfp8" if mxe and isinstance(ec, mxe) else "bf16")
        experts[kind] += 1
    return {"linear": linear, "float8_recipes": sorted(recipes), "experts": experts}


def model_facts(cfg) -> dict:
    """What the model config torchtitan builds says about the hyperparameters a config.json sets: every
    RMSNorm's epsilon, every RoPE's settings (models/common/rope.py RoPE.Config), every router's score
    function, scale and renormalisation."""
    from torchtitan.models.common import RMSNorm
    from torchtitan.models.common.rope import RoPE

    eps = sorted({n.eps for _f, n, _p, _a in cfg.model_spec.traverse(RMSNorm.Config)})
    ropes = []
    for _f, r, _p, _a in cfg.model_spec.traverse(RoPE.Config):
        d = {k: getattr(r, k) for k in ("theta", "scaling", "scaling_factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings", "rope_factor", "beta_fast", "beta_slow",
                                        "original_seq_len", "truncate", "dim", "max_seq_len")}
        if d not in ropes:
            ropes.append(d)
    routers = []
    try:
        from torchtitan.models.common.moe import TokenChoiceTopKRouter
    except ImportError:
        TokenChoiceTopKRouter = None
    if TokenChoiceTopKRouter is not None:
        for _f, r, _p, _a in cfg.model_spec.traverse(TokenChoiceTopKRouter.Config):
            d = {k: getattr(r, k, None) for k in ("score_func", "route_scale", "route_norm", "top_k")}
            if d not in routers:
                routers.append(d)
    return {"norm_eps": eps, "rope": ropes, "routers": routers}


def _meta_params(cfg) -> int | str:
    """Parameters of the model torchtitan builds from the config, on the meta device (no memory).
    VarlenAttention registers a FlashAttention kernel when built (no parameters; flash_attn is not
    installed here): that registration is skipped while the model is built."""
    import torch
    import torchtitan.models.common.attention as attn

    saved = attn.activate_flash_attention_impl
    attn.activate_flash_attention_impl = lambda *a, **k: None
    try:
        with torch.device("meta"):
            model = cfg.model_spec.model.build()
        return int(sum(p.numel() for p in model.parameters()))
    except Exception as exc:  # noqa: BLE001 - reported, the test decides
        return f"{type(exc).__name__}: {exc}"
    finally:
        attn.activate_flash_attention_impl = saved


def check(job: dict) -> dict:
    out = {"id": job["id"], "ok": False, "stage": "parse_args", "error": None}
    _SM["sm"] = int(job.get("sm", 90))
    if job.get("path"):   # each plan's own topoplan_config.py: first on the path, imported afresh
        if job["path"] in sys.path:
            sys.path.remove(job["path"])
        sys.path.insert(0, job["path"])
        sys.modules.pop("topoplan_config", None)
    try:
        cfg = ConfigManager().parse_args(list(job["args"]))
        out["compile"] = {"enable": cfg.compile.enable, "components": list(cfg.compile.components),
                          "async_tp": cfg.compile.enable_async_tensor_parallel}
        world = int(job["world"])
        out["stage"] = "ParallelDims"
        pd = ParallelDims.from_config(cfg.parallelism, world_size=world)
        out["stage"] = "build_mesh"
        _recorded.clear()
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        try:
            pd.build_mesh()
            sizes = {n: m.size() for n, m in pd.get_all_one_dimensional_meshes().items()}
        finally:
            dist.destroy_process_group()
        groups: dict[str, list[list[int]]] = {}
        for axis, ranks in _recorded:
            if axis in AXES:
                groups.setdefault(axis, [])
                if ranks not in groups[axis]:
                    groups[axis].append(ranks)
        for axis, n in (("tp", pd.tp), ("cp", pd.cp), ("pp", pd.pp), ("ep", pd.ep), ("dp_shard", pd.dp_shard)):
            if axis not in groups:  # degree 1: singletons; whole world: the default group (no new_group)
                groups[axis] = [[r] for r in range(world)] if n == 1 else (
                    [list(range(world))] if n == world else None)
        out["groups"] = groups
        out["sizes"] = sizes
        out["stage"] = "global_batch"
        t = cfg.training
        dp = pd.dp_replicate * pd.dp_shard
        if t.global_batch_size > 0 and t.global_batch_size % (t.local_batch_size * dp):
            raise ValueError(f"global batch size {t.global_batch_size} must be a multiple of local batch size "
                             f"{t.local_batch_size} times data-parallel degree {dp}")
        out["parallelism"] = {k: getattr(cfg.parallelism, k) for k in (
            "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
            "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
            "pipeline_parallel_microbatch_size")}
        out["training"] = {"local_batch_size": t.local_batch_size, "global_batch_size": t.global_batch_size,
                           "seq_len": t.seq_len}
        out["ac"] = type(cfg.activation_checkpoint).__qualname__
        out["precision"] = low_precision(cfg)
        out["cuda_graphs"] = not cfg.training.disable_cuda_graphs
        out["params"] = _meta_params(cfg)
        out["model"] = model_facts(cfg)
        out["stage"] = "done"
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - tyro exits with SystemExit(2)
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" [{os.path.basename(last.filename)}:{last.lineno}]" if last else ""
        out["error"] = f"{type(exc).__name__}: {exc}{where}"
    return out


def main() -> int:
    jobs_path, results_path = sys.argv[1], sys.argv[2]
    results = []
    for job in json.load(open(jobs_path)):
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            r = check(job)
        results.append(r)
        print(f"torchtitan check {job['id']}: {'OK' if r['ok'] else 'REJECTED at ' + r['stage']}"
              + ("" if r["ok"] else f": {r['error']}"), file=sys.stderr)
    with open(results_path, "w") as fh:
        json.dump(results, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
