"""MaxText 0.2.5's mesh rules, re-stated as an independent oracle (MaxText 0.2.5
src/maxtext/utils/max_utils.py fill_unspecified_mesh_axes, configs/types.py MaxTextConfig).

The real loader (maxtext.configs.pyconfig) needs Python 3.12 and jax; these are the rules it applies
to the mesh: max_utils.fill_unspecified_mesh_axes and MaxTextConfig's DCN check.
"""

from __future__ import annotations

import math


def maxtext_mesh_errors(o: dict, devices: int) -> list[str]:
    """MaxText 0.2.5's rules (max_utils.fill_unspecified_mesh_axes, MaxTextConfig), re-stated."""
    errs = []
    ici = [v for k, v in o.items() if k.startswith("ici_")]
    dcn = [v for k, v in o.items() if k.startswith("dcn_")]
    slices = o["num_slices"]
    per_slice = devices // slices
    for name, group, target in (("ICI", ici, per_slice), ("DCN", dcn, slices)):
        if sum(1 for v in group if v == -1) > 1:
            errs.append(f"more than one -1 in {name}")
        if math.prod(group) != target:
            errs.append(f"{name} product {math.prod(group)} != {target}")
    if math.prod(dcn) > 1 and slices == 1:
        errs.append("DCN parallelism requested but only one slice available")
    return errs
