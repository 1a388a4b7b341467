"""The trainer registry: ``get_trainer(name)`` -> :class:`planner.trainers.base.Trainer`.

Each trainer is a package here (``megatron``, ``torchtitan``, ``maxtext``) holding its rules, recipe,
pricing regime, emitters, read-back and log parser; the rest of topoplan asks the Trainer object and
names no trainer (``tests/test_trainers.py`` counts the names left outside this package).
"""

from __future__ import annotations

from planner.errors import InputError
from planner.trainers import maxtext, megatron, torchtitan
from planner.trainers.base import Pricing, Search, Trainer

TRAINERS: dict[str, Trainer] = {t.name: t for t in (megatron.TRAINER, torchtitan.TRAINER, maxtext.TRAINER)}
NAMES: tuple[str, ...] = tuple(TRAINERS)
DEFAULT = megatron.TRAINER.name
# every emitter a trainer owns (--trainer / --emit names), and the trainer whose rules its files satisfy
EMITTER_OWNER: dict[str, Trainer] = {e: t for t in TRAINERS.values() for e in t.emitters}
EMITTER_ALIASES: dict[str, str] = {a: e for t in TRAINERS.values() for a, e in t.aliases.items()}

__all__ = ["DEFAULT", "EMITTER_ALIASES", "EMITTER_OWNER", "NAMES", "TRAINERS", "Pricing", "Search", "Trainer", "get_trainer",
           "owner_of"]


def get_trainer(name: str | Trainer | None = None) -> Trainer:
    """The trainer called ``name`` (None: the default, Megatron); InputError naming the choices."""
    if isinstance(name, Trainer):
        return name
    t = TRAINERS.get(name or DEFAULT)
    if t is None:
        raise InputError(f"unknown trainer {name!r}; use one of {', '.join(NAMES)}")
    return t


def owner_of(emitter: str) -> Trainer | None:
    """The trainer whose files emitter ``emitter`` writes (None: Slurm, k8s, which launch the others')."""
    return EMITTER_OWNER.get(emitter)
