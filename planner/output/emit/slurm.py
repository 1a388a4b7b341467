"""Slurm launch files that put global rank r on the GPU the plan chose for it, start the trainer that
was emitted with them, and refuse to run until the user has filled in what only they know.

Megatron builds its groups from global ranks (order tp-cp-ep-dp-pp: TP groups are consecutive
ranks, then CP, then EP) and TorchTitan from its mesh ``[pp, dp_replicate, dp_shard, cp, tp]``, so the
rank -> GPU map alone decides which groups share an NVLink domain. Slurm's default ``block``
distribution follows its sorted node order, not the plan's, so the files pin it:

* ``slurm/hostfile``: line r is the host of global rank r; ``srun --distribution=arbitrary`` with
  ``SLURM_HOSTFILE`` starts task r (``SLURM_PROCID`` = r) on that host.
* ``slurm/task.sh``: run once per task; exports ``RANK``, ``LOCAL_RANK`` (the plan's GPU index on
  the host), ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and starts the emitted trainer
  (Megatron-LM ``pretrain_gpt.py`` with megatron/args.txt, Megatron-Bridge ``run_recipe.py`` with
  bridge/overrides.txt, ``torchtitan.train`` with torchtitan/command.txt, MaxText with
  maxtext/overrides.yml). With the ``node`` launcher (``TOPOPLAN_LAUNCHER=node``, alias ``torchrun``;
  MaxText's only one) it runs once per host: torchrun with a fixed ``--node-rank`` looked up from the
  host name (never rendezvous join order), or one JAX process, with ``CUDA_VISIBLE_DEVICES``
  ordered so that local rank i is the plan's GPU.
* ``slurm/sbatch.sh``: the allocation (the plan's hosts, as a compressed hostlist), ``FILL_ME_*``
  placeholders for partition, account, time, software environment, data and the network's HCA
  names, the NCCL settings of the cluster's fabric (InfiniBand or RoCE, multi-node NVLink on NVL72)
  and the srun line. Every FILL_ME left in makes the job exit 2 before anything starts.

docs/emitters.md ("Slurm") lists every setting with its source.
"""

from __future__ import annotations

from pathlib import Path

from planner.cost.shape import host_domains
from planner.errors import InputError
from planner.output.emit import EmitContext, launch_shape_of
from planner.trainers import LAUNCH, owner_of
from topologies.gpus import get_gpu
from topologies.hostlist import compress
from topologies.presets import is_preset_host

MASTER_PORT = 29500
FILL = "FILL_ME"
# trainers slurm/task.sh can start, in the order the default is picked when several are emitted (each
# trainer package says how: planner.trainers.base.Launch, and its emitter's task_env / task_command)
LAUNCHABLE = tuple(LAUNCH)
# the variable naming each trainer's installation (none for TorchTitan: a pip package)
TRAINER_HOME = {t: launch.home for t, launch in LAUNCH.items() if launch.home}
IMEX_CHANNELS = "/dev/nvidia-caps-imex-channels"
# the one place implementation (standard library only), shipped as slurm/place.py; read as a file, not
# imported: planner.launch sits above planner.output
PLACE_CORE = Path(__file__).resolve().parents[2] / "launch" / "core.py"


def node_blocks(ctx: EmitContext) -> list[tuple[str, list[int]]] | None:
    """For torchrun (global rank = node_rank * nproc + local_rank): the hosts in node-rank order and,
    per host, the plan's GPU for each torchrun local rank. None when the plan's rank order is not
    made of equal whole-host blocks of consecutive ranks."""
    n = ctx.gpus_per_node
    if ctx.world % n:
        return None
    blocks = []
    for b in range(ctx.world // n):
        ranks = range(b * n, (b + 1) * n)
        hosts = {ctx.hosts[r] for r in ranks}
        if len(hosts) != 1:
            return None
        blocks.append((ctx.hosts[b * n], [ctx.local[r] for r in ranks]))
    if len({h for h, _ in blocks}) != len(blocks):
        return None
    return blocks


def trainers(ctx: EmitContext) -> list[str]:
    """The emitted trainers task.sh can start, default first. Megatron-Bridge needs a recipe; MaxText
    needs whole-host rank blocks (one JAX process per host). InputError when the only trainer
    emitted cannot be launched."""
    out = []
    for t in LAUNCHABLE:
        if t not in ctx.trainers:
            continue
        why = unlaunchable(ctx, t)
        if why and len([x for x in LAUNCHABLE if x in ctx.trainers]) == 1:
            raise InputError(f"--trainer {t},slurm: {why}")
        if not why:
            out.append(t)
    return out


def unlaunchable(ctx: EmitContext, trainer: str) -> str | None:
    """Why the launchers cannot start emitter ``trainer`` for this plan (its emitter's ``unlaunchable``), or None."""
    check = getattr(owner_of(trainer).emitter(trainer), "unlaunchable", None)
    return check(ctx) if check else None


def per_host_test(var: str) -> str:
    """A shell test: the trainer named by ``var`` runs one process per host (``Launch.per_host``: MaxText)."""
    names = [t for t, launch in LAUNCH.items() if launch.per_host]
    return " || ".join(f'[ "{var}" = {t} ]' for t in names) or "false"


def default_launcher(trainer: str) -> str:
    return "node" if LAUNCH[trainer].per_host else "srun"


def fabric(ctx: EmitContext) -> str:
    """``infiniband``, ``roce``, ``efa`` or ``tcpxo``: the cluster file's ``fabric`` (omitted = infiniband)."""
    return getattr(ctx.cluster, "fabric", None) or "infiniband"


def multi_node_nvlink(ctx: EmitContext) -> bool:
    """True when an NVLink domain spans several hosts (GB200/GB300 NVL72 racks): NCCL needs MNNVL."""
    per_domain: dict[int, set[str]] = {}
    for h, d in zip(ctx.hosts, ctx.domains):
        per_domain.setdefault(d, set()).add(h)
    return any(len(s) > 1 for s in per_domain.values())


def placeholder_hosts(ctx: EmitContext) -> bool:
    """True when every host name is one a preset made up (``gb300-r01-t01``, ``h100-n0001``)."""
    return all(is_preset_host(h) for h in ctx.host_order)


def hostlist(ctx: EmitContext) -> str:
    """The plan's hosts in rank order as one Slurm hostlist expression."""
    return compress(ctx.host_order)


def hostfile(ctx: EmitContext) -> str:
    return "".join(h + "\n" for h in ctx.hosts)


def site_settings(ctx: EmitContext, names: list[str]) -> list[tuple[str, str]]:
    """(variable, comment) of every value the user must fill in; each defaults to FILL_ME_<what>."""
    s = [
        ("TOPOPLAN_CONTAINER_IMAGE", "image for srun --container-image (pyxis/enroot), or none to run on the hosts"),
        ("TOPOPLAN_CONTAINER_MOUNTS", "extra container mounts src:dst[,src:dst] for data and checkpoints, or none"),
        ("TOPOPLAN_ENV_ACTIVATE", "a file every task sources first (a venv's bin/activate, module loads), or none"),
        ("TOPOPLAN_DATA_ARGS", "mock (synthetic data, as emitted), or your trainer's data arguments as shell words, "
                               "e.g. megatron: --data-path /lustre/tok/text_document --tokenizer-type "
                               "HuggingFaceTokenizer --tokenizer-model /models/tok"),
    ]
    s += [TRAINER_HOME[t] for t in names if t in TRAINER_HOME]
    if fabric(ctx) in ("infiniband", "roce"):
        s.append(("NCCL_IB_HCA", "HCAs NCCL may use, e.g. =mlx5_0,mlx5_1,mlx5_4,mlx5_5 (ibv_devinfo lists them); "
                                 "auto lets NCCL choose"))
    s.append(("NCCL_SOCKET_IFNAME", "interface for NCCL's bootstrap (TCP) traffic, e.g. =eth0 or ib (prefix); auto"))
    if fabric(ctx) == "roce":
        s.append(("NCCL_IB_GID_INDEX", "RoCE v2 GID index of the HCAs (show_gids / ibv_devinfo -v; often 3); "
                                       "auto lets NCCL (>= 2.21) pick it"))
    return s


def placeholder(var: str) -> str:
    """``FILL_ME_<what>``: the value a setting holds until the user fills it in (Slurm and k8s files)."""
    return f"{FILL}_{var.lower().removeprefix('topoplan_')}"


def nccl_env(ctx: EmitContext) -> dict[str, str]:
    """The NCCL variables the plan itself fixes (NVLink SHARP, multi-node NVLink): the one source of
    their values for slurm/sbatch.sh (:func:`fabric_exports`, which says why) and the k8s pod env."""
    env = {}
    if get_gpu(ctx.gpu).nvls_busbw_gbps:
        env["NCCL_NVLS_ENABLE"] = "2"
    if multi_node_nvlink(ctx):
        env["NCCL_MNNVL_ENABLE"] = "1"
    return env


def fabric_exports(ctx: EmitContext) -> list[str]:
    """Comment and export lines for what the plan itself fixes about the network."""
    out = []
    env = nccl_env(ctx)
    if fabric(ctx) == "efa":
        out += ["# AWS EFA: NCCL reaches the network through the aws-ofi-nccl plug-in over libfabric's efa provider",
                "# (the plan's collective times assume it, topologies/data/fabrics.yaml); NCCL_DEBUG=INFO must show",
                "# 'NET/OFI Selected provider is efa', not NET/Socket.",
                "export FI_PROVIDER=efa"]
    if fabric(ctx) == "tcpxo":
        out += ["# GCP GPUDirect-TCPXO: NCCL needs Google's TCPXO net plug-in and the variables its image's",
                "# nccl-env-profile.sh exports (source it through TOPOPLAN_ENV_ACTIVATE); without them NCCL falls",
                "# back to plain sockets and the plan's collective times do not hold."]
    if "NCCL_NVLS_ENABLE" in env:
        out += ["# NVLink SHARP: NCCL's default (2 = use when the NVSwitches offer it). The plan's all-reduce times",
                "# assume it (topologies/collectives.py); an image that sets NCCL_NVLS_ENABLE=0 would slow them.",
                f"export NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']}"]
    if "NCCL_MNNVL_ENABLE" in env:
        out += [f"# Multi-node NVLink: NVLink domains of up to {get_gpu(ctx.gpu).nvlink_domain_max} GPUs across "
                f"{ctx.gpus_per_node}-GPU trays. Ranks on different trays",
                "# of a rack talk over NVLink through IMEX: every tray of a rack runs nvidia-imex in one IMEX domain and",
                f"# the job needs an IMEX channel ({IMEX_CHANNELS}/channelN, made by the admin or per job",
                "# by Slurm's switch/nvidia_imex plugin); slurm/task.sh refuses to start without one.",
                "# 1 = fail at NCCL init when MNNVL is unusable instead of silently sending the traffic between the",
                "# trays of a rack over the network (NCCL's default 2 = auto), which would void the plan's prediction.",
                f"export NCCL_MNNVL_ENABLE={env['NCCL_MNNVL_ENABLE']}"]
    return out


def task_script(ctx: EmitContext) -> str:
    """slurm/task.sh: its header and settings, the rank lookups, the trainer commands and ``main``."""
    return "\n".join([_task_head(ctx), _task_lookups(ctx), trainer_shell(ctx), _task_main(ctx)])


def _task_head(ctx: EmitContext) -> str:
    names = trainers(ctx)
    return f"""#!/usr/bin/env bash
# Per-task launcher written by topoplan for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()},
# {ctx.world} x {ctx.gpu}. Started by slurm/sbatch.sh; see docs/emitters.md and docs/launch.md.
#   srun launcher (default): one task per GPU; task SLURM_PROCID=r runs global rank r on host line r
#                    of the placed hostfile and GPU line r of the placed local_gpus.
#   node launcher:   TOPOPLAN_LAUNCHER=node (or torchrun), one task per host with a fixed node rank;
#                    torchrun for the PyTorch trainers, one JAX process for MaxText (its only launcher).
# The rank order: TOPOPLAN_PLACED (set by sbatch.sh after slurm/place.py placed the plan on the job's
# hosts) holds hostfile and local_gpus; without it, slurm/hostfile and slurm/local_gpus (the plan's hosts).
# Trainers emitted with this file: {' '.join(names) or 'none'} (TOPOPLAN_TRAINER picks one; default {names[0] if names else 'none'}).
# TOPOPLAN_DRY_RUN=1 prints the rank environment instead of starting the trainer.
set -euo pipefail
ROOT="${{TOPOPLAN_DIR:?set TOPOPLAN_DIR to the topoplan output directory}}"
PLACED="${{TOPOPLAN_PLACED:-$ROOT/slurm}}"
WORLD={ctx.world}
NPROC_PER_NODE={ctx.gpus_per_node}
NNODES={len(ctx.host_order)}
TORCHRUN_OK={1 if node_blocks(ctx) else 0}
EMITTED="{' '.join(names)}"
MNNVL={1 if multi_node_nvlink(ctx) else 0}
"""


def _task_lookups(ctx: EmitContext) -> str:
    return f"""topoplan_load_placement() {{  # RANK_HOST[r], LOCAL_GPU[r] of every global rank r, and MASTER_HOST
  mapfile -t RANK_HOST < "$PLACED/hostfile"
  mapfile -t LOCAL_GPU < "$PLACED/local_gpus"
  if [ "${{#RANK_HOST[@]}}" != "$WORLD" ] || [ "${{#LOCAL_GPU[@]}}" != "$WORLD" ]; then
    echo "topoplan: $PLACED/hostfile and local_gpus must hold $WORLD lines (one per rank); run slurm/place.py again" >&2
    return 1
  fi
  MASTER_HOST="${{RANK_HOST[0]}}"
}}

topoplan_rank_env() {{  # sets RANK LOCAL_RANK for srun task $1 (SLURM_PROCID)
  RANK="$1"
  LOCAL_RANK="${{LOCAL_GPU[$RANK]}}"
}}

topoplan_node_env() {{  # sets NODE_RANK GPUS for host $1 (node launcher: whole hosts of consecutive ranks)
  local b r
  for ((b = 0; b < NNODES; b++)); do
    if [ "${{RANK_HOST[$((b * NPROC_PER_NODE))]}}" = "$1" ]; then
      NODE_RANK=$b
      GPUS="${{LOCAL_GPU[$((b * NPROC_PER_NODE))]}}"
      for ((r = b * NPROC_PER_NODE + 1; r < (b + 1) * NPROC_PER_NODE; r++)); do GPUS="$GPUS,${{LOCAL_GPU[$r]}}"; done
      return 0
    fi
  done
  echo "topoplan: host $1 is not in $PLACED/hostfile (or the plan is not made of whole-host rank blocks)" >&2
  return 1
}}

topoplan_refuse_placeholders() {{  # a value still reading FILL_ME... was never filled in
  local v bad=0
  for v in $(compgen -e); do
    case "${{!v}}" in
      *{FILL}*) echo "topoplan: $v=${{!v}} is a placeholder: fill it in (slurm/sbatch.sh, or export it)" >&2; bad=1 ;;
    esac
  done
  return "$bad"
}}
"""


def _emitter(name: str):
    return owner_of(name).emitter(name)


def trainer_shell(ctx: EmitContext) -> str:
    """The shell functions that set up and print the command line of an emitted trainer (``trainer_cmd
    TRAINER PREFIX``): slurm/task.sh and the Kubernetes pods' launch.sh share them. Each trainer's part is
    its emitter's ``task_env`` and ``task_command`` (planner.trainers)."""
    envs: dict[str, list[str]] = {}
    for t in LAUNCHABLE:
        env = _emitter(t).task_env(ctx)
        if env:
            envs.setdefault(env, []).append(t)
    env_arms = "\n".join(f"    {'|'.join(names)}) {env} ;;" for env, names in envs.items())
    mock = "".join(f'if [ "$1" = {t} ]; then echo "{launch.mock_data}"; fi' for t, launch in LAUNCH.items()
                   if launch.mock_data)
    return f"""topoplan_trainer_env() {{  # the environment the trainer asserts or reads (megatron: planner.trainers.megatron.emit)
  case "$1" in
{env_arms}
  esac
}}

topoplan_data() {{  # prints extra trainer arguments for TOPOPLAN_DATA_ARGS (mock: the emitted synthetic data)
  case "${{TOPOPLAN_DATA_ARGS:-mock}}" in
    mock) {mock} ;;
    *) echo "$TOPOPLAN_DATA_ARGS" ;;
  esac
}}

topoplan_quote_lines() {{  # each line of stdin as one shell-quoted word
  local line
  while IFS= read -r line; do printf ' %q' "$line"; done
}}
""" + "\n" + _task_trainers(ctx)


def _task_trainers(ctx: EmitContext) -> str:
    arms = "\n".join(f"    {t})\n{_emitter(t).task_command(ctx)}" for t in LAUNCHABLE)
    return f"""trainer_cmd() {{  # prints the command line (for eval) of trainer $1; $2 = "python" or the torchrun prefix
  local data
  data=$(topoplan_data "$1")
  case "$1" in
{arms}
  esac
}}
"""


def _task_main(ctx: EmitContext) -> str:
    names = trainers(ctx)
    node_envs = "".join(f'    if [ "$trainer" = {t} ]; then\n      {launch.node_env}\n    fi\n'
                        for t, launch in LAUNCH.items() if launch.node_env)
    return f"""main() {{
  topoplan_refuse_placeholders || exit 2
  local trainer="${{TOPOPLAN_TRAINER:-{names[0] if names else ''}}}"
  if [ -n "$trainer" ]; then
    case " $EMITTED " in
      *" $trainer "*) ;;
      *) echo "topoplan: TOPOPLAN_TRAINER=$trainer was not emitted with this plan (emitted: ${{EMITTED:-none}}); emit again with --trainer $trainer,slurm" >&2; exit 2 ;;
    esac
  fi
  local launcher="${{TOPOPLAN_LAUNCHER:-srun}}"
  if {per_host_test('$trainer')}; then launcher="${{TOPOPLAN_LAUNCHER:-node}}"; fi
  case "$launcher" in
    srun) ;;
    node|torchrun) launcher=node ;;
    *) echo "topoplan: TOPOPLAN_LAUNCHER=$launcher: use srun (one task per GPU) or node (one per host)" >&2; exit 2 ;;
  esac
  if {{ {per_host_test('$trainer')}; }} && [ "$launcher" = srun ]; then
    echo "topoplan: $trainer runs one process per host; use TOPOPLAN_LAUNCHER=node" >&2; exit 2
  fi
  topoplan_load_placement || exit 2
  export WORLD_SIZE="$WORLD" MASTER_ADDR="${{MASTER_ADDR:-$MASTER_HOST}}" MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"
  local prefix=python
  if [ "$launcher" = node ]; then
    [ "$TORCHRUN_OK" = 1 ] || {{ echo "topoplan: this plan's rank order is not whole-host blocks; use the srun launcher" >&2; exit 2; }}
    topoplan_node_env "${{SLURMD_NODENAME:-$(hostname -s)}}" || exit 2
    export CUDA_VISIBLE_DEVICES="$GPUS"
    if [ "${{TOPOPLAN_DRY_RUN:-0}}" = 1 ]; then echo "NODE_RANK=$NODE_RANK CUDA_VISIBLE_DEVICES=$GPUS"; exit 0; fi
    prefix="torchrun --nnodes $NNODES --nproc-per-node $NPROC_PER_NODE --node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port $MASTER_PORT"
{node_envs}  else
    topoplan_rank_env "${{SLURM_PROCID:?run under srun}}"
    export RANK LOCAL_RANK
    if [ "${{TOPOPLAN_DRY_RUN:-0}}" = 1 ]; then echo "RANK=$RANK LOCAL_RANK=$LOCAL_RANK"; exit 0; fi
  fi
  [ -n "$trainer" ] || {{ echo "topoplan: no trainer was emitted with slurm; emit again with --trainer {LAUNCHABLE[0]},slurm (or {', '.join(LAUNCHABLE[1:])})" >&2; exit 2; }}
  local v
  for v in NCCL_IB_HCA NCCL_SOCKET_IFNAME NCCL_IB_GID_INDEX; do
    if [ "${{!v:-}}" = auto ]; then unset "$v"; fi
  done
  if [ -n "${{TOPOPLAN_ENV_ACTIVATE:-}}" ] && [ "$TOPOPLAN_ENV_ACTIVATE" != none ]; then
    set +u
    # shellcheck disable=SC1090
    . "$TOPOPLAN_ENV_ACTIVATE"
    set -u
  fi
  if [ "$MNNVL" = 1 ] && [ "${{NCCL_MNNVL_ENABLE:-2}}" = 1 ] && ! compgen -G "${{TOPOPLAN_IMEX_CHANNELS:-{IMEX_CHANNELS}}}/channel*" >/dev/null; then
    echo "topoplan: no IMEX channel in ${{TOPOPLAN_IMEX_CHANNELS:-{IMEX_CHANNELS}}} on $(hostname -s): multi-node NVLink needs one (see slurm/sbatch.sh)" >&2
    exit 2
  fi
  topoplan_trainer_env "$trainer"
  local cmd
  if {per_host_test('$trainer')}; then cmd=$(trainer_cmd "$trainer" ""); else cmd=$(trainer_cmd "$trainer" "$prefix"); fi
  eval "exec $cmd"
}}

if [ "${{TOPOPLAN_SOURCE_ONLY:-0}}" != 1 ]; then
  main "$@"
fi
"""


def segment(ctx: EmitContext) -> int | None:
    """Slurm ``--segment``: hosts per NVLink-domain slot when domains span hosts and every slot needs as many."""
    shape = launch_shape_of(ctx)
    sizes = {s.hosts for s in shape.slots}
    return sizes.pop() if shape.multi_host_domains and len(sizes) == 1 else None


def shape_request(ctx: EmitContext) -> list[str]:
    """The #SBATCH lines that ask for the plan's shape (no host names), and the --nodelist alternative."""
    shape = launch_shape_of(ctx)
    seg = segment(ctx)
    lines = [f"#SBATCH --nodes={shape.hosts}", f"#SBATCH --ntasks={ctx.world}",
             f"#SBATCH --gpus-per-node={ctx.gpus_per_node}", "#SBATCH --exclusive"]
    if seg:
        lines += [f"# Whole-rack segments (topology/block, one block per NVL72 rack): {len(shape.slots)} x {seg} trays, "
                  "each in one block.", f"#SBATCH --segment={seg}"]
    elif shape.multi_host_domains:
        lines += ["# The plan's racks hold " + "/".join(str(s.hosts) for s in shape.slots) + " trays: no single "
                  "--segment fits; the job checks the racks it gets (exit 3 on a shortfall)."]
    lines += ["# Or pin the plan's own hosts (the job still places ranks at start): put one '#' less on the next line.",
              f"##SBATCH --nodelist={hostlist(ctx)}"]
    return lines


def place_step(ctx: EmitContext) -> str:
    """sbatch.sh: place the plan on SLURM_JOB_NODELIST (slurm/place.py) and export the rank order."""
    span = 1 if launch_shape_of(ctx).multi_host_domains else 0
    return f"""DOMAINS_SPAN_HOSTS={span}  # the plan's NVLink domains span hosts (NVL72 racks of trays)
topoplan_blocks() {{  # 'HOST BLOCK' for every node of every BlockName line of 'scontrol show topology'
  local line name nodes
  while IFS= read -r line; do
    case "$line" in *BlockName=*Nodes=*) ;; *) continue ;; esac
    name=${{line#*BlockName=}}; name=${{name%% *}}
    nodes=${{line#*Nodes=}}; nodes=${{nodes%% *}}
    scontrol show hostnames "$nodes" | sed "s/\\$/ $name/"
  done
}}
topoplan_place() {{  # writes $TOPOPLAN_PLACED/hostfile and local_gpus for the granted hosts; exit 3 on a shortfall
  local run="$TOPOPLAN_DIR/slurm/placed-${{SLURM_JOB_ID:-$$}}" domains=- py="${{TOPOPLAN_PYTHON:-python3}}"
  command -v scontrol >/dev/null || {{ echo "topoplan: scontrol not found: cannot expand SLURM_JOB_NODELIST" >&2; return 2; }}
  command -v "$py" >/dev/null || {{ echo "topoplan: $py not found on $(hostname -s): slurm/place.py needs python3 (standard library only); set TOPOPLAN_PYTHON" >&2; return 2; }}
  mkdir -p "$run"
  scontrol show hostnames "$SLURM_JOB_NODELIST" > "$run/granted"
  if [ "$DOMAINS_SPAN_HOSTS" = 1 ]; then  # each granted host's rack
    case "${{TOPOPLAN_DOMAINS:-auto}}" in
      auto|scontrol) SLURM_TOPO_LEN=100000 scontrol show topology 2>/dev/null | topoplan_blocks > "$run/domains" || true ;;
      table) : > "$run/domains" ;;
      *) echo "topoplan: TOPOPLAN_DOMAINS=$TOPOPLAN_DOMAINS: use auto, scontrol or table" >&2; return 2 ;;
    esac
    if [ ! -s "$run/domains" ] && [ "${{TOPOPLAN_DOMAINS:-auto}}" != scontrol ]; then
      cp "$TOPOPLAN_DIR/slurm/domains.txt" "$run/domains"  # the plan's cluster file: host -> rack
    fi
    domains="$run/domains"
  else  # one NVLink domain per host (HGX): every granted host is its own
    sed 's/.*/& &/' "$run/granted" > "$run/granted.d" && mv "$run/granted.d" "$run/granted"
  fi
  "$py" "$TOPOPLAN_DIR/slurm/place.py" "$TOPOPLAN_DIR/slurm/shape.json" "$run/granted" "$domains" \
    "$run/hostfile" "$run/local_gpus" || return $?
  export SLURM_HOSTFILE="$run/hostfile" TOPOPLAN_PLACED="$run"
}}
if [ -n "${{SLURM_JOB_NODELIST:-}}" ]; then
  topoplan_place || exit $?
fi"""


def sbatch_script(ctx: EmitContext) -> str:
    names = trainers(ctx)
    hosts = ctx.host_order
    nodelist = hostlist(ctx)
    fill = site_settings(ctx, names)
    per_host = ctx.gpus_per_node if node_blocks(ctx) else None
    lines = [
        "#!/usr/bin/env bash",
        f"# Slurm job written by topoplan for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()},",
        f"# {ctx.world} x {ctx.gpu} on {len(hosts)} hosts; fabric {fabric(ctx)}"
        + (", NVLink domains span hosts: multi-node NVLink." if multi_node_nvlink(ctx)
           else "."),
        f"# Fill in every {FILL}_* value below: the job exits 2 before starting anything while one remains",
        "# (edit this file, or export the variables before sbatch: sbatch passes your environment on). Then:",
        "#   cd OUT && sbatch slurm/sbatch.sh",
        f"# Trainer: {names[0] if names else 'none emitted'}"
        + (f" (emitted: {' '.join(names)}; TOPOPLAN_TRAINER=<name> picks another)." if len(names) > 1 else "."),
        "# At start the job places the plan on the hosts Slurm granted (slurm/place.py, the same code as",
        "# 'topoplan place'): each NVLink-domain slot of the plan on its own granted rack, so every group the",
        "# plan keeps in one domain stays in one; rank r then runs on line r of that hostfile",
        "# (--distribution=arbitrary). The plan's own hosts in rank order"
        + (f" ({per_host} consecutive ranks each):" if per_host else ":"),
        f"#   {nodelist}",
        f"#SBATCH --job-name=topoplan-{ctx.model.name}",
        f"#SBATCH --partition={FILL}_partition",
        f"#SBATCH --account={FILL}_account",
        f"#SBATCH --time={FILL}_time",
    ]
    lines += shape_request(ctx)
    if placeholder_hosts(ctx):
        lines += [
            f"# PLACEHOLDER HOST NAMES: {ctx.hosts[0]} ... are names a topoplan preset made up, not your nodes.",
            "# The job places the plan on whatever hosts Slurm grants, so they matter only for the --nodelist",
            "# line above and for slurm/domains.txt (a granted host's NVLink domain when 'scontrol show topology'",
            "# has no blocks). Plan on your own cluster file to name real hosts (docs/cluster.md; 'topoplan",
            f"# topology import slurm topology.conf --gpu {ctx.gpu} -o cluster.yaml' reads Slurm's).",
        ]
    lines += ["set -euo pipefail", "", f"# ---- fill in ({FILL}_*) {'-' * 80}"[:100]]
    for var, comment in fill:
        lines.append(f"# {comment}")
        lines.append(f': "${{{var}:={placeholder(var)}}}"')
    lines.append("export " + " ".join(v for v, _ in fill))
    net = fabric_exports(ctx)
    lines += ["", f"# ---- fixed by the plan's cluster {'-' * 80}"[:100]] + (net or ["# (nothing beyond NCCL's defaults)"])
    home = "\n".join(f"    {t}) known=1; need={TRAINER_HOME[t][0]} ;;" if t in TRAINER_HOME else f"    {t}) known=1 ;;"
                     for t in names)
    unset_homes = "".join(  # the other emitted trainers' homes are not needed by this run
        f'\nif [ "$need" != {h} ] && [ "${{{h}#{FILL}}}" != "${h}" ]; then unset {h}; fi'
        for h in (TRAINER_HOME[t][0] for t in names if t in TRAINER_HOME)) if len(names) > 1 else ""
    common = " ".join(v for v, _ in fill if v not in {h for h, _ in TRAINER_HOME.values()})
    lines += ["", f"""# ---- checks and launch {'-' * 80}"""[:100], f"""export TOPOPLAN_TRAINER="${{TOPOPLAN_TRAINER:-{names[0] if names else ''}}}"
need=""
known=0
case "$TOPOPLAN_TRAINER" in
{home}
    *) ;;
esac
if [ "$known" = 0 ]; then
  echo "topoplan: TOPOPLAN_TRAINER=$TOPOPLAN_TRAINER: {'emitted here: ' + ' '.join(names) if names else 'no trainer was emitted'}; emit again with --trainer <name>,slurm" >&2
  exit 2
fi
topoplan_check_filled() {{  # every #SBATCH line and named variable must be free of {FILL}
  local line v bad=0
  while IFS= read -r line; do
    case "$line" in
      "#SBATCH"*{FILL}*) echo "topoplan: $0: '$line': replace the {FILL} value (or delete the line to use your site's default; sbatch command-line options do not clear this check)" >&2; bad=1 ;;
    esac
  done < "$0"
  for v in "$@"; do
    case "${{!v}}" in
      *{FILL}*) echo "topoplan: $v=${{!v}}: fill it in (edit slurm/sbatch.sh or export it before sbatch)" >&2; bad=1 ;;
    esac
  done
  if [ "$bad" != 0 ]; then exit 2; fi
}}
# shellcheck disable=SC2086
topoplan_check_filled {common} $need{unset_homes}
export TOPOPLAN_DIR="${{TOPOPLAN_DIR:-${{SLURM_SUBMIT_DIR:-$PWD}}}}"
export SLURM_HOSTFILE="$TOPOPLAN_DIR/slurm/hostfile" TOPOPLAN_PLACED="$TOPOPLAN_DIR/slurm"
{place_step(ctx)}
launcher="${{TOPOPLAN_LAUNCHER:-srun}}"
if {per_host_test('$TOPOPLAN_TRAINER')}; then launcher="${{TOPOPLAN_LAUNCHER:-node}}"; fi
export TOPOPLAN_LAUNCHER="$launcher"
srun_opts=(--kill-on-bad-exit=1)
if [ "$TOPOPLAN_CONTAINER_IMAGE" != none ]; then
  mounts="$TOPOPLAN_DIR:$TOPOPLAN_DIR"
  if [ "$TOPOPLAN_CONTAINER_MOUNTS" != none ]; then mounts="$mounts,$TOPOPLAN_CONTAINER_MOUNTS"; fi
  srun_opts+=(--container-image="$TOPOPLAN_CONTAINER_IMAGE" --container-mounts="$mounts")
fi
if [ "$launcher" = srun ]; then
  srun "${{srun_opts[@]}}" --ntasks={ctx.world} --distribution=arbitrary --cpu-bind=none bash "$TOPOPLAN_DIR/slurm/task.sh"
else
  srun "${{srun_opts[@]}}" --nodes={len(hosts)} --ntasks-per-node=1 bash "$TOPOPLAN_DIR/slurm/task.sh"
fi"""]
    return "\n".join(lines) + "\n"


def files(ctx: EmitContext) -> dict[str, str]:
    return {
        "slurm/hostfile": hostfile(ctx),
        "slurm/local_gpus": "".join(f"{g}\n" for g in ctx.local),
        "slurm/task.sh": task_script(ctx),
        "slurm/sbatch.sh": sbatch_script(ctx),
        "slurm/place.py": PLACE_CORE.read_text(),
        "slurm/shape.json": launch_shape_of(ctx).model_dump_json() + "\n",
        "slurm/domains.txt": "".join(f"{h} {d}\n" for h, d in host_domains(ctx.cluster).items()),
    }
