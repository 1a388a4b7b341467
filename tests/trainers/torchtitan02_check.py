"""Run torchtitan 0.2.0's own job-file parsing and model construction on an emitted job.toml.

Usage: ``python torchtitan02_check.py JOBS.json RESULTS.json`` with torchtitan 0.2.0 first on PYTHONPATH
(tests/trainers/mcore.py ``ensure_torchtitan02``). JOBS.json is a list of ``{"id", "dir"}``, ``dir``
holding the emitted ``job.toml`` and the flavour module it names. Per job, as torchtitan 0.2.0's
``Trainer.__init__`` (train.py) does it:

1. ``ConfigManager().parse_args(["--job.config_file", job.toml])``,
2. ``importlib.import_module(job_config.experimental.custom_import)`` (with ``dir`` on sys.path),
3. ``get_train_spec(model.name).model_args[model.flavor]`` and ``update_from_config(job_config)``,
4. ``train_spec.model_cls(model_args)`` on the meta device: its parameters, the MLP / expert widths of
   its modules, every RMSNorm's epsilon, and (llama3, qwen3) the RoPE frequencies torchtitan's own
   precompute function gives for these args (on CPU).

Shim: torchtitan.models.moe.kernels imports triton (absent on CPU machines); a stub stands in, as in
torchtitan_check.py.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
import types

_k = "torchtitan.models.moe.kernels"
sys.modules[_k] = types.ModuleType(_k)
sys.modules[_k].generate_permute_indices = None

import torch  # noqa: E402
from torch import nn  # noqa: E402


def _widths(model) -> dict:
    layer = next(iter(model.layers.values()))
    out = {"layers": len(model.layers), "dim": model.tok_embeddings.weight.shape[1],
           "vocab": model.tok_embeddings.weight.shape[0]}
    ffn = getattr(layer, "feed_forward", None)
    if ffn is not None:
        out["ffn"] = ffn.w1.weight.shape[0]
    last = list(model.layers.values())[-1]
    moe = getattr(last, "moe", None)
    if moe is not None:
        out["experts"], out["expert_ffn"], _ = moe.experts.w1.shape
        out["top_k"] = moe.router.top_k
        shared = getattr(moe, "shared_experts", None)
        out["shared_ffn"] = shared.w1.weight.shape[0] if shared is not None else 0
    return out


def _inv_freq(name: str, args) -> list[float] | None:
    """The angle each rotary pair turns per position, from torchtitan's own precompute function."""
    if name == "llama3":
        from torchtitan.models.llama3.model.model import precompute_freqs_cis
        cis = precompute_freqs_cis(args.dim // args.n_heads, 2, args.rope_theta, args.rope_scaling_args)
        return torch.angle(cis[1]).tolist()
    if name == "qwen3":
        from torchtitan.models.qwen3.model.model import precompute_rope_cache
        cache = precompute_rope_cache(args.head_dim, 2, args.rope_theta)   # [cos | sin], each [theta | theta]
        half = args.head_dim // 2
        return torch.atan2(cache[1, args.head_dim:args.head_dim + half], cache[1, :half]).tolist()
    return None


def check(job: dict) -> dict:
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    stage = "parse"
    try:
        cfg = ConfigManager().parse_args(["--job.config_file", f"{job['dir']}/job.toml"])
        stage = "custom_import"
        if cfg.experimental.custom_import:
            sys.path.insert(0, job["dir"])
            sys.modules.pop(cfg.experimental.custom_import, None)   # every job's own module of the same name
            importlib.import_module(cfg.experimental.custom_import)
            sys.path.remove(job["dir"])
        stage = "model_args"
        spec = get_train_spec(cfg.model.name)
        args = spec.model_args[cfg.model.flavor]
        args.update_from_config(cfg)
        stage = "model"
        with torch.device("meta"):
            model = spec.model_cls(args)
        eps = sorted({m.eps for m in model.modules() if isinstance(m, nn.RMSNorm)}, key=lambda e: (e is not None, e))
        return {"id": job["id"], "ok": True, "params": sum(p.numel() for p in model.parameters()),
                "eps": eps, "widths": _widths(model), "inv_freq": _inv_freq(cfg.model.name, args),
                "model": [cfg.model.name, cfg.model.flavor], "seq_len": args.max_seq_len}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"id": job["id"], "ok": False, "stage": stage, "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc()[-2000:]}


def main() -> None:
    import torchtitan
    jobs = json.loads(open(sys.argv[1]).read())
    results = [dict(check(j), torchtitan=torchtitan.__file__) for j in jobs]
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
