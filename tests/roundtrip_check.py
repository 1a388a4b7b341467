"""Emit, read back, predict: the check tests/test_roundtrip.py defines, shared with every plan the
test suite makes (tests/conftest.py wraps ``planner.search.plan.plan`` with ``checked_plan``).

``assert_round_trip(doc, index)`` renders a plan's launch files (Megatron args.txt, or TorchTitan's
command.txt and topoplan_config.py for a torchtitan plan), reads them back with
``planner.output.emit.readback`` (our own reader: no trainer installed), and checks that the layout,
the training setup with its recipe as the trainer runs it (``planner.rules.effective_recipe``), and the
predicted TFLOP/s per GPU (rel 1e-9) equal the plan's.
"""

from __future__ import annotations

import functools
import os

import pytest


def _key(c) -> tuple:
    return (c.tp, c.pp, c.vpp, c.cp, c.ep, c.etp_eff, c.mbs, c.fsdp, c.recompute, c.dispatcher, c.pp_first, c.pp_last)


def read_back(doc: dict, index: int = 0, args: list[str] | None = None):
    """(plan context, config and training read back from the emitted files, prediction from them)."""
    from planner.cost.placement import make_placement
    from planner.cost.predict import predict
    from planner.output.emit import load_context, render_files
    from planner.trainers.megatron.emit import megatron_args, parse_args_file, render_args
    from planner.trainers.megatron.readback import megatron_setup
    from planner.trainers.torchtitan.readback import torchtitan_setup
    from planner.trainers.torchtitan.emit import parse_command

    ctx = load_context(doc, index)
    if ctx.training.trainer == "torchtitan":
        files = render_files(ctx, ["torchtitan"])
        if args is None:
            args = parse_command(files["torchtitan/command.txt"])
        cfg, tr, order = torchtitan_setup(args, ctx.model, ctx.world,
                                          registry_text=files.get("torchtitan/topoplan_config.py"))
    else:
        if args is None:
            args = parse_args_file(render_args(megatron_args(ctx)))
        cfg, tr, order = megatron_setup(args, ctx.model, ctx.world)
    tr = tr.model_copy(update={"memory_headroom": ctx.training.memory_headroom}) \
        if hasattr(ctx.training, "memory_headroom") else tr
    gpd = doc["plans"][index]["placement"].get("gpus_per_domain")
    placement = make_placement(ctx.cluster, cfg, ctx.world, gpd, order=order)
    return ctx, cfg, tr, predict(ctx.model, ctx.cluster, cfg, tr, placement=placement)


def assert_round_trip(doc: dict, index: int = 0, args: list[str] | None = None) -> None:
    from planner.rules import effective_recipe, violations

    ctx, cfg, tr, pred = read_back(doc, index, args)
    want = ctx.config
    if not ctx.model.num_experts:   # a dense model has no dispatcher to write
        want = want.model_copy(update={"dispatcher": None})
        cfg = cfg.model_copy(update={"dispatcher": None})
    assert _key(cfg) == _key(want)
    assert tr.stack == ctx.training.stack
    assert (tr.seq_len, tr.global_batch, tr.precision) == (ctx.training.seq_len, ctx.training.global_batch,
                                                           ctx.training.precision)
    assert tr.recipe == effective_recipe(ctx.model, ctx.config, ctx.training)
    assert not violations(ctx.model, cfg, tr, ctx.world)
    want_tflops = doc["plans"][index]["prediction"]["tflops_per_gpu"]
    assert pred.tflops_per_gpu == pytest.approx(want_tflops, rel=1e-9)


def round_trip_result(result) -> int:
    """Every plan of a PlanResult (megatron and torchtitan plans; MaxText has no reader), checked."""
    if result.training.trainer not in ("megatron", "torchtitan") or not result.plans:
        return 0
    doc = result.to_dict()
    for i in range(len(doc["plans"])):
        assert_round_trip(doc, i)
    return len(doc["plans"])


def checked_plan(plan_fn):
    """``plan`` that also round-trips every plan it returns (TOPOPLAN_ROUNDTRIP=0 turns it off)."""
    @functools.wraps(plan_fn)
    def wrapper(*args, **kwargs):
        result = plan_fn(*args, **kwargs)
        if os.environ.get("TOPOPLAN_ROUNDTRIP", "1") != "0":
            round_trip_result(result)
        return result

    wrapper.round_trip = True
    return wrapper
