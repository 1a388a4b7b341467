"""``ParallelConfig.on(world)``: the layout as one validated value that knows its derived degrees, and
the places that derive dp / edp agree with it."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config import Layout, ParallelConfig

DEG = st.sampled_from([1, 2, 3, 4, 8])


@given(tp=DEG, cp=DEG, pp=DEG, ep=DEG, etp=st.one_of(st.none(), DEG), world=st.integers(1, 512),
       fix_dp=st.booleans())
@settings(max_examples=300, deadline=None)
def test_layout_exists_exactly_when_both_grids_fill_the_world(tp, cp, pp, ep, etp, world, fix_dp):
    dp = world // (tp * cp * pp) if fix_dp and world >= tp * cp * pp else None
    cfg = ParallelConfig(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, dp=dp)
    e = tp if etp is None else etp
    fills = world % (tp * cp * pp) == 0 and world % (e * ep * pp) == 0
    if not fills:
        with pytest.raises(ValueError, match="not divisible"):
            cfg.on(world)
        return
    lay = cfg.on(world)
    # the attention grid and the expert grid each cover every rank exactly once
    assert lay.dp * tp * cp * pp == world
    assert lay.edp * e * ep * pp == world
    assert lay.dense_replicas == lay.dp * cp


def test_layout_refuses_a_dp_that_disagrees_with_the_world():
    with pytest.raises(ValueError, match="needs 32 GPUs but the world has 64"):
        ParallelConfig(tp=8, dp=4).on(64)
    assert isinstance(ParallelConfig(tp=8, dp=8).on(64), Layout)


def test_the_step_time_model_uses_the_layouts_degrees():
    import planner
    from planner import Training
    from topologies.loader import load_cluster

    model = planner.load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100", gpus=32)
    cfg = ParallelConfig(tp=2, pp=2, cp=2, ep=8, etp=1)
    p = planner.predict(model, cluster, cfg, Training(seq_len=8192, global_batch=64))
    lay = p.config.on(p.world)
    assert (p.details["dp"], p.details["edp"]) == (lay.dp, lay.edp) == (4, 2)


def test_emit_refuses_an_expert_grid_that_does_not_fill_the_ranks():
    from planner.config import Training
    from planner.errors import InputError
    from planner.output.emit import load_context
    from trainers.plans import hgx_cluster, plan_doc

    doc = plan_doc("qwen3-30b-a3b", hgx_cluster("h100", 2), ParallelConfig(tp=2, ep=8, etp=1),
                   Training(seq_len=4096, global_batch=64))
    doc["plans"][0]["config"]["ep"] = 3        # 16 ranks: etp*ep*pp = 3 does not divide them
    with pytest.raises(InputError, match=r"plans\[0\]: 16 GPUs are not divisible by etp\*ep\*pp = 3"):
        load_context(doc)
