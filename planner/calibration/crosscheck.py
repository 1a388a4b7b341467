"""What a calibration changes elsewhere: reference predictions before and after (issue 21 item 4).

A fit to the rows of one GPU generation can move a parameter every generation shares (two H100 logs
once moved ``mem.elementwise`` from 1.43 to 3.92 and DeepSeek-V3 on 256 GB300 from 1,580 to 1,064
TFLOP/s). ``calibrate`` therefore predicts a fixed set of published runs, one or two per GPU type
(``REFERENCES``: rows of ``planner/data/profiles/calibration.csv`` by id, their published layouts),
with the profile it started from and the one it wrote, and flags every reference on a generation the
rows do not cover whose prediction moves by more than its uncertainty band (the band of the start
profile's prediction, ``planner.cost.uncertainty``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.calibration.validate import predict_case, read_rows, row_case
from planner.cost.profiles import CALIBRATION_CSV
from planner.errors import InputError

CALIBRATION = CALIBRATION_CSV
# id -> column overrides: the recipe as it ran (planner/data/published_recipes.yaml: mb234 runs eagerly)
REFERENCES: dict[str, dict] = {
    "mb229": {},                          # DeepSeek-V3, 256 GB300, MXFP8 (26.08)
    "mb202": {},                          # Qwen3-235B-A22B, 256 GB300, MXFP8
    "mb177": {},                          # Llama 3 70B, 64 GB200, FP8
    "mb285": {},                          # Qwen3-235B-A22B, 256 GB200, MXFP8
    "mb200": {},                          # Qwen3-30B-A3B, 8 B200, MXFP8
    "mb234": {"cuda_graphs": "false"},    # GPT-OSS-120B, 64 B300, MXFP8, eager recipe
    "mb201": {},                          # Qwen3-30B-A3B, 16 H100, FP8
    "mb196": {},                          # GPT-OSS-120B, 64 H100, BF16
}


@dataclass(frozen=True)
class Moved:
    id: str
    what: str            # "deepseek-v3 on 256 GB300 (TP1 PP2 ...)"
    arch: str
    before: float        # model TFLOP/s per GPU, start profile
    after: float         # the fitted profile
    band: float          # the start prediction's half-width (ln units)
    covered: bool        # a row of the fit is of this generation

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0

    @property
    def warn(self) -> bool:
        """Another generation's prediction moved by more than its band."""
        return not self.covered and abs(math.log(self.after / self.before)) > self.band

    def to_dict(self) -> dict:
        return {"id": self.id, "what": self.what, "arch": self.arch, "before_tflops_per_gpu": round(self.before, 1),
                "after_tflops_per_gpu": round(self.after, 1), "change_pct": round(100 * self.change, 2),
                "band_pct": round(100 * (math.exp(self.band) - 1), 1), "rows_of_this_generation": self.covered,
                "warning": self.warn}


def reference_rows() -> list[dict]:
    rows = {r["id"]: r for r in read_rows(CALIBRATION)}
    return [dict(rows[i], **extra) for i, extra in REFERENCES.items()]


def crosscheck(before, after, fitted_arches) -> list[Moved]:
    """Each reference predicted with ``before`` and ``after`` (profiles of the same trainer);
    ``fitted_arches``: the GPU generations of the calibration's rows. A reference whose recipe the profile's
    trainer refuses (a Megatron-only knob under MaxText: ``row_case`` raises) has no prediction to move and
    is left out."""
    out = []
    for row in reference_rows():
        try:
            case = row_case(row, before.name, str(CALIBRATION), profile=before)
        except InputError:
            continue
        a = predict_case(case, before)
        b = predict_case(row_case(row, after.name, str(CALIBRATION), profile=after), after)
        arch = case.cluster.gpu_spec.arch
        what = f"{row['model']} on {row['num_gpus']} {row['gpu']} ({a.config.short()})"
        out.append(Moved(row["id"], what, arch, a.tflops_per_gpu, b.tflops_per_gpu, a.band_half_width,
                         arch in fitted_arches))
    return out


def warning_lines(moved: list[Moved]) -> list[str]:
    """``warning: ...`` for each reference on another generation moved beyond its band."""
    return [f"warning: the fit moves {m.what}, a generation ({m.arch}) none of the rows ran on, from "
            f"{m.before:,.0f} to {m.after:,.0f} TFLOP/s per GPU ({100 * m.change:+.1f}%, beyond its "
            f"+-{100 * (math.exp(m.band) - 1):.0f}% band): a shared parameter moved; calibrate with "
            "--per-generation (the default) or add rows of that generation" for m in moved if m.warn]
