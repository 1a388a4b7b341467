"""Read what DeepEP's normal-kernel tests print (deepseek-ai/DeepEP tests/legacy/test_intranode.py and
tests/legacy/test_internode.py; before the V2 release, tests/test_intranode.py and test_internode.py).

Rank 0 prints the setup and, after tuning, the best dispatch and combine (f-strings of the current tests;
the older releases print the same without the times):

    [config] num_tokens={num_tokens}, hidden={hidden}, num_topk={num_topk}                       (intranode)
    [config] num_tokens={..}, hidden={..}, num_topk_groups={..}, num_topk={..}                    (internode)
    [tuning] Best dispatch ({"FP8"|"BF16"}): SMs {s}, NVL chunk {c}, {nvl:.2f} GB/s (NVL), t: {t:.2f} us
    [tuning] Best combine: SMs {s}, NVL chunk {c}: {nvl:.2f} GB/s (NVL), t: {t:.2f} us
    [tuning] Best dispatch ({"FP8"|"BF16"}): SMs {s}, NVL chunk {c}, RDMA chunk {r}: {notify:.0f} + {t:.0f} us,
             {rdma:.2f} GB/s (RDMA), {nvl:.2f} GB/s (NVL)
    [tuning] Best combine: SMs {s}, NVL chunk {c}, RDMA chunk {r}, {notify:.2f} + {t:.2f} us,
             {rdma:.2f} GB/s (RDMA), {nvl:.2f} GB/s (NVL)

The NVL figure is the bytes a rank receives (``recv_x``) over the kernel time; the RDMA figure is the
tokens a rank sends to RDMA ranks (its own node included) times hidden over the same time; FP8 counts
1 + 4/128 bytes per element, BF16 2 (``fp8_factor``). The tests do not print the number of ranks
(``--num-processes``, and ``WORLD_SIZE`` nodes of 8 for internode) nor the number of experts
(``--num-experts``, 256 by default): the caller gives them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from topologies.errors import InputError

__all__ = ["DeepEPResult", "parse_deepep", "read_deepep", "looks_like_deepep"]

_CONFIG = re.compile(r"\[config\] num_tokens=(\d+), hidden=(\d+), (?:num_topk_groups=(\d+), )?num_topk=(\d+)")
_DISPATCH = re.compile(
    r"\[tuning\] Best dispatch \((FP8|BF16)\): SMs (\d+), NVL chunk (\d+)(?:, RDMA chunk (\d+))?[:,] "
    r"(?:([\d.]+) \+ ([\d.]+) us, )?(?:([\d.]+) GB/s \(RDMA\), )?([\d.]+) GB/s \(NVL\)(?:, t: ([\d.]+) us)?")
_COMBINE = re.compile(
    r"\[tuning\] Best combine: SMs (\d+), NVL chunk (\d+)(?:, RDMA chunk (\d+))?[:,] "
    r"(?:([\d.]+) \+ ([\d.]+) us, )?(?:([\d.]+) GB/s \(RDMA\), )?([\d.]+) GB/s \(NVL\)(?:, t: ([\d.]+) us)?")


@dataclass(frozen=True)
class DeepEPResult:
    path: str
    line: int
    phase: str            # "dispatch" or "combine"
    dtype: str            # "FP8" or "BF16" (combine: BF16)
    internode: bool
    tokens: int
    hidden: int
    topk: int
    topk_groups: int | None   # internode: the node groups a token may reach
    sms: int
    nvl_gbps: float
    rdma_gbps: float | None
    time_us: float | None     # the kernel time, when printed

    @property
    def element_bytes(self) -> float:
        return 1.0 + 4.0 / 128.0 if self.dtype == "FP8" else 2.0


def looks_like_deepep(text: str) -> bool:
    return "[tuning] Best dispatch" in text or "[tuning] Best combine" in text


def parse_deepep(text: str, path: str = "<text>") -> list[DeepEPResult]:
    """The best dispatch and combine results of each test in a DeepEP log."""
    out: list[DeepEPResult] = []
    config = None
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{lineno}"
        if (m := _CONFIG.search(line)):
            config = (int(m.group(1)), int(m.group(2)), int(m.group(4)), int(m.group(3)) if m.group(3) else None)
            continue
        if "[tuning] Best " not in line:
            continue
        m = _DISPATCH.search(line)
        c = None if m else _COMBINE.search(line)
        if not m and not c:
            raise InputError(f"{where}: a '[tuning] Best ...' line in a form DeepEP's tests do not print; "
                             "give the test's output unedited")
        if config is None:
            raise InputError(f"{where}: no '[config] num_tokens=..., hidden=..., num_topk=...' line before the "
                             "result; give the whole output of test_intranode.py / test_internode.py")
        tokens, hidden, topk, groups = config
        if m:
            dtype, sms, rdma_chunk = m.group(1), int(m.group(2)), m.group(4)
            t, rdma, nvl, t_intra = m.group(6), m.group(7), m.group(8), m.group(9)
            phase = "dispatch"
        else:
            dtype, sms, rdma_chunk = "BF16", int(c.group(1)), c.group(3)
            t, rdma, nvl, t_intra = c.group(5), c.group(6), c.group(7), c.group(8)
            phase = "combine"
        internode = rdma_chunk is not None
        if internode and rdma is None:
            raise InputError(f"{where}: an internode result without its RDMA bandwidth; give the output unedited")
        time = t if internode else t_intra
        out.append(DeepEPResult(
            path=path, line=lineno, phase=phase, dtype=dtype, internode=internode, tokens=tokens, hidden=hidden,
            topk=topk, topk_groups=groups, sms=sms, nvl_gbps=float(nvl),
            rdma_gbps=float(rdma) if rdma is not None else None, time_us=float(time) if time is not None else None,
        ))
    if not out:
        raise InputError(f"{path}: no '[tuning] Best dispatch/combine' lines; give the output of DeepEP's "
                         "test_intranode.py or test_internode.py")
    return out


def read_deepep(path: str | Path) -> list[DeepEPResult]:
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror or exc})") from None
    return parse_deepep(text, str(p))
