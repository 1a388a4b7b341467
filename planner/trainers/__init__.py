"""The trainer registry: ``get_trainer(name)`` -> :class:`planner.trainers.base.Trainer`.

Each trainer is a package here (``megatron``, ``torchtitan``, ``maxtext``) holding its rules, recipe,
pricing regime, emitters, read-back and log parser; the rest of topoplan asks the Trainer object and
names no trainer (``tests/test_trainers.py`` counts the names left outside this package).
"""

from __future__ import annotations

from planner.errors import InputError
from planner.trainers import maxtext, megatron, torchtitan
from planner.trainers.base import Launch, Pricing, Search, Trainer

TRAINERS: dict[str, Trainer] = {t.name: t for t in (megatron.TRAINER, torchtitan.TRAINER, maxtext.TRAINER)}
NAMES: tuple[str, ...] = tuple(TRAINERS)
DEFAULT = megatron.TRAINER.name
# every emitter a trainer owns (--trainer / --emit names), and the trainer whose rules its files satisfy
EMITTER_OWNER: dict[str, Trainer] = {e: t for t in TRAINERS.values() for e in t.emitters}
EMITTER_ALIASES: dict[str, str] = {a: e for t in TRAINERS.values() for a, e in t.aliases.items()}
# planner.config.Recipe's fields, each declared by the trainer package that owns the setting
RECIPE_FIELDS: dict = {k: v for t in TRAINERS.values() for k, v in t.recipe_fields.items()}
# every field as a trainer without that knob runs it: the start of each trainer's effective recipe
RECIPE_OFF: dict = {k: v for t in TRAINERS.values() for k, v in t.recipe_off.items()}
# how Slurm and Kubernetes start each emitter's files, in the order a default is picked
LAUNCH: dict[str, Launch] = {e: t.launch[e] for t in TRAINERS.values() for e in t.emitters}

__all__ = ["DEFAULT", "EMITTER_ALIASES", "EMITTER_OWNER", "LAUNCH", "NAMES", "RECIPE_FIELDS", "RECIPE_OFF",
           "TRAINERS", "Launch", "Pricing", "Search", "Trainer", "get_trainer", "needs_equal_slices", "owner_of"]


def get_trainer(name: str | Trainer | None = None) -> Trainer:
    """The trainer called ``name`` (None: the default, Megatron); InputError naming the choices."""
    if isinstance(name, Trainer):
        return name
    t = TRAINERS.get(name or DEFAULT)
    if t is None:
        raise InputError(f"unknown trainer {name!r}; use one of {', '.join(NAMES)}")
    return t


def needs_equal_slices(trainer: str, emitters: list[str]) -> bool:
    """Whether the plan must give every NVLink domain the same GPUs: its trainer, or a trainer whose files
    are emitted with it (``all``: every trainer), runs on equal slices (``Search.equal_slices``)."""
    runs = [get_trainer(trainer)] + [t for e in emitters if (t := owner_of(e)) is not None]
    if "all" in emitters:
        runs += list(TRAINERS.values())
    return any(t.search.equal_slices for t in runs)


def owner_of(emitter: str) -> Trainer | None:
    """The trainer whose files emitter ``emitter`` writes (None: Slurm, k8s, which launch the others')."""
    return EMITTER_OWNER.get(emitter)
