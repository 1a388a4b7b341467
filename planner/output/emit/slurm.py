"""Slurm launch files that put global rank r on the GPU the plan chose for it.

Megatron builds its groups from global ranks (order tp-cp-ep-dp-pp: TP groups are consecutive
ranks, then CP, then EP) and TorchTitan from its mesh ``[pp, dp_replicate, dp_shard, cp, tp]``, so the
rank -> GPU map alone decides which groups share an NVLink domain. Slurm's default ``block``
distribution follows its sorted node order, not the plan's, so the files pin it:

* ``slurm/hostfile``: line r is the host of global rank r; ``srun --distribution=arbitrary`` with
  ``SLURM_HOSTFILE`` starts task r (``SLURM_PROCID`` = r) on that host.
* ``slurm/task.sh``: run once per task; exports ``RANK``, ``LOCAL_RANK`` (the plan's GPU index on
  the host), ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and starts the trainer. With
  ``TOPOPLAN_LAUNCHER=torchrun`` it is run once per node instead and starts torchrun with a fixed
  ``--node-rank`` looked up from the host name (never rendezvous join order) and
  ``CUDA_VISIBLE_DEVICES`` ordered so that torchrun's local rank i is the plan's GPU.
* ``slurm/sbatch.sh``: the allocation (the plan's hosts) and the srun line.
"""

from __future__ import annotations

import shlex

from planner.output.emit import EmitContext

MASTER_PORT = 29500


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


def hostfile(ctx: EmitContext) -> str:
    return "".join(h + "\n" for h in ctx.hosts)


def task_script(ctx: EmitContext) -> str:
    blocks = node_blocks(ctx)
    hosts = ctx.host_order
    local = " ".join(str(x) for x in ctx.local)
    node_rank_cases = ""
    visible_cases = ""
    if blocks:
        node_rank_cases = "\n".join(f"    {shlex.quote(h)}) NODE_RANK={i}; GPUS={','.join(map(str, g))} ;;"
                                    for i, (h, g) in enumerate(blocks))
    torchrun_ok = "1" if blocks else "0"
    return f"""#!/usr/bin/env bash
# Per-task launcher written by topoplan for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()},
# {ctx.world} x {ctx.gpu}. Started by slurm/sbatch.sh; see docs/emitters.md.
#   srun (default):  one task per GPU; task SLURM_PROCID=r runs global rank r on host line r of
#                    slurm/hostfile and GPU LOCAL_GPU[r] of that host.
#   torchrun:        TOPOPLAN_LAUNCHER=torchrun, one task per node; fixed --node-rank per host.
# TOPOPLAN_TRAINER=megatron|torchtitan picks the command (megatron needs MEGATRON_LM=<checkout>).
# TOPOPLAN_DRY_RUN=1 prints the rank environment instead of starting the trainer.
set -euo pipefail
ROOT="${{TOPOPLAN_DIR:?set TOPOPLAN_DIR to the topoplan output directory}}"
WORLD={ctx.world}
NPROC_PER_NODE={ctx.gpus_per_node}
NNODES={len(hosts)}
MASTER_HOST={shlex.quote(ctx.hosts[0])}
LOCAL_GPU=({local})
TORCHRUN_OK={torchrun_ok}

topoplan_rank_env() {{  # sets RANK LOCAL_RANK for srun task $1 (SLURM_PROCID)
  RANK="$1"
  LOCAL_RANK="${{LOCAL_GPU[$RANK]}}"
}}

topoplan_node_env() {{  # sets NODE_RANK GPUS for host $1 (torchrun launcher)
  case "$1" in
{node_rank_cases}
    *) echo "topoplan: host $1 is not in this plan (or the plan is not made of whole-host rank blocks)" >&2; return 1 ;;
  esac
}}

trainer_cmd() {{
  case "${{TOPOPLAN_TRAINER:-megatron}}" in
    megatron) echo "$1 ${{MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}}/pretrain_gpt.py $(cat "$ROOT/megatron/args.txt")" ;;
    torchtitan) echo "$1 -m torchtitan.train $(sed -n 's/^python -m torchtitan.train //p' "$ROOT/torchtitan/command.txt")" ;;
    *) echo "topoplan: unknown TOPOPLAN_TRAINER=$TOPOPLAN_TRAINER" >&2; return 1 ;;
  esac
}}

main() {{
  export WORLD_SIZE="$WORLD" MASTER_ADDR="${{MASTER_ADDR:-$MASTER_HOST}}" MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"
  if [ -f "$ROOT/megatron/env.sh" ] && [ "${{TOPOPLAN_TRAINER:-megatron}}" = megatron ]; then
    # shellcheck disable=SC1091
    . "$ROOT/megatron/env.sh"
  fi
  export PYTHONPATH="$ROOT/torchtitan${{PYTHONPATH:+:$PYTHONPATH}}"
  if [ "${{TOPOPLAN_LAUNCHER:-srun}}" = torchrun ]; then
    [ "$TORCHRUN_OK" = 1 ] || {{ echo "topoplan: this plan's rank order is not whole-host blocks; use the srun launcher" >&2; exit 2; }}
    topoplan_node_env "${{SLURMD_NODENAME:-$(hostname -s)}}"
    export CUDA_VISIBLE_DEVICES="$GPUS"
    if [ "${{TOPOPLAN_DRY_RUN:-0}}" = 1 ]; then echo "NODE_RANK=$NODE_RANK CUDA_VISIBLE_DEVICES=$GPUS"; exit 0; fi
    cmd=$(trainer_cmd "torchrun --nnodes $NNODES --nproc-per-node $NPROC_PER_NODE --node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port $MASTER_PORT")
  else
    topoplan_rank_env "${{SLURM_PROCID:?run under srun}}"
    export RANK LOCAL_RANK
    if [ "${{TOPOPLAN_DRY_RUN:-0}}" = 1 ]; then echo "RANK=$RANK LOCAL_RANK=$LOCAL_RANK"; exit 0; fi
    cmd=$(trainer_cmd python)
  fi
  eval "exec $cmd"
}}

if [ "${{TOPOPLAN_SOURCE_ONLY:-0}}" != 1 ]; then
  main "$@"
fi
"""


def sbatch_script(ctx: EmitContext) -> str:
    hosts = ctx.host_order
    return f"""#!/usr/bin/env bash
# Slurm job written by topoplan for plan {ctx.index}: {ctx.model.name}, {ctx.config.short()},
# {ctx.world} x {ctx.gpu} on {len(hosts)} hosts. Submit from the output directory:
#   cd OUT && sbatch slurm/sbatch.sh            (TOPOPLAN_TRAINER=torchtitan for TorchTitan)
# Rank r runs on line r of slurm/hostfile (--distribution=arbitrary), so Megatron's and TorchTitan's
# groups land on the NVLink domains the plan chose.
#SBATCH --job-name=topoplan-{ctx.model.name}
#SBATCH --nodes={len(hosts)}
#SBATCH --ntasks={ctx.world}
#SBATCH --gpus-per-node={ctx.gpus_per_node}
#SBATCH --exclusive
#SBATCH --nodelist={",".join(hosts)}
set -euo pipefail
export TOPOPLAN_DIR="${{TOPOPLAN_DIR:-${{SLURM_SUBMIT_DIR:-$PWD}}}}"
export SLURM_HOSTFILE="$TOPOPLAN_DIR/slurm/hostfile"
if [ "${{TOPOPLAN_LAUNCHER:-srun}}" = torchrun ]; then
  srun --nodes={len(hosts)} --ntasks-per-node=1 --kill-on-bad-exit=1 bash "$TOPOPLAN_DIR/slurm/task.sh"
else
  srun --ntasks={ctx.world} --distribution=arbitrary --kill-on-bad-exit=1 --cpu-bind=none \\
    bash "$TOPOPLAN_DIR/slurm/task.sh"
fi
"""


def files(ctx: EmitContext) -> dict[str, str]:
    return {
        "slurm/hostfile": hostfile(ctx),
        "slurm/task.sh": task_script(ctx),
        "slurm/sbatch.sh": sbatch_script(ctx),
    }
