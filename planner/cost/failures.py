"""The failure model: interruption rates per component, read from ``planner/data/failure_rates.yaml``
(or a file of the same shape, ``--failure-rates FILE``), each with its published source.

A component's rate is per unit-hour, the unit being a GPU, a host (tray or node) or an NVLink switch
tray. From an observed count on a known fleet: ``rate = count / (units * hours)``; e.g. Llama 3's 268
GPU interruptions in 54 days on 16,384 H100 give 268 / (16,384 * 1,296) = 1.262e-5 per GPU-hour.
docs/resilience.md lists every figure with its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from planner.errors import InputError
from planner.io import read_yaml

RATES_FILE = Path(__file__).resolve().parents[1] / "data" / "failure_rates.yaml"
PER = ("gpu", "host", "switch_tray")
EFFECTS = ("hardware", "domain", "restart")
# The GPU generation the shipped rates were observed on; any other GPU carries them over.
OBSERVED_ON = {"llama3": "h100", "kokolis-rsc1": "a100", "kokolis-rsc2": "a100"}


@dataclass(frozen=True)
class Component:
    name: str
    per: str            # gpu | host | switch_tray
    effect: str         # hardware | domain | restart (failure_rates.yaml explains each)
    rate_per_hour: float
    assumed: bool = False


@dataclass(frozen=True)
class FailureModel:
    name: str
    description: str
    source: str                       # the citation text
    components: tuple[Component, ...]
    switch_trays_per_domain: dict
    defaults: dict

    def rate(self, per: str, effect: str | None = None) -> float:
        """Summed rate per unit-hour of the components counted ``per`` unit (of one effect)."""
        return sum(c.rate_per_hour for c in self.components
                   if c.per == per and (effect is None or c.effect == effect))

    def assumed(self) -> list[str]:
        return [c.name for c in self.components if c.assumed]


def _component(name: str, d: dict, fleet: dict, where: str) -> Component:
    per, effect = d.get("per"), d.get("effect")
    if per not in PER or effect not in EFFECTS:
        raise InputError(f"{where}: components.{name}: per must be one of {', '.join(PER)} and effect one of "
                         f"{', '.join(EFFECTS)}")
    if "rate_per_hour" in d:
        rate = float(d["rate_per_hour"])
    elif "count" in d:
        units = {"gpu": fleet.get("gpus"), "host": fleet.get("hosts"), "switch_tray": fleet.get("switch_trays")}[per]
        if not units or not fleet.get("hours"):
            raise InputError(f"{where}: components.{name}: a count needs fleet.{per}s and fleet.hours")
        rate = float(d["count"]) / (float(units) * float(fleet["hours"]))
    else:
        raise InputError(f"{where}: components.{name}: give rate_per_hour or count")
    if rate < 0:
        raise InputError(f"{where}: components.{name}: the rate must be >= 0")
    return Component(name, per, effect, rate, bool(d.get("assumed", False)))


@lru_cache(maxsize=16)
def _read(path: str) -> dict:
    try:
        doc = read_yaml(Path(path).read_text()) or {}   # libyaml where present
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"--failure-rates {path}: cannot read it ({exc.__class__.__name__}); give a YAML file "
                         "shaped like planner/data/failure_rates.yaml") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sets"), dict):
        raise InputError(f"--failure-rates {path}: no 'sets' mapping; shape it like planner/data/failure_rates.yaml")
    return doc


def load_failure_model(name_or_path: str | None = None) -> FailureModel:
    """A rate set by name (``llama3``, ``kokolis-rsc1``, ``kokolis-rsc2``; None = the default) from the
    shipped file, or the default set of a YAML file of the same shape. InputError names the fault."""
    path, name = str(RATES_FILE), name_or_path
    if name_or_path and (name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).is_file()):
        path, name = name_or_path, None
    doc = _read(path)
    shipped = _read(str(RATES_FILE))
    name = name or doc.get("default") or next(iter(doc["sets"]))
    if name not in doc["sets"]:
        raise InputError(f"--failure-rates {name!r}: unknown rate set; use one of {', '.join(doc['sets'])} "
                         "or a YAML file")
    s = doc["sets"][name]
    where = f"{path} sets.{name}"
    comps = tuple(_component(k, v or {}, s.get("fleet") or {}, where) for k, v in (s.get("components") or {}).items())
    if not comps:
        raise InputError(f"{where}: no components")
    sources = {**shipped.get("sources", {}), **doc.get("sources", {})}
    return FailureModel(name, s.get("description", ""), sources.get(s.get("source"), s.get("source", "")), comps,
                        dict(doc["switch_trays_per_domain"] if "switch_trays_per_domain" in doc
                             else shipped.get("switch_trays_per_domain") or {}),
                        {**shipped.get("defaults", {}), **(doc.get("defaults") or {})})


def carried_over(model: FailureModel, gpu_name: str) -> bool:
    """True when the rates were observed on another GPU generation than ``gpu_name`` (or unknown)."""
    return OBSERVED_ON.get(model.name) != gpu_name.lower()
