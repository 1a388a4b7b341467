"""The Slurm launch files run as a cluster would run them: bash parses them (and shellcheck when
installed), the hostlists expand (topologies.hostlist) back to the plan's hosts, sbatch.sh and task.sh
are executed with stub ``srun`` / ``python`` / ``torchrun`` / ``scontrol`` programs on PATH that record
what they were started with, so the tests see which trainer and arguments a job would launch, that a
FILL_ME placeholder stops it (exit 2, nothing launched) and which NCCL settings reach the tasks."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.config import ParallelConfig, Training
from planner.cost.placement import rank_groups
from planner.errors import InputError
from planner.output.emit import emit_plan, load_context
from planner.output.emit import slurm
from planner.trainers.maxtext import emit as maxtext
from planner.trainers.megatron import emit as megatron
from planner.trainers.torchtitan import emit as torchtitan
from topologies.cluster import Cluster, cluster_from_dict
from topologies.hostlist import expand
from topologies.presets import PRESETS, build_preset, is_preset_host
from trainers.plans import hgx_cluster, plan_doc

DSV3_GB300 = dict(model_name="deepseek-v3", cluster=lambda: build_preset("gb300-nvl72", 256, usable_per_domain=64),
                  config=ParallelConfig(tp=1, pp=2, vpp=8, ep=32, mbs=1, recompute="mla_up_proj+moe_act",
                                        dispatcher="flex-hybridep"),
                  training=Training(seq_len=4096, global_batch=4096, precision="mxfp8"), world=256)
LLAMA70_H100 = dict(model_name="llama3-70b", cluster=lambda: build_preset("dgx-h100", 64),
                    config=ParallelConfig(tp=8, pp=2, mbs=1, recompute="none"),
                    training=Training(seq_len=8192, global_batch=64, precision="bf16"), world=64)
# a plan every trainer can run: Llama 3 8B, TP2 on two HGX H100 hosts
LLAMA8 = dict(model_name="llama3-8b", cluster=lambda: hgx_cluster("h100", 2),
              config=ParallelConfig(tp=2, pp=1, mbs=1, recompute="none"),
              training=Training(seq_len=4096, global_batch=64, precision="bf16"), world=16)


def _doc(spec, cluster=None):
    return plan_doc(spec["model_name"], cluster or spec["cluster"](), spec["config"], spec["training"],
                    world=spec["world"])


def _rank_hosts(doc) -> list[str]:
    """Host of every global rank, straight from the cluster and rank_to_gpu (not from the emitter)."""
    gpus = Cluster.model_validate(doc["cluster"]).gpus()
    return [gpus[g].node for g in doc["plans"][0]["placement"]["rank_to_gpu"]]


def _emit(tmp_path, doc, trainers, name="o") -> Path:
    out = tmp_path / name
    emit_plan(doc, trainers, out)
    return out


STUB = r"""#!/bin/bash
# records how it was started: argv (NUL-separated) and the environment
{ printf '%s\0' "$(basename "$0")" "$@"; } > "$STUB_DIR/$(basename "$0").argv"
env -0 > "$STUB_DIR/$(basename "$0").env"
"""


@pytest.fixture()
def stubs(tmp_path):
    """A directory of stub programs (srun, python, torchrun) that record their argv and environment."""
    d = tmp_path / "stubs"
    d.mkdir()
    for prog in ("srun", "python", "torchrun"):
        (d / prog).write_text(STUB)
        (d / prog).chmod(0o755)
    return d


def _run(script: Path, stubs: Path, env: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_DIR": str(stubs), "HOME": str(stubs)}
    return subprocess.run(["bash", str(script)], env={**base, **env}, cwd=cwd, capture_output=True, text=True)


def _called(stubs: Path, prog: str) -> tuple[list[str], dict[str, str]] | None:
    argv = stubs / f"{prog}.argv"
    if not argv.exists():
        return None
    args = argv.read_text().split("\0")[:-1]
    env = dict(item.split("=", 1) for item in (stubs / f"{prog}.env").read_text().split("\0") if "=" in item)
    return args[1:], env


def _placeholders(sbatch: str) -> list[str]:
    """The variables sbatch.sh asks the user to fill in (``: "${VAR:=FILL_ME_...}"``)."""
    return re.findall(r'^: "\$\{(\w+):=FILL_ME_\w+\}"$', sbatch, flags=re.M)


def _filled(out: Path) -> dict[str, str]:
    """Values for every placeholder variable of out/slurm/sbatch.sh, and the #SBATCH lines filled in."""
    sb = out / "slurm" / "sbatch.sh"
    text = sb.read_text()
    text = (text.replace("FILL_ME_partition", "gpu").replace("FILL_ME_account", "proj")
            .replace("FILL_ME_time", "04:00:00"))
    sb.write_text(text)
    return {v: ("none" if v.startswith("TOPOPLAN_CONTAINER") or v == "TOPOPLAN_ENV_ACTIVATE" else
                "mock" if v == "TOPOPLAN_DATA_ARGS" else f"/opt/{v.lower()}") for v in _placeholders(text)}


# --- syntax ------------------------------------------------------------------------------------

CASES = {"gb300-dsv3": (DSV3_GB300, ["megatron", "torchtitan", "slurm"]),
         "h100-llama70b": (LLAMA70_H100, ["megatron", "slurm"]),
         "h100-llama8b-all": (LLAMA8, ["megatron", "bridge", "torchtitan", "maxtext", "slurm"]),
         "slurm-only": (LLAMA8, ["slurm"])}


@pytest.mark.parametrize("case", list(CASES))
def test_scripts_parse_in_bash_and_pass_shellcheck(tmp_path, case):
    spec, trainers = CASES[case]
    out = _emit(tmp_path, _doc(spec), trainers)
    scripts = [str(out / "slurm" / "sbatch.sh"), str(out / "slurm" / "task.sh")]
    for s in scripts:
        subprocess.run(["bash", "-n", s], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck); bash -n passed")
    p = subprocess.run(["shellcheck", "-s", "bash", *scripts], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


# --- hostlists ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [DSV3_GB300, LLAMA70_H100], ids=["gb300", "h100"])
def test_nodelist_and_rank_order_expand_to_the_plans_hosts(tmp_path, spec):
    doc = _doc(spec)
    out = _emit(tmp_path, doc, ["megatron", "slurm"])
    sb = (out / "slurm" / "sbatch.sh").read_text()
    ranks = _rank_hosts(doc)
    in_order = list(dict.fromkeys(ranks))
    nodelist = re.search(r"^##SBATCH --nodelist=(\S+)$", sb, flags=re.M).group(1)
    assert expand(nodelist) == in_order
    assert len(nodelist) < len(",".join(in_order)) / 4          # compressed, not a list of names
    order_line = sb.splitlines()[sb.splitlines().index(next(x for x in sb.splitlines() if "hosts in rank order" in x)) + 1]
    assert expand(order_line.removeprefix("#").strip()) == in_order
    per = int(re.search(r"\((\d+) consecutive ranks each\)", sb).group(1))
    assert [h for h in in_order for _ in range(per)] == ranks     # whole hosts of consecutive ranks
    assert (out / "slurm" / "hostfile").read_text().split() == ranks
    assert f"#SBATCH --nodes={len(in_order)}" in sb and f"#SBATCH --ntasks={len(ranks)}" in sb


def test_preset_hosts_are_flagged_and_real_hosts_are_not(tmp_path):
    out = _emit(tmp_path, _doc(LLAMA70_H100), ["megatron", "slurm"])
    assert "PLACEHOLDER HOST NAMES: h100-n0001" in (out / "slurm" / "sbatch.sh").read_text()
    real = cluster_from_dict({"name": "site", "gpu": "h100", "nodes": [{"name": "dgx[001-008]", "gpus": 8}]})
    out2 = _emit(tmp_path, _doc(LLAMA70_H100, real), ["megatron", "slurm"], "real")
    sb = (out2 / "slurm" / "sbatch.sh").read_text()
    assert "PLACEHOLDER" not in sb and "#SBATCH --nodelist=dgx[001-008]" in sb


def test_is_preset_host_matches_every_preset_name_only():
    for name, preset in PRESETS.items():
        c = build_preset(name, 144 if preset.nvl72 else 16)
        assert all(is_preset_host(h) for h in c.hosts()), name
    for h in ("dgx001", "gpu-a17", "node-r01-t01", "h100-n01", "gb300-r1-t1", "h100-n0001x"):
        assert not is_preset_host(h)


SCONTROL = r"""#!/bin/bash
# scontrol stub: 'show hostnames EXPR' expands with topoplan's own hostlist code; 'show topology' prints $STUB_TOPOLOGY
case "$1 $2" in
  "show hostnames") PYTHONPATH="$STUB_ROOT" "$STUB_PY" -c 'import sys; from topologies.hostlist import expand; print("\n".join(expand(sys.argv[1])))' "$3" ;;
  "show topology") if [ -n "${STUB_TOPOLOGY:-}" ]; then cat "$STUB_TOPOLOGY"; fi ;;
esac
"""


def _scontrol(stubs: Path) -> dict[str, str]:
    (stubs / "scontrol").write_text(SCONTROL)
    (stubs / "scontrol").chmod(0o755)
    return {"STUB_ROOT": str(Path(__file__).resolve().parents[1]), "STUB_PY": sys.executable}


def test_any_allocation_of_the_shape_is_placed_at_job_start(tmp_path, stubs):
    """The job no longer needs the plan's hosts: other hosts of the same shape are placed (slurm/place.py,
    python3 without topoplan) and srun gets their hostfile; too few hosts exit 3 before srun."""
    out = _emit(tmp_path, _doc(LLAMA70_H100), ["megatron", "slurm"])
    env = {**_filled(out), **_scontrol(stubs)}
    sb = (out / "slurm" / "sbatch.sh").read_text()
    assert not re.search(r"^#SBATCH --nodelist", sb, flags=re.M)
    for nodelist, rc in (("gpu[07-14]", 0), ("gpu[07-13]", 3)):
        (stubs / "srun.argv").unlink(missing_ok=True)
        p = _run(out / "slurm" / "sbatch.sh", stubs, {**env, "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_ID": "42"},
                 cwd=out)
        assert p.returncode == rc, p.stderr
        assert (_called(stubs, "srun") is None) == (rc == 3)
        if rc:
            assert "error: the allocation grants 7 hosts but the plan needs 8 (each its own NVLink domain, holding a TP8 group set)" in p.stderr
            continue
        _, senv = _called(stubs, "srun")
        hosts = Path(senv["SLURM_HOSTFILE"]).read_text().split()
        assert hosts == [f"gpu{i:02d}" for i in range(7, 15) for _ in range(8)]
        assert senv["TOPOPLAN_PLACED"] == str(out / "slurm" / "placed-42")


def test_nvl72_job_places_ranks_on_the_racks_scontrol_reports(tmp_path, stubs):
    """GB300 NVL72: sbatch asks for 4 x 16-tray segments, not hosts; at start it reads the racks from
    'scontrol show topology' (BlockName ... Nodes=...), places the plan with slurm/place.py (python3, no
    topoplan) and srun's hostfile keeps every EP32 group inside one rack. A rack cut to 12 trays exits 3."""
    doc = _doc(DSV3_GB300)
    out = _emit(tmp_path, doc, ["megatron", "slurm"])
    sb = (out / "slurm" / "sbatch.sh").read_text()
    assert "\n#SBATCH --nodes=64\n" in sb and "\n#SBATCH --segment=16\n" in sb
    env = {**_filled(out), **_scontrol(stubs), "SLURM_JOB_ID": "7"}
    racks = {f"blk{b}": [f"nvl-{b}-{t:02d}" for t in range(1, 19)] for b in (9, 3, 5, 7, 1)}
    (tmp_path / "topo.txt").write_text("".join(f"BlockName={b} BlockIndex={i} Nodes=nvl-{b[3:]}-[01-18]\n"
                                               for i, b in enumerate(racks)))
    granted = [h for b in ("blk9", "blk3", "blk7", "blk1") for h in racks[b][:16]]
    p = _run(out / "slurm" / "sbatch.sh", stubs, {**env, "SLURM_JOB_NODELIST": ",".join(granted),
                                                   "STUB_TOPOLOGY": str(tmp_path / "topo.txt")}, cwd=out)
    assert p.returncode == 0, p.stderr
    _, senv = _called(stubs, "srun")
    hosts = Path(senv["SLURM_HOSTFILE"]).read_text().split()
    rack_of = {h: b for b, hs in racks.items() for h in hs}
    config = DSV3_GB300["config"]
    for axis in ("ep", "etp", "tp"):
        assert all(len({rack_of[hosts[r]] for r in g}) == 1 for g in rank_groups(config, 256, axis))
    # task.sh reads the placed rank order: rank 5's host and GPU come from the job's hostfile
    task = {k: senv[k] for k in ("TOPOPLAN_DIR", "TOPOPLAN_PLACED", "MEGATRON_LM")}
    p = _task(out, stubs, **task, NCCL_MNNVL_ENABLE="0", TOPOPLAN_DRY_RUN="1")
    assert p.returncode == 0 and p.stdout.split() == ["RANK=5", f"LOCAL_RANK={load_context(doc).local[5]}"], p.stderr
    short = granted[:-4]
    (stubs / "srun.argv").unlink()
    p = _run(out / "slurm" / "sbatch.sh", stubs, {**env, "SLURM_JOB_NODELIST": ",".join(short),
                                                   "STUB_TOPOLOGY": str(tmp_path / "topo.txt")}, cwd=out)
    assert p.returncode == 3 and "error: rack blk1 holds 12 of the 16 trays" in p.stderr
    assert _called(stubs, "srun") is None


# --- FILL_ME guard -----------------------------------------------------------------------------

def test_unfilled_sbatch_exits_2_naming_every_placeholder(tmp_path, stubs):
    out = _emit(tmp_path, _doc(DSV3_GB300), ["megatron", "torchtitan", "slurm"])
    sb = out / "slurm" / "sbatch.sh"
    names = _placeholders(sb.read_text())
    assert {"TOPOPLAN_CONTAINER_IMAGE", "TOPOPLAN_ENV_ACTIVATE", "TOPOPLAN_DATA_ARGS", "MEGATRON_LM",
            "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"} <= set(names)
    p = _run(sb, stubs, {}, cwd=out)
    assert p.returncode == 2 and _called(stubs, "srun") is None
    for what in ("--partition=FILL_ME_partition", "--account=FILL_ME_account", "--time=FILL_ME_time", *names):
        assert what in p.stderr, what


def test_each_placeholder_alone_stops_the_job(tmp_path, stubs):
    out = _emit(tmp_path, _doc(DSV3_GB300), ["megatron", "slurm"])
    env = _filled(out)
    sb = out / "slurm" / "sbatch.sh"
    p = _run(sb, stubs, env, cwd=out)
    assert p.returncode == 0, p.stderr
    assert _called(stubs, "srun") is not None
    for var in env:
        (stubs / "srun.argv").unlink(missing_ok=True)
        p = _run(sb, stubs, {k: v for k, v in env.items() if k != var}, cwd=out)
        assert p.returncode == 2 and var in p.stderr and _called(stubs, "srun") is None, var
    text = sb.read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --time=04:00:00"):
        sb.write_text(text.replace(line, line.split("=")[0] + "=FILL_ME_x"))
        p = _run(sb, stubs, env, cwd=out)
        assert p.returncode == 2 and "FILL_ME_x" in p.stderr, line
    sb.write_text(text)


def test_task_refuses_any_placeholder_in_its_environment(tmp_path, stubs):
    out = _emit(tmp_path, _doc(LLAMA8), ["megatron", "slurm"])
    env = {"TOPOPLAN_DIR": str(out), "SLURM_PROCID": "3", "MEGATRON_LM": "/opt/mlm"}
    p = _run(out / "slurm" / "task.sh", stubs, {**env, "NCCL_IB_HCA": "FILL_ME_nccl_ib_hca"})
    assert p.returncode == 2 and "NCCL_IB_HCA" in p.stderr and _called(stubs, "python") is None
    assert _run(out / "slurm" / "task.sh", stubs, env).returncode == 0


# --- the trainer launched follows --emit ----------------------------------------------------------

def _task(out, stubs, **env):
    base = {"TOPOPLAN_DIR": str(out), "SLURM_PROCID": "5"}
    return _run(out / "slurm" / "task.sh", stubs, {**base, **env})


def test_each_trainer_launches_its_own_files(tmp_path, stubs):
    doc = _doc(LLAMA8)
    ctx = load_context(doc)
    hosts = list(dict.fromkeys(_rank_hosts(doc)))
    homes = {"MEGATRON_LM": "/opt/mlm", "MEGATRON_BRIDGE": "/opt/mb",
             "MAXTEXT_TRAIN": "python -m maxtext.trainers.pre_train.train /opt/base.yml"}
    for trainer in ("megatron", "bridge", "torchtitan", "maxtext"):
        out = _emit(tmp_path, doc, [trainer, "slurm"], trainer)
        for f in stubs.glob("*.argv"):
            f.unlink()
        env = dict(homes)
        if trainer == "maxtext":
            env["SLURMD_NODENAME"] = hosts[1]
        p = _task(out, stubs, **env)
        assert p.returncode == 0, p.stderr
        argv, penv = _called(stubs, "python")
        if trainer == "megatron":
            assert argv == ["/opt/mlm/pretrain_gpt.py"] + megatron.megatron_args(ctx)
            assert penv["RANK"] == "5" and penv["WORLD_SIZE"] == "16"
        elif trainer == "bridge":
            lines = [x for x in (out / "bridge" / "overrides.txt").read_text().splitlines() if x and x[0] != "#"]
            assert argv == ["/opt/mb/scripts/training/run_recipe.py", "--recipe", "llama3_8b_pretrain_config", *lines]
            assert "model.tensor_model_parallel_size=2" in argv
        elif trainer == "torchtitan":
            assert argv == ["-m", "torchtitan.train", *torchtitan.command_args(ctx)]
            assert penv["PYTHONPATH"].split(":")[0] == str(out / "torchtitan")
        else:
            kv = [f"{k}={maxtext.yaml_value(v)}" for k, v in maxtext.overrides(ctx).items()]
            assert argv == ["-m", "maxtext.trainers.pre_train.train", "/opt/base.yml", *kv,
                            "run_name=topoplan-run", "dataset_type=synthetic"]
            # MaxText's GPU initialisation reads these (max_utils.initialize_jax_for_gpu)
            assert (penv["NNODES"], penv["NODE_RANK"], penv["JAX_COORDINATOR_IP"]) == ("2", "1", hosts[0])
            assert penv["CUDA_VISIBLE_DEVICES"] == ",".join(str(g) for g in ctx.local[8:16])
        assert _called(stubs, "torchrun") is None


def test_torchtitan_alone_is_never_started_as_megatron(tmp_path, stubs):
    """The issue's bug: --emit torchtitan,slurm used to start pretrain_gpt.py."""
    doc = _doc(LLAMA8)
    out = _emit(tmp_path, doc, ["torchtitan", "slurm"])
    p = _task(out, stubs, TOPOPLAN_TRAINER="megatron", MEGATRON_LM="/opt/mlm")
    assert p.returncode == 2 and "was not emitted" in p.stderr and _called(stubs, "python") is None
    hosts = list(dict.fromkeys(_rank_hosts(doc)))
    p = _task(out, stubs, TOPOPLAN_LAUNCHER="node", SLURMD_NODENAME=hosts[1])
    assert p.returncode == 0, p.stderr
    argv, _ = _called(stubs, "torchrun")
    assert argv == ["--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1", "--master-addr", hosts[0],
                    "--master-port", "29500", "-m", "torchtitan.train", *torchtitan.command_args(load_context(doc))]
    sb = (out / "slurm" / "sbatch.sh").read_text()
    assert "MEGATRON_LM" not in sb and 'TOPOPLAN_TRAINER:-torchtitan' in sb


def test_slurm_alone_launches_nothing(tmp_path, stubs):
    out = _emit(tmp_path, _doc(LLAMA8), ["slurm"])
    p = _task(out, stubs)
    assert p.returncode == 2 and "no trainer was emitted" in p.stderr
    env = _filled(out)
    p = _run(out / "slurm" / "sbatch.sh", stubs, env, cwd=out)
    assert p.returncode == 2 and "no trainer was emitted" in p.stderr and _called(stubs, "srun") is None


def test_several_trainers_default_to_megatron_and_others_need_no_home(tmp_path, stubs):
    out = _emit(tmp_path, _doc(LLAMA8), ["megatron", "bridge", "torchtitan", "slurm"])
    env = {k: v for k, v in _filled(out).items() if k not in ("MEGATRON_LM", "MEGATRON_BRIDGE")}  # left as FILL_ME
    p = _run(out / "slurm" / "sbatch.sh", stubs, {**env, "TOPOPLAN_TRAINER": "torchtitan"}, cwd=out)
    assert p.returncode == 0, p.stderr
    _, senv = _called(stubs, "srun")
    assert senv["TOPOPLAN_TRAINER"] == "torchtitan" and "MEGATRON_LM" not in senv and "MEGATRON_BRIDGE" not in senv
    p = _run(out / "slurm" / "sbatch.sh", stubs, env, cwd=out)      # default trainer megatron: its home is needed
    assert p.returncode == 2 and "MEGATRON_LM" in p.stderr


def test_real_data_replaces_mock_data(tmp_path, stubs):
    doc = _doc(LLAMA8)
    out = _emit(tmp_path, doc, ["megatron", "slurm"])
    data = "--data-path /d/c4_text_document --tokenizer-type HuggingFaceTokenizer --tokenizer-model '/m/tok dir'"
    p = _task(out, stubs, MEGATRON_LM="/opt/mlm", TOPOPLAN_DATA_ARGS=data)
    assert p.returncode == 0, p.stderr
    argv, _ = _called(stubs, "python")
    want = [a for a in megatron.megatron_args(load_context(doc)) if a != "--mock-data"]
    assert argv == ["/opt/mlm/pretrain_gpt.py", *want, "--data-path", "/d/c4_text_document", "--tokenizer-type",
                    "HuggingFaceTokenizer", "--tokenizer-model", "/m/tok dir"]


def test_bridge_without_recipe_is_refused_before_writing(tmp_path):
    doc = plan_doc("gpt-oss-20b", hgx_cluster("h100", 1), ParallelConfig(tp=1, ep=8),
                   Training(seq_len=4096, global_batch=8))
    with pytest.raises(InputError, match="no recipe for gpt-oss-20b"):
        emit_plan(doc, ["bridge", "slurm"], tmp_path / "o")
    assert not (tmp_path / "o").exists()


# --- fabric and NVLink environment ---------------------------------------------------------------

def _job_env(tmp_path, stubs, doc, trainers, name="o", **extra) -> dict[str, str]:
    out = _emit(tmp_path, doc, trainers, name)
    env = _filled(out)
    p = _run(out / "slurm" / "sbatch.sh", stubs, {**env, **extra}, cwd=out)
    assert p.returncode == 0, p.stderr
    return _called(stubs, "srun")[1]


def test_gb300_nvl72_job_enables_mnnvl_and_needs_an_imex_channel(tmp_path, stubs):
    doc = _doc(DSV3_GB300)
    senv = _job_env(tmp_path, stubs, doc, ["megatron", "slurm"])
    assert senv["NCCL_MNNVL_ENABLE"] == "1" and senv["NCCL_NVLS_ENABLE"] == "2"
    assert "NCCL_IB_GID_INDEX" not in senv                            # InfiniBand (the preset's fabric)
    sb = (tmp_path / "o" / "slurm" / "sbatch.sh").read_text()
    assert "\n#SBATCH --segment=16\n" in sb                          # 64 of 72 GPUs per rack = 16 trays
    # task.sh under that environment: without an IMEX channel it stops, with one it starts the trainer
    chans = tmp_path / "imex"
    chans.mkdir()
    task = {k: senv[k] for k in ("NCCL_MNNVL_ENABLE", "TOPOPLAN_DIR", "MEGATRON_LM")}
    p = _task(tmp_path / "o", stubs, **task, TOPOPLAN_IMEX_CHANNELS=str(chans))
    assert p.returncode == 2 and "IMEX channel" in p.stderr and _called(stubs, "python") is None
    (chans / "channel0").write_text("")
    p = _task(tmp_path / "o", stubs, **task, TOPOPLAN_IMEX_CHANNELS=str(chans))
    assert p.returncode == 0, p.stderr
    _, penv = _called(stubs, "python")
    # Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 only before Blackwell (sm < 100): unset on GB300;
    # HybridEP reads the NVLink domain size (72-GPU racks, 64 used by the plan)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in penv and penv["USE_MNNVL"] == "1"


def test_h100_infiniband_job(tmp_path, stubs):
    senv = _job_env(tmp_path, stubs, _doc(LLAMA70_H100), ["bridge", "slurm"])
    assert "NCCL_MNNVL_ENABLE" not in senv and "NCCL_IB_GID_INDEX" not in senv
    assert senv["NCCL_IB_HCA"] == "/opt/nccl_ib_hca" and senv["NCCL_SOCKET_IFNAME"] == "/opt/nccl_socket_ifname"
    argv, _ = _called(stubs, "srun")
    assert "--distribution=arbitrary" in argv and "--ntasks=64" in argv
    # Bridge alone (no megatron/env.sh): TP8 on sm90 still gets the connection limit Megatron asserts
    p = _task(tmp_path / "o", stubs, MEGATRON_BRIDGE="/opt/mb", NCCL_IB_HCA="auto", NCCL_SOCKET_IFNAME="=eth0")
    assert p.returncode == 0, p.stderr
    _, penv = _called(stubs, "python")
    assert penv["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "NCCL_IB_HCA" not in penv and penv["NCCL_SOCKET_IFNAME"] == "=eth0"   # auto: NCCL's own choice


def test_roce_fabric_asks_for_the_gid_index(tmp_path, stubs):
    roce = Cluster.model_validate({**hgx_cluster("h100", 8).to_dict(), "fabric": "roce"})
    out = _emit(tmp_path, _doc(LLAMA70_H100, roce), ["megatron", "slurm"])
    sb = (out / "slurm" / "sbatch.sh").read_text()
    assert "NCCL_IB_GID_INDEX" in _placeholders(sb) and "fabric roce" in sb
    senv = _job_env(tmp_path, stubs, _doc(LLAMA70_H100, roce), ["megatron", "slurm"], "o2")
    assert senv["NCCL_IB_GID_INDEX"] == "/opt/nccl_ib_gid_index"


def test_cluster_fabric_field():
    base = {"gpu": "h100", "nodes": [{"name": "n[1-2]"}]}
    assert Cluster.model_validate(base).fabric is None
    c = cluster_from_dict({**base, "fabric": "roce"}, "c.yaml")
    assert c.fabric == "roce" and Cluster.model_validate(c.to_dict()).fabric == "roce"
    assert "fabric" not in Cluster.model_validate(base).to_dict()
    with pytest.raises(InputError, match=r"c.yaml: field 'fabric'"):
        cluster_from_dict({**base, "fabric": "ethernet"}, "c.yaml")
    json.dumps(c.model_dump(mode="json"))


@given(prefix=st.sampled_from(["node", "gpu-a", "dgx-r7-n", "x"]), width=st.sampled_from([0, 3]),
       numbers=st.lists(st.integers(0, 400), min_size=2, max_size=24, unique=True), data=st.data())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_nodelist_round_trips_any_host_names(prefix, width, numbers, data):
    """Host names in any order (the cluster file's order is the rank order), padded or not, some failed:
    --nodelist and the rank-order line expand back to the hosts of the ranks, in order."""
    names = [f"{prefix}{str(n).zfill(width)}" for n in numbers]
    failed = data.draw(st.lists(st.sampled_from(names), max_size=len(names) - 1, unique=True))
    c = cluster_from_dict({"gpu": "h100", "nodes": [{"name": n, "gpus": 8} for n in names],
                           "health": {"failed_nodes": failed}})
    doc = plan_doc("llama3-8b", c, ParallelConfig(tp=8, pp=1, mbs=1, recompute="none"),
                   Training(seq_len=4096, global_batch=8 * (len(names) - len(failed))))
    ctx = load_context(doc)
    text = slurm.sbatch_script(dataclasses.replace(ctx, trainers=("megatron",)))
    in_order = list(dict.fromkeys(_rank_hosts(doc)))
    assert expand(re.search(r"^##SBATCH --nodelist=(\S+)$", text, flags=re.M).group(1)) == in_order
    assert expand(re.search(r"^#   (\S+)$", text, flags=re.M).group(1)) == in_order
    assert "PLACEHOLDER" not in text                                  # none of these is a preset's name
