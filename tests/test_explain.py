"""The explanations printed with a plan: why-not lines that say something, labels that tell plans
apart, the cluster's rack names, the idle-GPU note, EP group colours, the fewest GPUs that fit."""

from __future__ import annotations

import copy
import itertools
import math
import re

import pytest
from test_report import plan_doc

from planner.output import explain


def test_why_not_gives_a_decimal_where_whole_percents_read_the_same():
    doc = plan_doc()
    alt = copy.deepcopy(doc["plans"][0])
    best = doc["plans"][0]
    # "other" grows from 0.6% to 1.35% of the step: "1% of the step vs 1%" says nothing
    for e, share in ((best, 0.006), (alt, 0.0135)):
        bd = e["prediction"]["breakdown"]
        rest = sum(v for k, v in bd.items() if k != "other")
        bd["other"] = share * rest / (1 - share)        # other / step == share, the step the sum of terms
        e["prediction"]["step_time_s"] = rest + bd["other"]
    alt["prediction"]["tokens_per_s_per_gpu"] *= 0.99
    line = explain.why_not(best, alt, "racks")
    assert "1% slower" in line and "per-layer launch overhead" in line
    shares = re.search(r"\((\S+) of the step vs (\S+)\)", line).groups()
    assert shares[0] != shares[1]
    assert shares == ("1.4%", "0.6%")


def test_pct_pair_adds_digits_until_the_shares_differ():
    assert explain._pct_pair(0.11, 0.06) == "11% of the step vs 6%"
    assert explain._pct_pair(0.0149, 0.0101) == "1.5% of the step vs 1.0%"
    assert explain._pct_pair(0.01001, 0.01004) == "1.001% of the step vs 1.004%"


def test_labels_show_the_pipeline_split_when_it_is_all_that_differs():
    doc = plan_doc()
    a = copy.deepcopy(doc["plans"][0])
    b = copy.deepcopy(a)
    b["config"]["pp_first"], b["config"]["pp_last"] = 30, 31
    la, lb = explain.plan_labels([a, b])
    assert la != lb
    assert lb.endswith("(first/last stage 30/31 layers)") and la.endswith("(even PP split)")


def test_placement_map_uses_the_cluster_domain_names_and_fits_the_width():
    doc = plan_doc()
    names = explain.domain_names_of(doc)
    assert len(names) == 4 and names[0] != "0"
    text = explain.placement_map(doc["plans"][0], [72] * 4, names=names, line_width=80).plain
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    from topologies.hostlist import expand

    first = lines[0].split(":")[0].split(" ", 1)[1]   # "racks gb300-r[01-02]: 64/72 GPUs"
    assert expand(first) == names[:2]
    assert lines[1] == "0" * 64 + "." * 8
    wide = explain.placement_map(doc["plans"][0], [72] * 4, names=names, line_width=200).plain
    assert wide.splitlines()[0].split()[2] == "0" * 64 + "." * 8   # label and row on one line


def test_idle_note_counts_the_idle_gpus():
    doc = plan_doc()
    doc["plans"][0]["config"].update(tp=1, pp=3, vpp=1, ep=8, dp=64, mbs=1, gbs=8192, world=192)
    note = explain.idle_note(doc, 252, "because")
    assert note == "note: 60 of 252 GPUs idle (24% of the cluster); the plan runs on 192: because"
    assert explain.idle_note(doc, 192) == ""


@pytest.mark.slow   # plans Qwen3-235B on 252 GPUs twice (~30 s under load); CI's full run
def test_plan_says_why_gpus_are_idle_and_which_batch_uses_them(capsys, monkeypatch, tmp_path):
    """One failed tray of a GB200 rack: Qwen3-235B with GBS 8192 runs on 192 of 252 GPUs (DP must divide
    8192). The note names a batch that uses more GPUs; planning that batch independently gives the
    GPU count and the gain the note claims."""
    import yaml

    import planner
    import topologies
    from planner.cli import main
    from topologies.cluster import cluster_from_dict

    healthy = topologies.load_cluster("gb200-nvl72", gpus=256)
    data = healthy.model_dump(exclude_none=True, mode="json")
    data.setdefault("health", {}).setdefault("failed_trays", []).append(healthy.nodes[4].name)
    path = tmp_path / "failed.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["plan", "--model", "qwen3-235b-a22b", "--cluster", str(path), "--precision", "mxfp8", "--gbs", "8192",
            "--top", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    note = " ".join(out[out.index("note: "):].split())
    m = re.search(r"(\d+) of 252 GPUs idle .*the plan runs on (\d+): no data-parallel degree of (.+?) above "
                  r"DP(\d+) divides the global batch 8192 \(with MBS(\d+)\) and meets the rules on these GPUs; "
                  r"with --gbs (\d+) the best plan \((.+?)\) uses (\d+) GPUs for \+([\d.]+)% tokens/s", note)
    assert m, note
    idle, world, shape, dp, mbs, gbs, label, used, gain = m.groups()
    assert int(idle) + int(world) == 252
    # hand check: 8192 = 2**13, so with TP*CP*PP = 3 no DP between 65 and 252 // 3 = 84 divides it
    mp = int(world) // int(dp)
    assert 8192 % (int(dp) * int(mbs)) == 0
    assert all(8192 % (d * int(mbs)) for d in range(int(dp) + 1, 252 // mp + 1))
    training = planner.Training(seq_len=4096, global_batch=8192, precision="mxfp8", stack="megatron-26.08")
    cluster = cluster_from_dict(data, "failed tray")
    model = planner.load_model("qwen3-235b-a22b")
    before = planner.plan(model, cluster, training, top=1).plans[0]
    after = planner.plan(model, cluster, training.model_copy(update={"global_batch": int(gbs)}), top=1).plans[0]
    assert before.world == int(world) and after.world == int(used) > before.world and after.label == label
    assert after.prediction.tokens_per_s / before.prediction.tokens_per_s - 1 == pytest.approx(float(gain) / 100,
                                                                                               abs=6e-4)


def test_group_colours_do_not_repeat_beyond_twenty_groups():
    from matplotlib.colors import to_rgb

    from planner.output.report.figures import group_colors

    for n in (10, 20, 21, 64, 256):
        cols = [to_rgb(c) for c in group_colors(n)]
        assert len(cols) == n
        # no two the same; far apart up to 64 groups (beyond that the figure writes group numbers)
        assert min(math.dist(a, b) for a, b in itertools.combinations(cols, 2)) > (0.02 if n <= 64 else 0.0)
    c = group_colors(64)
    assert c[0] != c[20] and c[1] != c[21]


def test_smallest_fitting_bisects_to_the_first_count_that_fits():
    from planner.cli.plan import smallest_fitting
    from planner.errors import InfeasibleError

    class Res:
        def __init__(self, n):
            self.plans = [type("E", (), {"label": f"layout on {n}"})()]

    calls = []

    def plan_at(n, need=96):
        calls.append(n)
        if n < need:
            raise InfeasibleError("no layout fits")
        return Res(n)

    assert smallest_fitting(plan_at, 8, 8) == (96, "layout on 96", 8)
    assert all(n % 8 == 0 for n in calls)
    # brute force over other thresholds and steps
    for need in (9, 16, 72, 100, 1000):
        for step in (4, 8, 72):
            if step >= need:   # it is called when the GPUs offered (here: step) do not fit
                continue
            got = smallest_fitting(lambda n: plan_at(n, need), step, step)
            first = next(n for n in itertools.count(step, step) if n >= need)
            assert got[0] == first, (need, step, got)
    assert smallest_fitting(lambda n: plan_at(n, 10**9), 8, 8, cap=4096) is None


def test_nothing_fits_names_a_gpu_count_that_fits(capsys, tmp_path, monkeypatch):
    """Also tests/test_errors_corpus.py's checks of this refusal (its case runs in CI's full run only):
    one ``error:`` line naming the memory shortfall, exit 3, no traceback, nothing written."""
    from planner.cli import main
    from planner.config import Training
    from planner.model.spec import load_model
    from planner.search.plan import plan
    from topologies.loader import load_job

    monkeypatch.chdir(tmp_path)
    rc = main(["plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8", "--gbs", "64"])
    out, err = capsys.readouterr()
    assert rc == 3 and out == "" and not any(tmp_path.iterdir())
    assert err.startswith("error: ") and "Traceback" not in err and "internal error" not in err
    assert "memory" in err.lower() and "GiB" in err and "fit" in err
    m = re.search(r"(\d+) GPUs fit \((.+?)\), (\d+) do not", err)
    assert m, err
    n, lab, below = int(m.group(1)), m.group(2), int(m.group(3))
    assert err.count("\n") == 1 and below < n
    # recompute, FSDP and micro-batch 1 were all in the searched space: more GPUs is the only remedy
    assert "Use more GPUs (--gpus): " in err and "recompute" not in err.split("Use ")[1].split(":")[0]
    assert "on 8 H100 GPUs" in err
    tr = Training(seq_len=4096, global_batch=64, precision="bf16", stack="megatron-26.08")
    model = load_model("llama3.1-405b")
    assert plan(model, load_job("dgx-h100", gpus=n), tr, top=1).plans[0].label == lab
    with pytest.raises(Exception, match="no layout fits|memory lower bound"):
        plan(model, load_job("dgx-h100", gpus=below), tr, top=1)
