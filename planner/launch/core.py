"""Place a plan's shape on the hosts a scheduler granted: the one implementation, standard library only.

This module imports nothing outside the Python standard library, on purpose: ``topoplan place`` uses
it, and the Slurm emitter copies its source verbatim into ``slurm/place.py`` so that a training image
without topoplan can run it at job start (``python3 slurm/place.py``; docs/launch.md). One
implementation, shipped twice; ``tests/test_launch_place.py`` checks that the copy is this file.

The shape (``planner.cost.shape.LaunchShape`` as JSON) asks for NVLink-domain slots, each ``hosts``
hosts of one domain. ``assign`` maps each slot to its own granted domain with at least that many
hosts: slots sorted by need (largest first) against domains sorted by granted hosts (largest first),
the i-th to the i-th. That greedy pairing is optimal for a ``>=`` check: if any injective map of
slots to domains fits, this one does (the k largest needs must meet k distinct domains holding at
least that many, and the sorted pairing gives each the largest left). ``tests/test_launch_place.py``
checks it against brute force. A slot is never split across domains; hosts inside a domain are taken
in name order. Rank r then runs on host ``slot_hosts[slot][host slot]``, GPU ``local``.
"""

from __future__ import annotations

import json
import os
import re
import sys

__all__ = ["Shortfall", "AllocationProblem", "assign", "hostfile_text", "read_pairs", "main"]


class Shortfall(Exception):
    """The allocation cannot hold the plan (exit 3)."""


class AllocationProblem(Exception):
    """The allocation is malformed: a host twice, a host without a domain (exit 2)."""


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _words(shape: dict) -> tuple[str, str]:
    return ("rack", "trays") if shape.get("multi_host_domains") else ("NVLink domain", "hosts")


def need_text(shape: dict) -> str:
    """What a slot holds, for messages: the widest domain-local group set, e.g. ``an EP32 group set``."""
    local = shape.get("local_axes") or {}
    if not local:
        return "the plan's NVLink-domain slot"
    axis, size = max(local.items(), key=lambda kv: (kv[1], kv[0]))
    return ("an " if axis[0] in "aeiou" else "a ") + f"{axis.upper()}{size} group set"


def group_domains(pairs) -> dict[str, list[str]]:
    """{domain: [hosts in name order]} of ``(host, domain)`` pairs; AllocationProblem on a repeated host."""
    seen: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for host, dom in pairs:
        if host in seen:
            raise AllocationProblem(f"host {host} is listed twice in the allocation")
        if dom is None or dom == "":
            raise AllocationProblem(f"host {host} has no NVLink domain: give it as 'HOST DOMAIN' or name a cluster file")
        seen[host] = dom
        out.setdefault(dom, []).append(host)
    for hosts in out.values():
        hosts.sort(key=_natural)
    return out


def assign(shape: dict, pairs) -> dict:
    """Map the shape's slots onto the granted ``(host, domain)`` pairs.

    Returns ``{"slots": [{"domain", "hosts"}], "hosts": [host of rank r], "local": [GPU of rank r],
    "unused": [granted hosts the plan does not use]}``. Raises Shortfall naming the domain and how
    many hosts it lacks when no slot-to-domain map fits."""
    domains = group_domains(pairs)
    slots = shape["slots"]
    need = sorted(range(len(slots)), key=lambda s: (-slots[s]["hosts"], s))
    have = sorted(domains, key=lambda d: (-len(domains[d]), _natural(d)))
    dom_word, host_word = _words(shape)
    if len(have) < len(need) and not shape.get("multi_host_domains"):
        raise Shortfall(f"the allocation grants {len(have)} hosts but the plan needs {len(need)} "
                        f"(each its own NVLink domain, holding {need_text(shape)}): ask for {len(need)} nodes")
    if len(have) < len(need):
        counts = "/".join(str(len(domains[d])) for d in have) or "none"
        raise Shortfall(f"the allocation spans {len(have)} {dom_word}s ({counts} {host_word}) but the plan needs "
                        f"{len(need)} ({'/'.join(str(slots[s]['hosts']) for s in need)} {host_word}, each holding "
                        f"{need_text(shape)}): ask for whole-{dom_word.split()[-1]} segments")
    chosen: dict[int, str] = {}
    for s, d in zip(need, have):
        want, got = slots[s]["hosts"], len(domains[d])
        if got < want:
            raise Shortfall(f"{dom_word} {d} holds {got} of the {want} {host_word} {need_text(shape)} needs "
                            f"(granted per {dom_word.split()[-1]}: "
                            f"{'/'.join(str(len(domains[x])) for x in have)}; the plan needs "
                            f"{len(need)} x {'/'.join(sorted({str(slots[t]['hosts']) for t in need}, key=int))})")
        chosen[s] = d
    slot_hosts = [domains[chosen[s]][:slots[s]["hosts"]] for s in range(len(slots))]
    hosts = [slot_hosts[s][h] for s, h, _ in shape["ranks"]]
    local = [g for _, _, g in shape["ranks"]]
    used = {h for hs in slot_hosts for h in hs}
    unused = sorted((h for hs in domains.values() for h in hs if h not in used), key=_natural)
    return {"slots": [{"domain": chosen[s], "hosts": slot_hosts[s]} for s in range(len(slots))],
            "hosts": hosts, "local": local, "unused": unused}


def hostfile_text(result: dict) -> str:
    """Line r: the host of global rank r (Slurm's ``SLURM_HOSTFILE`` for ``--distribution=arbitrary``)."""
    return "".join(h + "\n" for h in result["hosts"])


def read_pairs(text: str, where: str, table: dict | None = None) -> list[tuple[str, str | None]]:
    """``HOST [DOMAIN]`` lines (``#`` comments, blank lines skipped); a host without a domain takes
    ``table[host]`` when a table is given."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise AllocationProblem(f"{where}:{n}: {line.strip()!r}: expected 'HOST [DOMAIN]'")
        dom = words[1] if len(words) == 2 else (table or {}).get(words[0])
        out.append((words[0], dom))
    return out


def main(argv=None) -> int:
    """``python3 place.py SHAPE.json ALLOCATION [DOMAINS] HOSTFILE [LOCALFILE]``: the job-start entry.

    ALLOCATION holds ``HOST [DOMAIN]`` lines (``-`` = stdin); DOMAINS (optional, or ``-`` for none) a
    ``HOST DOMAIN`` table for hosts listed without one. Writes HOSTFILE (host of rank r on line r)
    and LOCALFILE (the local GPU of rank r on line r). Exit 3 with one line on a shortfall, 2 on bad input.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (4, 5):
        print("usage: place.py SHAPE.json ALLOCATION DOMAINS|- HOSTFILE [LOCALFILE]", file=sys.stderr)
        return 2
    shape_path, alloc_path, dom_path, out_path = args[:4]
    try:
        with open(shape_path) as f:
            shape = json.load(f)
        text = sys.stdin.read() if alloc_path == "-" else open(alloc_path).read()
        table = None
        if dom_path != "-":
            with open(dom_path) as f:
                table = dict(p for p in read_pairs(f.read(), dom_path) if p[1])
        result = assign(shape, read_pairs(text, alloc_path, table))
    except Shortfall as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (AllocationProblem, OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _write(out_path, hostfile_text(result))
    if len(args) == 5:
        _write(args[4], "".join(f"{g}\n" for g in result["local"]))
    return 0


def _write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file renamed into place)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
