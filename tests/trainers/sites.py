"""Helpers shared by the emitter tests: read the emitted files back the way a shell and Slurm would."""

from __future__ import annotations

import subprocess
from pathlib import Path


def bash_words(args_file: Path) -> list[str]:
    """The argv bash gives pretrain_gpt.py for ``eval "... $(cat args.txt)"`` (what slurm/task.sh does)."""
    script = 'eval "set -- $(cat "$1")"; printf "%s\\0" "$@"'
    out = subprocess.run(["bash", "-c", script, "bash", str(args_file)], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def srun_sites(out: Path) -> list[tuple[str, int]]:
    """(host, local GPU) of every global rank under ``srun --distribution=arbitrary``: Slurm starts
    task r on line r of slurm/hostfile; slurm/task.sh picks its GPU (LOCAL_RANK)."""
    hosts = (out / "slurm" / "hostfile").read_text().split()
    script = ('TOPOPLAN_SOURCE_ONLY=1 TOPOPLAN_DIR="$3" . "$1"; topoplan_load_placement; '
              'for ((r=0; r<$2; r++)); do topoplan_rank_env "$r"; echo "$RANK $LOCAL_RANK"; done')
    res = subprocess.run(["bash", "-c", script, "bash", str(out / "slurm" / "task.sh"), str(len(hosts)), str(out)],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    sites = []
    for r, line in enumerate(x for x in res if x):
        rank, local = map(int, line.split())
        assert rank == r
        sites.append((hosts[r], local))
    return sites


def torchrun_sites(out: Path, nproc: int) -> list[tuple[str, int]] | None:
    """(host, GPU) of every global rank under the torchrun launcher: task.sh on each host gives its
    fixed node rank and CUDA_VISIBLE_DEVICES; torchrun makes rank = node_rank * nproc + local_rank
    and local_rank i uses the i-th visible GPU. None when task.sh refuses torchrun for this plan."""
    hosts = list(dict.fromkeys((out / "slurm" / "hostfile").read_text().split()))
    task = out / "slurm" / "task.sh"
    sites: dict[int, tuple[str, int]] = {}
    for h in hosts:
        p = subprocess.run(["bash", str(task)], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "TOPOPLAN_DIR": str(out), "TOPOPLAN_LAUNCHER": "torchrun",
                                "TOPOPLAN_DRY_RUN": "1", "SLURMD_NODENAME": h})
        if p.returncode == 2:
            return None
        assert p.returncode == 0, p.stderr
        kv = dict(item.split("=", 1) for item in p.stdout.split())
        gpus = [int(x) for x in kv["CUDA_VISIBLE_DEVICES"].split(",")]
        assert len(gpus) == nproc
        for i, g in enumerate(gpus):
            sites[int(kv["NODE_RANK"]) * nproc + i] = (h, g)
    return [sites[r] for r in range(len(sites))]
