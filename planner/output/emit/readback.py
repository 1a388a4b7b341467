"""Read emitted launch files back into a layout and a training setup: the inverse of the emitters.

Each trainer package that writes files it can read again has a ``readback`` part
(``planner.trainers.megatron.readback``: Megatron-LM's args.txt; ``planner.trainers.torchtitan.readback``:
TorchTitan's command.txt); this module holds what they share (a plain reading of ``--flag value...``
tokens, so that the product needs no trainer installed; the pipeline split back into pp/vpp/first/last)
and ``read_files``, which asks the trainer whose files a path holds. ``topoplan predict --from
megatron/args.txt`` prices what the files run.
"""

from __future__ import annotations

import re
from pathlib import Path

from planner.errors import InputError
from planner.model.pipeline import layout_from_string, pipeline_layout
from planner.trainers import TRAINERS, get_trainer


def parse_flags(args: list[str]) -> dict[str, list[str]]:
    """``--flag v1 v2 --other`` -> ``{"--flag": ["v1", "v2"], "--other": []}`` (the last one wins)."""
    out: dict[str, list[str]] = {}
    cur = None
    for tok in args:
        if tok.startswith("--") and not _is_number(tok):
            cur = tok
            out[cur] = []
        elif re.fullmatch(r"[a-z][a-z0-9-]*:[a-z0-9-]+", tok):
            cur = None   # a tyro subcommand such as activation-checkpoint:full (TorchTitan)
        elif cur is not None:
            out[cur].append(tok)
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _one(flags, flag, default=None, kind=str, source="args"):
    vals = flags.get(flag)
    if vals is None:
        return default
    if len(vals) != 1:
        raise InputError(f"{source}: {flag} takes one value, got {vals!r}")
    try:
        return kind(vals[0])
    except ValueError:
        raise InputError(f"{source}: {flag} {vals[0]!r} is not a valid {kind.__name__}") from None


def _pipeline(model, pp: int, text: str | None, seq_len: int, source: str):
    """(vpp, pp_first, pp_last) whose planned layout is exactly ``text`` (Megatron's layout string)."""
    if pp == 1 or not text:
        return 1, None, None
    given = layout_from_string(text, model, pp)
    vpp = given.num_stages // pp
    want = given.megatron_layout()
    counts = given.layer_counts
    for first, last in ((None, None), (counts[0], counts[-1]), (counts[0], None), (None, counts[-1])):
        try:
            if pipeline_layout(model, pp, vpp, first, last, seq_len=seq_len).megatron_layout() == want:
                return vpp, first, last
        except InputError:
            continue
    raise InputError(f"{source}: --pipeline-model-parallel-layout {text!r} is not a split topoplan's pipeline model "
                     f"makes (pp={pp}, vpp={vpp}); predict it with --pp/--vpp instead")


def _split_of(model, pp: int, counts: list[int], seq_len: int, source: str):
    """(vpp, pp_first, pp_last) whose planned layout has exactly these decoder layers per stage."""
    if len(counts) % pp:
        raise InputError(f"{source}: {len(counts)} pipeline stages do not divide over pp={pp} ranks")
    vpp = len(counts) // pp
    for first, last in ((None, None), (counts[0], counts[-1]), (counts[0], None), (None, counts[-1])):
        try:
            if list(pipeline_layout(model, pp, vpp, first, last, seq_len=seq_len).layer_counts) == counts:
                return vpp, first, last
        except InputError:
            continue
    raise InputError(f"{source}: the stage split {counts} is not one topoplan's pipeline model makes "
                     f"(pp={pp}, vpp={vpp})")


def read_files(path: Path, model, world: int | None = None, *, stack: str | None = None):
    """A trainer's emitted files -> (ParallelConfig, Training, order): the first trainer whose read-back
    claims ``path`` (``claims``: its file, or a directory holding it or the trainer's folder) reads it;
    anything else is read as Megatron's args.txt."""
    path = Path(path)
    for trainer in TRAINERS.values():
        if "readback" in trainer.parts and trainer.part("readback").claims(path):
            return trainer.read_back(path, model, world, stack=stack)
    return get_trainer().read_back(path, model, world, stack=stack)
