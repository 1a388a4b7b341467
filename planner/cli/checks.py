"""Sense checks of the training options of ``plan`` and ``predict``, before anything is solved.

- ``flag_message``: a pydantic error about a Training / ParallelConfig field, told with the option
  the user typed (``--precision 'fp9': use one of ...``), from the one table ``FLAGS``.
- ``check_flags``: the options alone (precision, trainer, a sequence too short to train on); raises
  InputError naming the option.
- ``input_warnings``: what is legal but probably not meant: a sequence longer than the model's
  context (``max_position_embeddings`` of its config), a global batch that no data-parallel degree
  above 1 divides (prime, or coprime with the GPU count), with a nearby value to try.
  ``warn`` prints them on stderr as ``warning: ...`` lines.
"""

from __future__ import annotations

import math
import sys

from pydantic import ValidationError

from planner.config import Training
from planner.errors import InputError
from planner.model.spec import load_model

__all__ = ["FLAGS", "MIN_SEQ_LEN", "flag_message", "check_flags", "input_warnings", "nearby_gbs", "warn",
           "check_inputs"]

# pydantic field -> the command-line option that sets it (plan, scale, predict)
FLAGS = {
    "seq_len": "--seq-len", "global_batch": "--gbs", "precision": "--precision", "stack": "--stack",
    "trainer": "--trainer", "cuda_graphs": "--cuda-graphs", "memory_headroom": "--memory-headroom",
    "tp": "--tp", "pp": "--pp", "vpp": "--vpp", "cp": "--cp", "ep": "--ep", "etp": "--etp", "dp": "--dp",
    "mbs": "--mbs", "fsdp": "--fsdp", "recompute": "--recompute", "dispatcher": "--dispatcher",
}

MIN_SEQ_LEN = 16  # below this a "training step" is all fixed cost; no recipe trains like that


def flag_message(exc) -> str:
    """One line from a pydantic ValidationError, naming the option (``FLAGS``) instead of the field."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())]
    field = loc[0] if loc else ""
    flag = FLAGS.get(field, f"field '{'.'.join(loc)}'" if loc else "options")
    msg = str(first.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if first.get("type") == "literal_error":
        expected = str((first.get("ctx") or {}).get("expected", "")).replace("'", "").replace(" or ", ", ")
        msg = f"use one of {expected}" if expected else msg
    value = first.get("input")
    shown = f" {value!r}" if field in FLAGS and value is not None and not isinstance(value, dict) else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{flag}{shown}: {msg[:1].lower() + msg[1:]}{more}"


def check_flags(*, precision: str | None = None, trainer: str | None = None, seq_len: int | None = None,
                gbs: int | None = None) -> None:
    """Refuse what cannot be meant, naming the option: an unknown precision or trainer, a sequence
    shorter than ``MIN_SEQ_LEN`` tokens."""
    if seq_len is not None and seq_len < MIN_SEQ_LEN:
        raise InputError(f"--seq-len {seq_len}: shorter than {MIN_SEQ_LEN} tokens, so a step is all fixed cost and "
                         "no recipe trains like that; give the training sequence length (e.g. 4096)")
    fields = {"global_batch": gbs or 1}
    if precision is not None:
        fields["precision"] = precision
    if trainer is not None:
        fields["trainer"] = trainer
    try:
        Training(**fields)
    except ValidationError as exc:
        raise InputError(flag_message(exc)) from None


def nearby_gbs(gbs: int, gpus: int | None) -> tuple[int, int]:
    """The multiples of a power of two just below and above ``gbs``: the power is the largest not
    above gbs / 4 (the suggestion stays within 25%), 256 at most, and divides the GPU count when known."""
    step = 1
    while step * 2 <= max(2, gbs // 4) and step * 2 <= 256 and (not gpus or gpus % (step * 2) == 0):
        step *= 2
    step = max(step, 2)
    lo = gbs // step * step
    return (lo if lo > 0 else step), lo + step


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, math.isqrt(n) + 1))


def input_warnings(model, *, seq_len: int | None, gbs: int | None = None, gpus: int | None = None,
                   gbs_range: str | None = None, range_flag: bool = True) -> list[str]:
    """Warnings (without the ``warning:`` prefix) about legal but doubtful options; see module doc."""
    out = []
    ctx = getattr(model, "max_position_embeddings", None)
    if seq_len and ctx and seq_len > ctx:
        out.append(f"--seq-len {seq_len} is beyond {model.name}'s context of {ctx} tokens (max_position_embeddings "
                   "in its config): it was not trained for that length (extend its RoPE scaling and train for "
                   "long context first); the estimate prices it anyway")
    if gbs and not gbs_range and gbs > 1:
        g = math.gcd(gbs, gpus) if gpus else None
        if _is_prime(gbs) or (gpus and gpus > 1 and g == 1):
            lo, hi = nearby_gbs(gbs, gpus)
            why = "is prime" if _is_prime(gbs) else f"shares no factor with the {gpus} GPUs"
            only = f"data parallelism 1 or {gbs}" if _is_prime(gbs) else "data parallelism 1"
            tail = f", or --gbs-range {lo}:{hi} to let the planner choose" if range_flag else ""
            out.append(f"--gbs {gbs} {why}: a global batch must split evenly into micro-batches on every "
                       f"data-parallel rank, so only {only} fits; try --gbs {lo} or {hi}{tail}")
    return out


def warn(lines: list[str]) -> None:
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


def check_inputs(model: str, *, precision: str | None = None, trainer: str | None = None, seq_len: int | None = None,
                 gbs: int | None = None, gpus: int | None = None, gbs_range: str | None = None,
                 range_flag: bool = True) -> list[str]:
    """``check_flags``, then the model's warnings printed on stderr (and returned): what ``plan`` and
    ``predict`` call before they build anything."""
    check_flags(precision=precision, trainer=trainer, seq_len=seq_len)
    lines = input_warnings(load_model(model), seq_len=seq_len, gbs=gbs, gpus=gpus, gbs_range=gbs_range,
                           range_flag=range_flag)
    warn(lines)
    return lines
