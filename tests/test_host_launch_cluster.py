"""A cluster's own host launch cost (``Cluster.host_launch_us``): the host floor of eager layers belongs to the
hosts' CPU (docs/cloud.md), so a cluster file that measured it prices it in place of the profile's per-generation
value, in predict and in the solver's program alike."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from planner.config import ParallelConfig, Training
from planner.cost.predict import predict
from planner.cost.profiles import load_profile
from planner.model.spec import load_model
from planner.search.plan import plan, program_for
from topologies.cluster import Cluster
from topologies.loader import load_cluster

Q30 = load_model("qwen3-30b-a3b")
# the awsome-distributed-ai p5 sweep's eager micro-batch-1 cell: host-bound (docs/cloud.md)
CFG = ParallelConfig(tp=8, pp=4, ep=16, etp=1, mbs=1, recompute="full", dispatcher="alltoall")
TR = Training(seq_len=4096, global_batch=256, precision="bf16", cuda_graphs=False)


def with_launch(cluster, us):
    return Cluster.model_validate({**cluster.model_dump(mode="json", exclude_none=True), "host_launch_us": us})


def test_cluster_figure_replaces_the_profiles():
    """Same step as the profile with host.launch_us (every generation's variant) set to the cluster's figure."""
    base = load_cluster("aws-p5", gpus=64)
    prof = load_profile(TR.stack)
    own = predict(Q30, with_launch(base, 60.0), CFG, TR)
    keys = [k for k in prof.params if k.split("@")[0] == "host.launch_us"]
    as_profile = predict(Q30, base, CFG, TR, profile=prof.with_values({k: 60.0 for k in keys}))
    assert own.step_time_s == pytest.approx(as_profile.step_time_s, rel=1e-12)
    shipped = predict(Q30, base, CFG, TR)
    assert own.breakdown["other"] > shipped.breakdown["other"]   # 60 us a call > Hopper's fitted 45
    # without the field nothing changes
    assert predict(Q30, with_launch(base, None), CFG, TR).step_time_s == shipped.step_time_s


def test_the_host_floor_grows_in_proportion_when_it_binds():
    """A host-bound layer: the exposed host time is calls x t_call - GPU work, so doubling t_call adds the
    host time once more (hand calculation from two predictions and the floor's linearity)."""
    base = load_cluster("aws-p5", gpus=64)
    o30, o60, o90 = (predict(Q30, with_launch(base, us), CFG, TR).breakdown["other"] for us in (30.0, 60.0, 90.0))
    assert o60 - o30 == pytest.approx(o90 - o60, rel=1e-6)
    assert o60 > o30


@pytest.mark.parametrize("bad", [0, -5, 5000])
def test_cluster_file_refuses_a_figure_out_of_range(bad):
    with pytest.raises(ValidationError, match="host_launch_us"):
        with_launch(load_cluster("aws-p5", gpus=16), bad)


def test_yaml_cluster_keeps_it_when_sized(tmp_path):
    c = load_cluster("aws-p5", gpus=16)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**c.model_dump(mode="json", exclude_none=True), "host_launch_us": 55.0}))
    assert load_cluster(str(path), gpus=16).host_launch_us == 55.0


def test_the_solver_prices_it_as_predict_does():
    """The solver's program reads the cluster's figure too: its step for each returned plan equals predict's
    (plan's program-vs-predict check), and those eager plans pay more host time than on the same hosts priced
    with the profile's Hopper value."""
    base = load_cluster("aws-p5", gpus=16)
    cluster = with_launch(base, 80.0)
    tr = Training(seq_len=4096, global_batch=64, precision="bf16", cuda_graphs=False)
    assert program_for(Q30, cluster, tr)[1].call_us == 80.0
    assert program_for(Q30, base, tr)[1].call_us == pytest.approx(load_profile(tr.stack).param("host.launch_us", "hopper"))
    res = plan(Q30, cluster, tr, top=2)
    assert res.plans
    for p in res.plans:
        assert p.program_step_s == pytest.approx(p.prediction.step_time_s, rel=1e-3)
        assert p.prediction.breakdown["other"] > predict(Q30, base, p.config, tr).breakdown["other"]
