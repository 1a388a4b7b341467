"""Write nccl-tests and DeepEP output exactly as the programs print it (the fixtures' writer).

nccl-tests: the printf formats of NVIDIA/nccl-tests src/util.cu (2.17 on, ``getFloatStr``) and, for the
older layout, src/common.cu before commit b4300cc (Feb 2025: "[0x%02x]" bus id, %7.0f/%7.1f/%7.2f time,
%6.2f bandwidths, %5g #wrong). DeepEP: the f-strings of tests/legacy/test_intranode.py and
test_internode.py (and their pre-V2 versions without the times). ``make_fixtures.py`` writes the files
in this folder with it; tests/test_fabric_calibrate.py writes synthetic runs with it.
"""

from __future__ import annotations


def c_printf(fmt: str, *args) -> str:
    """C printf for the conversions nccl-tests uses (%s %d %li %ld %g %f with width/precision)."""
    fmt = fmt.replace("%li", "%d").replace("%ld", "%d")
    return fmt % args


def get_float_str(value: float, width: int) -> str:
    """nccl-tests src/util.cu getFloatStr."""
    for spec in (f"%{width}.2f", f"%{width}.1f", f"%{width}.0f"):
        s = spec % value
        if len(s) <= width:
            return s
    return (f"%{width}.1e" if width >= 7 else f"%{width}.0e") % value


def _g(value: float, width: int) -> str:
    return f"%{width}g" % value


def bus_factor(test: str, n: int) -> float:
    return {"all_reduce": 2.0 * (n - 1) / n, "sendrecv": 1.0}.get(test, (n - 1) / n)


def nccl_tests_output(test: str, ranks: list[tuple[str, int, str]], rows: list[tuple[int, float]], *,
                      new: bool = True, nccl_code: int = 23007, dtype: str = "float", mpi_prefix: str = "",
                      program_line: bool = True) -> str:
    """``ranks``: (host, device, GPU name) per rank; ``rows``: (size in bytes, time in us). In-place
    columns repeat the out-of-place ones."""
    n = len(ranks)
    elt = {"float": 4, "half": 2, "bfloat16": 2}[dtype]
    redop = "none" if test in ("all_gather", "alltoall") else "sum"
    out: list[str] = []
    p = out.append
    sizes = [s for s, _ in rows]
    if new:
        p(c_printf("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", "2.17.6", nccl_code, nccl_code))
        if program_line:
            p(c_printf("# Collective test starting: %s\n", f"{test}_perf"))
        p(c_printf("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg "
                   "iters: %d validation: %d graph: %d unalign: %d\n", 1, 1, min(sizes), max(sizes), 2, "factor",
                   5, 20, 1, 1, 0, 0))
    else:
        p(c_printf("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg "
                   "iters: %d validation: %d graph: %d\n", 1, 1, min(sizes), max(sizes), 2, "factor", 5, 20, 1, 1, 0))
    p("#\n")
    p("# Using devices\n")
    for r, (host, dev, name) in enumerate(ranks):
        bus = 0x18 + 0x20 * dev
        if new:
            p(c_printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n",
                       r, 0, 41000 + r, host, dev, 0, bus, 0, name))
        else:
            p(c_printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s\n",
                       r, 0, 41000 + r, host, dev, bus, name))
    p("#\n")
    p(c_printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
               "", "", "", "", ""))
    if new:
        p(c_printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size", "count",
                   "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
                   0, ""))
        p(c_printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)",
                   "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", 0, ""))
    else:
        p(c_printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
                   "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"))
        p(c_printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "",
                   "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""))
    total = 0.0
    for size, t_us in rows:
        count = size // elt if test in ("all_reduce", "sendrecv") else size // elt // n
        algbw = size / 1e9 / (t_us * 1e-6)
        busbw = algbw * bus_factor(test, n)
        total += busbw
        line = c_printf("%12li  %12li  %8s  %6s  %6s", size, count, dtype, redop, "%6i" % -1)
        for _ in range(2):
            if new:
                line += c_printf("  %7s  %6s  %6s  %6g", get_float_str(t_us, 7), get_float_str(algbw, 6),
                                 get_float_str(busbw, 6), 0)
            else:
                ts = "%7.0f" % t_us if t_us >= 10000 else ("%7.1f" % t_us if t_us >= 100 else "%7.2f" % t_us)
                line += c_printf("  %7s  %6.2f  %6.2f  %5g", ts, algbw, busbw, 0)
        p(line + "\n")
    if new:
        p(c_printf("# %-20s : %d %s\n", "Out of bounds values", 0, "OK"))
        p(c_printf("# %-20s : %g %s\n", "Avg bus bandwidth", total / len(rows), ""))
        p("#\n")
        p(c_printf("# Collective test concluded: %s\n", f"{test}_perf"))
        p("#\n")
    else:
        p(c_printf("# Out of bounds values : %d %s\n", 0, "OK"))
        p(c_printf("# Avg bus bandwidth    : %g %s\n", total / len(rows), ""))
        p("#\n")
    text = "".join(out)
    if mpi_prefix:
        text = "".join(mpi_prefix + ln for ln in text.splitlines(keepends=True))
    return text


def deepep_intranode(tokens: int, hidden: int, topk: int, results: dict, *, with_time: bool = True) -> str:
    """``results``: {"dispatch_fp8": (GB/s NVL, t us), "dispatch_bf16": ..., "combine": ...}."""
    out = [f"[config] num_tokens={tokens}, hidden={hidden}, num_topk={topk}\n",
           "[layout] Kernel performance: 0.041 ms\n", "\n"]
    for key, label in (("dispatch_fp8", "FP8"), ("dispatch_bf16", "BF16")):
        if key not in results:
            continue
        nvl, t = results[key]
        out.append(f"[tuning] SMs 24, NVL chunk 4: {nvl * 0.9:.2f} GB/s (NVL), {t / 0.9:.2f} us\n")
        tail = f", t: {t:.2f} us" if with_time else ""
        out.append(f"[tuning] Best dispatch ({label}): SMs 24, NVL chunk 8, {nvl:.2f} GB/s (NVL){tail}\n")
        out.append("\n")
    nvl, t = results["combine"]
    tail = f", t: {t:.2f} us" if with_time else ""
    out.append(f"[tuning] Best combine: SMs 24, NVL chunk 8: {nvl:.2f} GB/s (NVL){tail}\n")
    out.append("\n")
    return "".join(out)


def deepep_internode(tokens: int, hidden: int, topk: int, groups: int, results: dict, *,
                     with_time: bool = True) -> str:
    """``results``: {"dispatch_fp8": (GB/s RDMA, GB/s NVL, t us), ..., "combine": (...)}."""
    out = ["Testing with seed 0 ...\n",
           f"[config] num_tokens={tokens}, hidden={hidden}, num_topk_groups={groups}, num_topk={topk}\n",
           "[layout] Kernel performance: 0.052 ms\n", "\n"]
    for key, label in (("dispatch_fp8", "FP8"), ("dispatch_bf16", "BF16")):
        if key not in results:
            continue
        rdma, nvl, t = results[key]
        times = f"0 + {t:.0f} us, " if with_time else ""
        out.append(f"[tuning] Best dispatch ({label}): SMs 24, NVL chunk 8, RDMA chunk 16: {times}"
                   f"{rdma:.2f} GB/s (RDMA), {nvl:.2f} GB/s (NVL)\n")
        out.append("\n")
    rdma, nvl, t = results["combine"]
    times = f"0.00 + {t:.2f} us, " if with_time else ""
    sep = "," if with_time else ":"
    out.append(f"[tuning] Best combine: SMs 24, NVL chunk 1, RDMA chunk 12{sep} {times}"
               f"{rdma:.2f} GB/s (RDMA), {nvl:.2f} GB/s (NVL)\n")
    out.append("\n")
    return "".join(out)
