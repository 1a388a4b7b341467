"""The memos behind ``predict`` return what a fresh computation returns, and keep nothing alive.

Oracles: the uncached ``memory_per_gpu`` (what a fresh process computes) and the garbage collector.
"""

import gc
import weakref

import pytest
from hypothesis import given, settings, strategies as st

import planner
from planner import ParallelConfig, Training
from planner.cost.memory import memory_per_gpu
from planner.model.pipeline import pipeline_layout
from topologies.loader import load_cluster


@pytest.fixture(scope="module")
def model():
    return planner.load_model("llama3-70b")


@pytest.mark.parametrize("first, second", [("megatron", "torchtitan"), ("torchtitan", "megatron"),
                                           ("megatron", "maxtext")])
def test_memory_memo_tells_trainers_apart(model, first, second):
    """The same layout, priced for one trainer and then another, gets the second trainer's memory:
    TorchTitan and MaxText keep FP32 gradients, Megatron's recipes BF16 (``options_for``)."""
    cluster = load_cluster("dgx-h100", gpus=64)
    cfg = ParallelConfig(tp=4, pp=4)
    runs = {}
    for trainer in (first, second):
        training = Training(seq_len=4096, global_batch=256, precision="bf16", trainer=trainer)
        runs[trainer] = (planner.predict(model, cluster, cfg, training), training)
    for trainer, (pred, training) in runs.items():
        layout = pipeline_layout(model, cfg.pp, cfg.vpp, seq_len=training.seq_len)
        fresh = memory_per_gpu(model, pred.config, training, pred.world, cluster.gpu_spec, layout=layout)
        assert pred.memory_gib_per_gpu == pytest.approx(fresh.peak_gib, rel=1e-12), trainer
    # the trainers really differ here, or the test would prove nothing
    assert runs[first][0].memory_gib_per_gpu != pytest.approx(runs[second][0].memory_gib_per_gpu, rel=1e-3)


def test_memos_keep_no_cluster_alive(model):
    """A cluster that was priced and then dropped is collected: no memo holds it (a memo keyed by
    ``id()`` has to hold its object, or a recycled id would find another object's entry)."""
    cluster = load_cluster("dgx-h100", gpus=64)
    training = Training(seq_len=4096, global_batch=256, precision="bf16")
    planner.predict(model, cluster, ParallelConfig(tp=8, pp=2), training)
    ref = weakref.ref(cluster)
    del cluster
    gc.collect()
    assert ref() is None


def test_memos_follow_the_object_not_its_id(model):
    """Two clusters priced one after the other, the first collected before the second is built (so the
    second may reuse the first's id), each get their own group shapes."""
    from planner.cost.placement import group_shapes, make_placement

    cfg = ParallelConfig(tp=8, pp=2)
    seen = {}
    for name in ("dgx-h100", "gb200-nvl72", "dgx-h100", "gb200-nvl72"):
        cluster = load_cluster(name, gpus=64)
        pl = make_placement(cluster, cfg, 64)
        shapes = group_shapes(cluster, cfg, pl)
        seen.setdefault(name, shapes)
        assert shapes == seen[name], name
        del cluster, pl
        gc.collect()
    assert seen["dgx-h100"] != seen["gb200-nvl72"]


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 8, True]), pp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2]),
       etp=st.sampled_from([None, 1]), fsdp=st.sampled_from([False, 0, True]),
       recompute=st.sampled_from(["none", "selective", "moe_act,mla_up_proj", "full", "bogus"]),
       dispatcher=st.sampled_from([None, "alltoall", "flex-deepep", "nccl"]))
def test_parallel_config_memo_returns_what_validation_returns(tp, pp, vpp, etp, fsdp, recompute, dispatcher):
    """``planner.config.parallel_config`` (the search's memo) against a fresh ``ParallelConfig`` of the same
    values: the same fields and the same refusal."""
    from pydantic import ValidationError

    from planner.config import parallel_config

    args = (tp, pp, vpp, 1, 1, etp, None, 1, fsdp, recompute, dispatcher, None, None)
    kw = dict(zip(("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "fsdp", "recompute", "dispatcher",
                   "pp_first", "pp_last"), args))
    try:
        fresh = ParallelConfig(**kw)
    except ValidationError as exc:
        with pytest.raises(ValidationError) as got:
            parallel_config(*args)
        assert [(e["loc"], e["msg"]) for e in got.value.errors()] == [(e["loc"], e["msg"]) for e in exc.errors()]
        return
    memo = parallel_config(*args)
    assert memo == fresh and memo.model_dump() == fresh.model_dump()
    assert parallel_config(*args) is memo     # one validated instance per distinct set of values
