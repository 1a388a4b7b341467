"""Read what nccl-tests prints (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf,
sendrecv_perf), one node or many.

The format is the one in NVIDIA/nccl-tests src/util.cu (version 2.19.6) and, before Oct 2025, src/common.cu:

    "# nccl-tests version %s nccl-headers=%d nccl-library=%d"           (since 2.17.3; NCCL as 22807 = 2.28.7)
    "# Collective test starting: %s"                                     (the program name)
    "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d ..."
    "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"   (since 2.14.1: "[0x%02x]")
    "%12li  %12li  %8s  %6s  %6s"                          size (B), count (elements), type, redop, root
    "  %7s  %6s  %6s  %6g"                                 time (us), algbw, busbw (GB/s), #wrong: out-of-place,
                                                           then the same for in-place ("N/A" when not checked;
                                                           with -I 1 four more columns follow each)

Numbers are written by ``getFloatStr`` (%.2f, else %.1f, %.0f, %.1e to fit the width) or, before
2.17, %7.0f/%7.1f/%7.2f and %6.2f. The size column is ``max(sendBytes, expectedBytes)``: the per-rank
buffer for all_reduce and sendrecv, the whole gathered / scattered array for all_gather and
reduce_scatter, the bytes one rank sends for alltoall: the same conventions as
``topologies.collectives.Fabric``. ``algbw = size / time``; ``busbw = algbw x`` 2(n-1)/n (all_reduce),
(n-1)/n (all_gather, reduce_scatter, alltoall), 1 (sendrecv).

NCCL's own log lines (``NCCL_DEBUG=INFO``: "host:pid:tid [0] NCCL INFO NCCL version 2.21.5+cuda12.4")
and mpirun's "[1,0]<stdout>:" prefixes may be mixed in; they are read (the NCCL version) or skipped.
A file may hold several runs one after another (each starts with its header).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from topologies.errors import InputError

__all__ = ["NcclRow", "NcclRun", "parse_nccl_tests", "read_nccl_tests", "TESTS", "bus_factor", "looks_like_nccl_tests"]

# program name -> the Fabric collective it measures
TESTS = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all", "sendrecv": "p2p",
}

_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_VERSION_TESTS = re.compile(r"^# nccl-tests version (\S+) nccl-headers=(\d+) nccl-library=(\d+)")
_STARTING = re.compile(r"^# Collective test starting: (\S+)")
_NTHREAD = re.compile(r"^# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+)")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[([^\]]*)\]\s*(.*)$")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_ROW = re.compile(r"^\s*\d+\s+\d+\s")
_HEADER_SIZE = re.compile(r"^#\s+size\s+count\s+type\s+redop\s+root\s")


@dataclass(frozen=True)
class NcclRow:
    size: int            # bytes, nccl-tests' size column
    count: int
    dtype: str
    redop: str
    time_us: float       # out-of-place
    algbw: float         # GB/s
    busbw: float         # GB/s
    wrong: float | None  # None: "N/A" (run with -c 0)
    time_us_inplace: float | None
    busbw_inplace: float | None
    line: int            # 1-based line number in the file


@dataclass
class NcclRun:
    path: str
    test: str | None = None               # "all_reduce", ... (None until known)
    nccl_version: str | None = None
    tests_version: str | None = None
    nthreads: int | None = None
    ngpus: int | None = None
    ranks: list[tuple[int, str, int, str]] = field(default_factory=list)   # (rank, host, device, GPU name)
    rows: list[NcclRow] = field(default_factory=list)
    line: int = 0                         # where the run starts

    @property
    def hosts(self) -> list[str]:
        seen: list[str] = []
        for _, host, _, _ in self.ranks:
            if host not in seen:
                seen.append(host)
        return seen

    @property
    def kind(self) -> str:
        """The Fabric collective: all_reduce, all_gather, reduce_scatter, all_to_all or p2p."""
        return TESTS[self.test]


def bus_factor(test: str, n: int) -> float:
    """nccl-tests' busbw / algbw (src/*.cu ``*GetBw``)."""
    if test == "all_reduce":
        return 2.0 * (n - 1) / n
    if test == "sendrecv":
        return 1.0
    return (n - 1) / n


def _test_of(name: str) -> str | None:
    base = Path(name).name.lower()
    for key in sorted(TESTS, key=len, reverse=True):
        if key in base:
            return key
    return None


def _version(code: str) -> str:
    c = int(code)
    return f"{c // 10000}.{c // 100 % 100}.{c % 100}" if c >= 10000 else f"{c // 1000}.{c // 100 % 10}.{c % 100}"


def _number(tok: str, what: str, where: str) -> float:
    try:
        return float(tok)
    except ValueError:
        raise InputError(f"{where}: {what} {tok!r} is not a number; is this nccl-tests output, unedited?") from None


def looks_like_nccl_tests(text: str) -> bool:
    return bool(re.search(r"^(?:\[\d+,\d+\]<stdout>:)?#\s+(?:Rank\s+\d+\s+Group|size\s+count\s+type|nThread \d+)",
                          text, re.M))


def parse_nccl_tests(text: str, path: str = "<text>") -> list[NcclRun]:
    """The runs in one nccl-tests output; InputError naming ``path`` and the line when it cannot be read."""
    runs: list[NcclRun] = []
    run: NcclRun | None = None
    per_iter = False
    pending_nccl: str | None = None

    def new_run(lineno: int) -> NcclRun:
        r = NcclRun(path=path, line=lineno, nccl_version=pending_nccl)
        runs.append(r)
        return r

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _MPI_PREFIX.sub("", raw.rstrip("\r\n"))
        where = f"{path}:{lineno}"
        m = _NCCL_VERSION.search(line)
        if m and not line.startswith("# nccl-tests"):
            pending_nccl = m.group(1)
            if run is not None and run.nccl_version is None:
                run.nccl_version = pending_nccl
            continue
        if (m := _VERSION_TESTS.match(line)):
            run = new_run(lineno)
            run.tests_version, run.nccl_version = m.group(1), _version(m.group(3))
            continue
        if (m := _STARTING.match(line)):
            if run is None or run.test is not None or run.rows or run.ranks:
                run = new_run(lineno)
            run.test = _test_of(m.group(1))
            if run.test is None:
                raise InputError(f"{where}: test {m.group(1)!r} is not one topoplan fits; use all_reduce_perf, "
                                 "all_gather_perf, reduce_scatter_perf, alltoall_perf or sendrecv_perf")
            continue
        if (m := _NTHREAD.match(line)):
            if run is None or run.rows or run.ranks or run.nthreads is not None:
                run = new_run(lineno)
            run.nthreads, run.ngpus = int(m.group(1)), int(m.group(2))
            continue
        if (m := _RANK.match(line)):
            if run is None or run.rows:
                run = new_run(lineno)
            run.ranks.append((int(m.group(1)), m.group(4), int(m.group(5)), m.group(7).strip()))
            continue
        if _HEADER_SIZE.match(line):
            per_iter = "i_min" in line
            if run is None:
                run = new_run(lineno)
            continue
        if line.startswith("#") or not _ROW.match(line):
            continue
        if run is None:
            raise InputError(f"{where}: a result row before any nccl-tests header; give the whole output, "
                             "from '# nThread ...' on")
        tok = line.split()
        body = 8 if per_iter else 4
        if len(tok) < 5 + 2 * body:
            if len(tok) == 5 + body and len(line) > 84 and not line[52:84].strip():
                continue  # in-place only: writeBenchMarkLineNullBody's 32 blanks after the 52-column preamble
            raise InputError(f"{where}: a result row has {len(tok)} columns, nccl-tests prints {5 + 2 * body} "
                             "(size count type redop root, then time algbw busbw #wrong out-of-place and in-place)")
        oop, inp = tok[5:5 + body], tok[5 + body:5 + 2 * body]
        row = NcclRow(
            size=int(tok[0]), count=int(tok[1]), dtype=tok[2], redop=tok[3],
            time_us=_number(oop[0], "time", where), algbw=_number(oop[1], "algbw", where),
            busbw=_number(oop[2], "busbw", where),
            wrong=None if oop[3] == "N/A" else _number(oop[3], "#wrong", where),
            time_us_inplace=_number(inp[0], "time", where), busbw_inplace=_number(inp[2], "busbw", where),
            line=lineno,
        )
        run.rows.append(row)
    runs = [r for r in runs if r.rows or r.ranks]
    if not runs or not any(r.rows for r in runs):
        raise InputError(f"{path}: no nccl-tests result rows (size count type redop root time algbw busbw ...); "
                         "give the output of all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf "
                         "or sendrecv_perf")
    for r in runs:
        _finish(r, path)
    return [r for r in runs if r.rows]


def _finish(run: NcclRun, path: str) -> None:
    where = f"{path}:{run.line}"
    if not run.rows:
        return
    if not run.ranks:
        raise InputError(f"{where}: the run has no '#  Rank ... on HOST device D' lines; keep nccl-tests' device "
                         "list, it says which hosts and GPUs ran")
    n = len(run.ranks)
    if run.test is None:
        run.test = _test_of(path)
    if run.test is None:
        # older nccl-tests do not print the program name: tell the test by busbw / algbw
        r = max(run.rows, key=lambda x: x.size)
        ratio = r.busbw / r.algbw if r.algbw > 0 else 0.0
        close = [t for t in ("all_reduce", "sendrecv", "reduce_scatter")
                 if abs(bus_factor(t, n) - ratio) < 0.02 * ratio]
        if close and close[0] != "reduce_scatter":
            run.test = close[0]
        elif close and r.redop != "none":
            run.test = "reduce_scatter"
        else:
            raise InputError(f"{where}: cannot tell which nccl-tests program wrote this (no '# Collective test "
                             "starting:' line); put all_gather or alltoall in the file name")


def read_nccl_tests(path: str | Path) -> list[NcclRun]:
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror or exc})") from None
    return parse_nccl_tests(text, str(p))
