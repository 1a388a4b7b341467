"""The GPU catalog against the spec table of tests/data/reference/hardware.md (section 1: NVIDIA datasheet
figures as tabulated in stas00/ml-engineering compute/accelerator/README.md and network/README.md)."""

import re
from pathlib import Path

import pytest

from planner.errors import InputError
from topologies.gpus import GPUS, get_gpu

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "reference" / "hardware.md"


def _num(cell: str) -> float | None:
    m = re.search(r"(?<![A-Za-z\d])(\d[\d,]*(?:\.\d+)?)", cell)
    return float(m.group(1).replace(",", "")) if m else None


def _spec_table() -> dict[str, list[str]]:
    text = REF.read_text()
    section = text.split("## 1.", 1)[1].split("## 2.", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| GPU") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[get_gpu(cells[0].split()[0]).name] = cells
    return rows


def test_every_catalog_gpu_is_in_the_reference_table():
    rows = _spec_table()
    assert set(rows) == set(GPUS) == {"h100", "h200", "h800", "b200", "b300", "gb200", "gb300"}


@pytest.mark.parametrize("key", sorted(GPUS))
def test_figures_match_reference(key):
    cells = _spec_table()[key]
    spec = GPUS[key]
    assert spec.bf16_tflops == _num(cells[1])
    assert spec.fp8_tflops == _num(cells[2])
    fp4 = _num(cells[3])
    assert spec.fp4_tflops == fp4  # None for Hopper ("none"); B200/B300: the first figure listed
    assert spec.hbm_gib == _num(cells[4])
    assert spec.hbm_tbps == _num(cells[5])
    nvl = cells[6]
    m = re.search(r"(\d[\d,]*)\s*(?:GB/s\s*)?uni", nvl)
    uni = float(m.group(1)) if m else _num(re.search(r"([\d.]+ TB/s bidir)", nvl).group(1)) * 1000 / 2
    assert spec.nvlink_gbps_uni == uni
    assert spec.nvlink_domain_max == _num(cells[7])
    assert spec.nic_gbps == _num(re.search(r"(\d+) Gb/s", cells[8]).group(1))


def test_every_figure_has_a_source():
    figures = ("bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_gib", "hbm_tbps", "nvlink_gbps_uni",
               "nvlink_domain_max", "nic_gbps", "ring_busbw_gbps", "nvls_busbw_gbps", "deepep_nvlink_gbps",
               "host_link_gbps_uni")
    for spec in GPUS.values():
        for f in figures:
            assert spec.sources.get(f), f"{spec.name}.{f} has no source"
    assert "13,125" in GPUS["b300"].sources["fp4_tflops"] and "chosen" in GPUS["b300"].sources["fp4_tflops"]


@pytest.mark.parametrize("alias,key", [
    ("H100", "h100"), ("H100 SXM", "h100"), ("h100-sxm", "h100"), ("H200", "h200"), ("B200", "b200"),
    ("B300", "b300"), ("GB200", "gb200"), ("GB300", "gb300"), ("gb300-nvl72", "gb300"), ("  h800 ", "h800"),
    ("DGX-B200", "b200"),
])
def test_aliases(alias, key):
    assert get_gpu(alias).name == key


def test_calibration_gpu_names_resolve():
    import csv

    cal = ROOT / "planner" / "data" / "profiles" / "calibration.csv"

    names = {row["gpu"] for row in csv.DictReader(cal.open())}
    assert names and all(get_gpu(n).name in GPUS for n in names)


def test_unknown_gpu():
    with pytest.raises(InputError, match="unknown GPU type 'a100'.*h100"):
        get_gpu("a100")


def test_peak_by_precision():
    b = get_gpu("b200")
    assert b.peak_tflops("bf16") == 2250
    assert b.peak_tflops("fp8") == b.peak_tflops("mxfp8") == b.peak_tflops("fp8-block") == 4500
    assert b.peak_tflops("nvfp4") == 9000
    with pytest.raises(InputError, match="no FP4"):
        get_gpu("h100").peak_tflops("nvfp4")
    # MXFP8 needs Blackwell's block-scaled tensor cores (Transformer Engine check_mxfp8_support: sm100+)
    for name, spec in GPUS.items():
        if spec.sm < 100:
            with pytest.raises(InputError, match="no MXFP8"):
                spec.peak_tflops("mxfp8")
            assert spec.peak_tflops("fp8-block") == spec.peak_tflops("fp8")
        else:
            assert spec.peak_tflops("mxfp8") == spec.peak_tflops("fp8")
    with pytest.raises(InputError, match="unknown precision"):
        b.peak_tflops("int3")


def test_achievable_below_spec():
    for s in GPUS.values():
        assert s.ring_busbw_gbps <= s.nvlink_gbps_uni
        assert s.deepep_nvlink_gbps < s.nvlink_gbps_uni
        # NVLS all-reduce busbw may exceed the uni rate (the switch reduces) but not 2(n-1)/n x uni
        if s.nvls_busbw_gbps:
            assert s.nvls_busbw_gbps <= 2 * s.nvlink_gbps_uni
