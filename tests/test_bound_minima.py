"""planner/search/bounds.py ``_layer_minima``: the least layer time per bound key, computed for every layer
key at once with numpy, equals a brute force over the program's own tables one key at a time (the
composition on numbers, ``compose.FLOAT``): the minimum over recompute, the dispatcher and every TP / CP
group shape, with the expert all-to-all at the key's EP shape."""

from __future__ import annotations

import pytest

from planner.config import Training
from planner.cost import compose as K
from planner.model.spec import load_model
from planner.search.bounds import _layer_minima
from planner.search.plan import program_for
from topologies.loader import load_cluster


def _brute(b) -> dict:
    src, P, vals = b._src, b.prog, b.vals
    tab = lambda n: P.nodes[n].values   # noqa: E731
    moe = "A" in src
    out: dict = {}
    for kind, t in src["per"].items():
        d = out.setdefault(kind, {})
        for lk, comp in tab(t["comp"]).items():
            tp_i, cp_i, ep_i, _, mbs_i, rc_i = lk
            sids = [s for s in b._shape_values(b.sh["ep"]) if b.shape(s).size == vals["ep"][ep_i]] if moe else [None]
            tp_all = [(v, tab(src["TPT1"])[k]) for k, v in tab(src["TPT"]).items() if k[:-1] == (cp_i, mbs_i, rc_i)]
            cp_all = [(v, tab(src["CPT1"])[k]) for k, v in tab(src["CPT"]).items() if k[:-1] == (tp_i, cp_i, mbs_i)]
            tp_x = K.exposed(K.FLOAT, min((v for v, _ in tp_all), default=0), min((w for _, w in tp_all), default=0),
                             tab(t["g3"])[lk])
            cp_x = K.exposed(K.FLOAT, min((v for v, _ in cp_all), default=0), min((w for _, w in cp_all), default=0),
                             tab(t["attn"])[lk])
            for sid in sids:
                key = lk[:5] if sid is None else lk[:5] + (sid,)
                if kind[0] != "moe":
                    cands = [K.layer_time(K.FLOAT, comp, (tp_x, cp_x), src["launch"])]
                else:
                    cands = []
                    for dsp in range(len(vals["dispatcher"])):
                        a = dict(tp=tp_i, cp=cp_i, mbs=mbs_i, dispatcher=dsp, recompute=rc_i)
                        ak = tuple(a[n] for n in src["avars"]) + (sid,)
                        a2a = K.exposed(K.FLOAT, tab(src["A"]).get(ak, 0), tab(src["A1"]).get(ak, 0), tab(t["wep"])[lk])
                        cands.append(K.layer_time(K.FLOAT, comp, (tp_x, a2a, cp_x), src["launch"]))
                d[key] = min(d.get(key, float("inf")), max(min(cands), 1))
    return out


@pytest.mark.parametrize("model_name,preset,gpus", [("qwen3-30b-a3b", "gb200-nvl72", 144),
                                                    ("llama3-8b", "dgx-h100", 16)])
def test_layer_minima_equal_brute_force(model_name, preset, gpus):
    model, cluster = load_model(model_name), load_cluster(preset, gpus=gpus)
    _, b = program_for(model, cluster, Training(seq_len=4096, global_batch=512, precision="bf16"))
    got, want = _layer_minima(b), _brute(b)
    assert got.keys() == want.keys()
    for kind in want:
        assert got[kind] == want[kind], kind
        assert all(type(v) is int for v in got[kind].values())
    if model.is_moe:   # the bound keys carry EP shapes inside and across NVLink domains
        assert len({k[-1] for k in got[next(iter(got))]}) > 1
