"""Write the fixtures of this folder (python tests/data/nccl/make_fixtures.py). See README.md for
where each figure comes from."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2]))

from nccl_format import deepep_internode, deepep_intranode, nccl_tests_output  # noqa: E402

SIZES = [32768, 1048576, 16777216, 134217728, 1073741824, 17179869184]
# tests/data/reference/hardware.md s2.2 (stas00/ml-engineering network/benchmarks), all-reduce busbw (GB/s) at SIZES
H200_NCCL_TESTS = [3.20, 72.45, 242.45, 411.21, 464.00, 480.70]      # 8x H200, nccl-tests, NCCL 2.30.7
B200_X32_RUN2 = [0.65, 12.47, 71.80, 260.50, 365.99, 376.71]         # 4x 8xB200 nodes, nccl-tests


def times(busbw: list[float], n: int) -> list[tuple[int, float]]:
    f = 2.0 * (n - 1) / n
    return [(s, s * f / (b * 1e9) * 1e6) for s, b in zip(SIZES, busbw)]


def deepep_rows():
    """DeepEP V1 H800 normal kernels (hardware.md s2.3): per EP size the README's (dispatch, combine)
    bandwidth, RDMA for internode, NVL for intranode; the other figure and the time follow from the
    bytes DeepEP's test counts for its routing (topologies.measured.deepep_bytes)."""
    from topologies.measured import deepep_bytes
    out = {}
    for ep, (disp, comb) in {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)}.items():
        nodes = max(1, ep // 8)
        res = {}
        for phase, bw, key in (("dispatch", disp, "dispatch_fp8"), ("combine", comb, "combine")):
            base = {"topk": 8, "hidden": 7168, "tokens": 4096, "domains": [8] * nodes if nodes > 1 else [8],
                    "version": "v1"}
            rdma_b = deepep_bytes({**base, "metric": "rdma"}, phase)[0]
            nvl_b = deepep_bytes({**base, "metric": "nvlink"}, phase)[0]
            if nodes == 1:
                res[key] = (bw, nvl_b / (bw * 1e9) * 1e6)
            else:
                t = rdma_b / (bw * 1e9)
                res[key] = (bw, nvl_b / t / 1e9, t * 1e6)
        out[ep] = res
    return out


def main() -> None:
    h200 = [("h200-node01", d, "NVIDIA H200") for d in range(8)]
    (HERE / "h200x8_all_reduce_perf.txt").write_text(
        nccl_tests_output("all_reduce", h200, times(H200_NCCL_TESTS, 8), new=True, nccl_code=23007))
    b200 = [(f"b200-{h:02d}", d, "NVIDIA B200") for h in range(1, 5) for d in range(8)]
    (HERE / "b200x32_all_reduce_perf.txt").write_text(
        nccl_tests_output("all_reduce", b200, times(B200_X32_RUN2, 32), new=False, mpi_prefix="[1,0]<stdout>:"))
    rows = deepep_rows()
    (HERE / "deepep_h800_intranode.log").write_text(deepep_intranode(4096, 7168, 8, rows[8]))
    (HERE / "deepep_h800_internode_ep16.log").write_text(deepep_internode(4096, 7168, 8, 2, rows[16], with_time=False))
    (HERE / "deepep_h800_internode_ep32.log").write_text(deepep_internode(4096, 7168, 8, 4, rows[32]))
    (HERE / "deepep_h800_internode_ep64.log").write_text(deepep_internode(4096, 7168, 8, 4, rows[64]))


if __name__ == "__main__":
    main()
