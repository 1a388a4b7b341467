"""The GPU catalog: one ``GPUSpec`` per GPU type, every figure with its source.

All compute peaks are **dense** (no 2:4 sparsity). Bandwidths are decimal (GB/s = 1e9 B/s).
``nvlink_gbps_uni`` is per GPU, **per direction** (NVLink4: 18 links x 25 GB/s = 450 GB/s uni =
900 GB/s bidirectional). ``nic_gbps`` is the scale-out line rate per GPU in **Gb/s** (bits).

HBM capacity: vendors write "80 GB", "141 GB", "288 GB"; ``nvidia-smi`` reports those parts as
81,559 MiB (H100) and 143,771 MiB (H200), i.e. the vendor figure is the usable capacity in GiB to
within 1%. ``hbm_gib`` therefore holds the vendor figure.

Besides the datasheet figures each spec carries the *achievable* bandwidths the collective model
uses (hardware.md section 2 and 6): the NCCL ring bus bandwidth inside an NVLink domain, the NVLink
SHARP (NVLS) all-reduce bus bandwidth, and the DeepEP expert all-to-all bandwidth over NVLink.

Sources (keys as in tests/data/reference/hardware.md, a copy of the team's notes that cites each figure):
  [stas-acc]  stas00/ml-engineering compute/accelerator/README.md (dense TFLOPS, memory tables)
  [stas-net]  stas00/ml-engineering network/README.md (NVLink table, measured busbw)
  [stas-bench] stas00/ml-engineering network/benchmarks (8x H200 all-reduce)
  [deepep]    deepseek-ai/DeepEP README.md (V2) and docs/legacy.md (V1, H800)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from topologies.errors import InputError

__all__ = ["GPUSpec", "GPUS", "ALIASES", "get_gpu", "PRECISION_PEAK"]

# Training precision -> which dense peak bounds its GEMMs.
# Microscaled (block-scaled) formats run on Blackwell's tensor cores only: Transformer Engine's
# check_mxfp8_support (transformer_engine/pytorch/fp8.py) returns "Device compute capability 10.0 or
# higher required for MXFP8 execution." below sm100; Hopper's FP8 GEMMs take per-tensor or per-block
# (fp8-block, DeepSeek-style 128x128) scales only.
MICROSCALED = frozenset({"mxfp8"})
MICROSCALED_MIN_SM = 100

PRECISION_PEAK = {
    "bf16": "bf16",
    "fp16": "bf16",
    "fp8": "fp8",
    "fp8-block": "fp8",
    "fp8-tensorwise": "fp8",
    "mxfp8": "fp8",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "fp4": "fp4",
}


class GPUSpec(BaseModel):
    """One GPU type. Every figure has an entry in ``sources`` naming where it comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="catalog key: h100, h200, h800, b200, b300, gb200, gb300")
    display: str = Field(description="marketing name, e.g. 'H100 SXM'")
    arch: str = Field(description="hopper | blackwell | blackwell-ultra")
    sm: int = Field(description="compute capability x10: 90, 100, 103")
    bf16_tflops: float = Field(description="dense BF16 peak, TFLOP/s")
    fp8_tflops: float = Field(description="dense FP8 peak, TFLOP/s")
    fp4_tflops: float | None = Field(description="dense FP4 peak, TFLOP/s; None where unsupported")
    hbm_gib: float = Field(description="HBM capacity, GiB (vendor figure, see module doc)")
    hbm_tbps: float = Field(description="HBM bandwidth, TB/s")
    nvlink_gen: int = Field(description="NVLink generation")
    nvlink_gbps_uni: float = Field(description="NVLink bandwidth per GPU, per direction, GB/s")
    nvlink_domain_max: int = Field(description="most GPUs in one NVLink domain: 8 (HGX) or 72 (NVL72)")
    gpus_per_node: int = Field(description="GPUs per host: 8 (HGX), 4 (NVL72 compute tray)")
    nic_gbps: float = Field(description="scale-out NIC line rate per GPU, Gb/s")
    # achievable figures used by the collective model (hardware.md sections 2 and 6)
    ring_busbw_gbps: float = Field(description="NCCL ring bus bandwidth inside an NVLink domain, GB/s")
    nvls_busbw_gbps: float | None = Field(description="NVLS all-reduce bus bandwidth, GB/s; None: no NVLS")
    deepep_nvlink_gbps: float = Field(description="DeepEP all-to-all bandwidth over NVLink, GB/s per GPU")
    host_link_gbps_uni: float = Field(description="GPU to host-memory link, per direction, GB/s (what CPU "
                                      "activation offload copies over): PCIe Gen5 x16 on HGX, NVLink-C2C on Grace")
    host_memory_gb: float = Field(description="host (CPU) memory of one node, GB: what Megatron's optimizer CPU "
                                  "offload keeps its state in (planner.cost.memory.host_bytes_per_param); DGX "
                                  "systems 2 TB, an NVL72 compute tray 2 Grace x 480 GB LPDDR5X")
    sources: dict[str, str] = Field(description="field -> source of the figure")

    def peak_tflops(self, precision: str) -> float:
        """Dense peak TFLOP/s for a training precision: bf16 -> BF16; fp8, fp8-block, mxfp8 -> FP8;
        nvfp4 -> FP4 (InputError on a GPU without FP4)."""
        kind = PRECISION_PEAK.get(precision.lower())
        if kind is None:
            raise InputError(
                f"unknown precision {precision!r}; use one of {', '.join(sorted(PRECISION_PEAK))}"
            )
        if kind == "bf16":
            return self.bf16_tflops
        if kind == "fp8":
            if precision.lower() in MICROSCALED and self.sm < MICROSCALED_MIN_SM:
                raise InputError(f"GPU {self.name} (sm{self.sm}) has no MXFP8 tensor cores (block-scaled FP8 needs "
                                 f"Blackwell, sm100+); use fp8 or fp8-block precision")
            return self.fp8_tflops
        if self.fp4_tflops is None:
            raise InputError(f"GPU {self.name} has no FP4 tensor cores; use bf16 or fp8 precision")
        return self.fp4_tflops

    @property
    def nic_gbytes(self) -> float:
        """Scale-out line rate per GPU in GB/s (bytes)."""
        return self.nic_gbps / 8.0


_HW = "hardware.md"   # tests/data/reference/hardware.md
_ACC = f"{_HW} s1, [stas-acc] TFLOPS table (w/o sparsity)"
_MEM = f"{_HW} s1, [stas-acc] memory table"
_NVL4 = f"{_HW} s1, [stas-net] NVLink table: NVLink4 18 links, 450 GB/s uni, 900 bidir"
_NVL5 = f"{_HW} s1, [stas-net] NVLink table: NVLink5 18 links, 900 GB/s uni, 1800 bidir"
_RING4 = f"{_HW} s6.2: NCCL 18x20.6 = 370 GB/s; 367.6 GB/s measured on 8x H200 without SHARP"
_RING5 = f"{_HW} s6.2: NCCL 18x40.1 = 720 GB/s; 740.6 GB/s measured on 8x B200 at 4 GiB"
_NVLS4 = f"{_HW} s2.2: 8x H200 NVLS all-reduce 480.7-482.3 GB/s busbw at 16 GiB"
_NVLS5 = f"{_HW} s2.2: 8x B200 845.7 GB/s busbw at 16 GiB; GB200 MNNVL 811 GB/s"
_DEEPEP = (
    f"{_HW} s2.3: DeepEP NVLink all-to-all reaches 0.78 of NVLink uni bandwidth on both "
    "H800 (153-158 of ~200) and SM100 (643-740 of 900)"
)
_DEEPEP_ASSUMED = _DEEPEP + "; applied to this GPU as an assumption (no DeepEP measurement)"
# GPU <-> host memory (planner/cost/terms/offload.py); hardware.md has no figure, so the public specs:
_PCIE5 = ("PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b = 63 GB/s per direction, 64 nominal (PCI-SIG PCIe 5.0; "
          "NVIDIA H100/H200 datasheets: 'PCIe Gen5: 128 GB/s', both directions)")
_PCIE5_BW = _PCIE5 + ("; HGX Blackwell hosts are x86 servers with PCIe Gen5 CPUs (DGX B200: Xeon Platinum 8570), "
                      "so the host path is taken as Gen5 even where the GPU's own link is newer (assumption)")
_C2C = ("NVLink-C2C between Grace and the GPU: 900 GB/s bidirectional = 450 per direction (NVIDIA GB200 NVL72 / GB300 "
        "NVL72 product pages). One Grace (LPDDR5X up to 512 GB/s) serves two GPUs, so two GPUs offloading at once "
        "share its memory bandwidth: not modelled")
# Host memory per node (Megatron's optimizer CPU offload; planner.cost.memory). NVIDIA's system datasheets:
_DGX_MEM = ("NVIDIA DGX H100/H200 datasheet, 'System Memory: 2TB' (2 x Xeon Platinum 8480C); an HGX server of "
            "another vendor may hold less: set it in the catalog if so")
_DGX_MEM_B = ("NVIDIA DGX B200 / DGX B300 datasheets, 'System Memory: 2TB, configurable to 4TB': the base "
              "2 TB is taken")
_GRACE_MEM = ("NVIDIA GB200 NVL72 / GB300 NVL72 product pages, 'LPDDR5X: up to 17 TB' per rack = 480 GB per "
              "Grace x 36 Graces (NVIDIA Grace CPU datasheet: up to 480 GB LPDDR5X); a compute tray holds two "
              "Graces and four GPUs: 960 GB")


def _hopper(name, display, hbm, hbm_bw, nvl_uni, nic, src_extra, *, ring=370.0, nvls=490.0):
    return GPUSpec(
        name=name, display=display, arch="hopper", sm=90,
        bf16_tflops=989.0, fp8_tflops=1979.0, fp4_tflops=None,
        hbm_gib=hbm, hbm_tbps=hbm_bw, nvlink_gen=4, nvlink_gbps_uni=nvl_uni,
        nvlink_domain_max=8, gpus_per_node=8, nic_gbps=nic,
        ring_busbw_gbps=ring, nvls_busbw_gbps=nvls, deepep_nvlink_gbps=round(0.78 * nvl_uni, 1),
        host_link_gbps_uni=64.0, host_memory_gb=2000.0,
        sources={
            "bf16_tflops": _ACC, "fp8_tflops": _ACC, "fp4_tflops": f"{_HW} s1: Hopper has no FP4",
            "hbm_gib": _MEM, "hbm_tbps": _MEM, "nvlink_gbps_uni": _NVL4,
            "nvlink_domain_max": f"{_HW} s1: 8 (HGX)", "nic_gbps": f"{_HW} s1: CX7 400 Gb/s per GPU",
            "ring_busbw_gbps": _RING4, "nvls_busbw_gbps": _NVLS4, "deepep_nvlink_gbps": _DEEPEP_ASSUMED,
            "host_link_gbps_uni": _PCIE5, "host_memory_gb": _DGX_MEM,
            **src_extra,
        },
    )


_H800_NOTE = (
    f"{_HW} s1 footnote: no NVIDIA H800 datasheet; compute and memory assumed equal to H100 "
    "(third-party comparison: only NVLink and FP64 are cut)"
)

GPUS: dict[str, GPUSpec] = {
    "h100": _hopper("h100", "H100 SXM", 80.0, 3.35, 450.0, 400.0, {}),
    "h200": _hopper("h200", "H200 SXM", 141.0, 4.8, 450.0, 400.0, {}),
    "h800": _hopper(
        "h800", "H800 SXM", 80.0, 3.35, 200.0, 400.0,
        {
            "bf16_tflops": _H800_NOTE, "fp8_tflops": _H800_NOTE, "hbm_gib": _H800_NOTE,
            "hbm_tbps": _H800_NOTE,
            "nvlink_gbps_uni": f"{_HW} s1: NVLink4 cut to 400 GB/s bidir = 200 uni (philisun.com)",
            "ring_busbw_gbps": f"{_HW} s6.7: model H800 NVLink as ~160 GB/s effective ([deepep]: "
            "'~160 GB/s NVLink maximum bandwidth')",
            "nvls_busbw_gbps": "no NVLS measurement on H800; ring only (conservative)",
            "deepep_nvlink_gbps": f"{_HW} s2.3: DeepEP V1 intranode EP8 153/158 GB/s; 0.78 x 200 = 156",
            "host_memory_gb": "no NVIDIA H800 system datasheet; assumed as DGX H100: " + _DGX_MEM,
        },
        ring=160.0, nvls=None,
    ),
    "b200": GPUSpec(
        name="b200", display="B200 (HGX)", arch="blackwell", sm=100,
        bf16_tflops=2250.0, fp8_tflops=4500.0, fp4_tflops=9000.0,
        hbm_gib=180.0, hbm_tbps=8.0, nvlink_gen=5, nvlink_gbps_uni=900.0,
        nvlink_domain_max=8, gpus_per_node=8, nic_gbps=400.0,
        ring_busbw_gbps=720.0, nvls_busbw_gbps=880.0, deepep_nvlink_gbps=702.0,
        host_link_gbps_uni=64.0, host_memory_gb=2000.0,
        sources={
            "bf16_tflops": _ACC, "fp8_tflops": _ACC,
            "fp4_tflops": f"{_ACC}: FP4 9000 (NVFP4 listed as 10000). 9000 chosen: HGX B200 runs at 0.9x "
            "the GB200 clocks in BF16/FP8 (2250 vs 2500), and 0.9 x GB200's 10000 = 9000",
            "hbm_gib": f"{_MEM}: 180 GB usable (192 physical)", "hbm_tbps": _MEM,
            "nvlink_gbps_uni": _NVL5, "nvlink_domain_max": f"{_HW} s1: 8 (HGX)",
            "nic_gbps": f"{_HW} s1: CX7 400 Gb/s (DGX B200)", "ring_busbw_gbps": _RING5,
            "nvls_busbw_gbps": _NVLS5, "deepep_nvlink_gbps": _DEEPEP,
            "host_link_gbps_uni": _PCIE5_BW, "host_memory_gb": _DGX_MEM_B,
        },
    ),
    "b300": GPUSpec(
        name="b300", display="B300 (HGX, Blackwell Ultra)", arch="blackwell-ultra", sm=103,
        bf16_tflops=2250.0, fp8_tflops=4500.0, fp4_tflops=13125.0,
        hbm_gib=288.0, hbm_tbps=8.0, nvlink_gen=5, nvlink_gbps_uni=900.0,
        nvlink_domain_max=8, gpus_per_node=8, nic_gbps=800.0,
        ring_busbw_gbps=720.0, nvls_busbw_gbps=880.0, deepep_nvlink_gbps=702.0,
        host_link_gbps_uni=64.0, host_memory_gb=2000.0,
        sources={
            "bf16_tflops": _ACC, "fp8_tflops": _ACC,
            "fp4_tflops": f"{_HW} s1: sources disagree (13,125 glennklockwood; 14,000 Verda; 12,600 FP4 / "
            "15,000 NVFP4 [stas-acc]). 13,125 chosen: it is the only figure stated as dense for the HGX "
            "part, and HGX B300 runs its BF16/FP8 at 0.9x GB300 (2250 vs 2500), which predicts "
            "0.9 x 15,000 = 13,500 -- closest to 13,125 (15,000 is the GB300 figure)",
            "hbm_gib": f"{_MEM}: 288 GB HBM3e", "hbm_tbps": _MEM, "nvlink_gbps_uni": _NVL5,
            "nvlink_domain_max": f"{_HW} s1: 8 (HGX)", "nic_gbps": f"{_HW} s1: CX8 800 Gb/s",
            "ring_busbw_gbps": _RING5, "nvls_busbw_gbps": _NVLS5, "deepep_nvlink_gbps": _DEEPEP_ASSUMED,
            "host_link_gbps_uni": _PCIE5_BW, "host_memory_gb": _DGX_MEM_B,
        },
    ),
    "gb200": GPUSpec(
        name="gb200", display="GB200 (NVL72)", arch="blackwell", sm=100,
        bf16_tflops=2500.0, fp8_tflops=5000.0, fp4_tflops=10000.0,
        hbm_gib=186.0, hbm_tbps=8.0, nvlink_gen=5, nvlink_gbps_uni=900.0,
        nvlink_domain_max=72, gpus_per_node=4, nic_gbps=400.0,
        ring_busbw_gbps=720.0, nvls_busbw_gbps=880.0, deepep_nvlink_gbps=702.0,
        host_link_gbps_uni=450.0, host_memory_gb=960.0,
        sources={
            "bf16_tflops": _ACC + "; note 23: per chip", "fp8_tflops": _ACC, "fp4_tflops": _ACC,
            "hbm_gib": f"{_MEM}: 186 GB (13.4 TB per rack)", "hbm_tbps": _MEM, "nvlink_gbps_uni": _NVL5,
            "nvlink_domain_max": f"{_HW} s1: 72 (NVL72: 18 compute trays x 4 GPUs)",
            "nic_gbps": f"{_HW} s1: CX7 400 Gb/s (DGX GB200 RA: NDR 400 Gb/s IB)",
            "ring_busbw_gbps": _RING5, "nvls_busbw_gbps": _NVLS5, "deepep_nvlink_gbps": _DEEPEP,
            "host_link_gbps_uni": _C2C, "host_memory_gb": _GRACE_MEM,
        },
    ),
    "gb300": GPUSpec(
        name="gb300", display="GB300 (NVL72, Blackwell Ultra)", arch="blackwell-ultra", sm=103,
        bf16_tflops=2500.0, fp8_tflops=5000.0, fp4_tflops=15000.0,
        hbm_gib=288.0, hbm_tbps=8.0, nvlink_gen=5, nvlink_gbps_uni=900.0,
        nvlink_domain_max=72, gpus_per_node=4, nic_gbps=800.0,
        ring_busbw_gbps=720.0, nvls_busbw_gbps=880.0, deepep_nvlink_gbps=702.0,
        host_link_gbps_uni=450.0, host_memory_gb=960.0,
        sources={
            "bf16_tflops": _ACC + "; Verda rack BF16 180 PF / 72", "fp8_tflops": _ACC,
            "fp4_tflops": f"{_ACC}; rack 1,080 PF dense / 72 = 15,000 (vendordeep, Verda)",
            "hbm_gib": f"{_MEM}: 288 GB (~20 TB per rack)", "hbm_tbps": f"{_MEM}: 576 TB/s per rack / 72",
            "nvlink_gbps_uni": _NVL5, "nvlink_domain_max": f"{_HW} s1: 72 (NVL72)",
            "nic_gbps": f"{_HW} s1: CX8 800 Gb/s (72 CX8 per rack)",
            "ring_busbw_gbps": _RING5, "nvls_busbw_gbps": _NVLS5, "deepep_nvlink_gbps": _DEEPEP_ASSUMED,
            "host_link_gbps_uni": _C2C, "host_memory_gb": _GRACE_MEM,
        },
    ),
}

ALIASES: dict[str, str] = {}
for _key, _spec in GPUS.items():
    for _a in (_key, _spec.display, f"{_key}-sxm", f"{_key} sxm", f"{_key}sxm", f"{_key}-hgx",
               f"hgx-{_key}", f"dgx-{_key}", f"nvidia {_key}", f"nvidia-{_key}"):
        ALIASES[_a.lower()] = _key
for _key in ("gb200", "gb300"):
    for _a in (f"{_key}-nvl72", f"{_key} nvl72", f"{_key}nvl72"):
        ALIASES[_a] = _key
ALIASES.update({"h100-80gb": "h100", "h100 80gb hbm3": "h100", "h200-141gb": "h200", "b300-sxm6": "b300"})


def get_gpu(name: str) -> GPUSpec:
    """The spec for a GPU name or alias, case-insensitive: ``H100``, ``h100-sxm``, ``GB300``,
    ``gb200-nvl72``. InputError for an unknown name, listing the catalog."""
    key = ALIASES.get(str(name).strip().lower().replace("_", "-"))
    if key is None:
        key = ALIASES.get(str(name).strip().lower())
    if key is None:
        raise InputError(f"unknown GPU type {name!r}; use one of {', '.join(GPUS)}")
    return GPUS[key]
