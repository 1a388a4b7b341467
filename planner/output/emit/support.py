"""Which trainer builds which model family: a family a trainer cannot build as its config says is refused
at emit, in one line naming the trainer, the family and what the trainer lacks (the files would train
a different model from the one planned).

Each trainer package's ``families`` part says what it cannot build (``planner.trainers.megatron.families``:
megatron-core 0.19, for Megatron-LM and Megatron-Bridge; ``planner.trainers.maxtext.families``;
``planner.trainers.torchtitan.families``, and its emitter refuses every family outside torchtitan's own list).
"""

from __future__ import annotations

from planner.errors import InputError
from planner.trainers import owner_of


def check_family(model, emitter: str, seq_len: int = 0) -> None:
    """InputError when trainer ``emitter`` cannot build ``model``'s family as its config says."""
    owner = owner_of(emitter)
    why = owner.cannot_build(model, seq_len) if owner is not None else None
    if why:
        title = owner.part("families").TITLES[emitter]
        raise InputError(f"--trainer {emitter}: {title} cannot build the {model.family} family "
                         f"({model.name}): {why}; its files would train a different model (plan without --emit, or emit "
                         f"for a trainer that builds it: docs/models.md)")
