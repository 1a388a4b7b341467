"""Pipeline layouts: NVIDIA's DeepSeek-V3 recipes, Megatron's layout syntax (parser and the checks
megatron-core applies), round trips, and the balance against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InputError
from planner.model.spec import catalog, load_model
from planner.model.pipeline import (
    StageSpec,
    _split,
    compress_layout,
    layout_from_string,
    parse_layout,
    pipeline_layout,
)

DS = load_model("deepseek-v3")


def stages_of(layout) -> list[str]:
    return [s.symbols() for s in layout.stages]


# ----- NVIDIA's recipes (Megatron-Bridge 0.6.2 recipes/deepseek/h100/deepseek_v3.py and
# set_deepseek_v3_pipeline_model_parallel_layout layout_map) -----------------------------------

def test_deepseek_pp8_matches_the_h100_recipe_string():
    # 256xH100 recipe: --pipeline-model-parallel-layout "Et*8|(t*8|)*6t*5mL"
    lay = pipeline_layout(DS, pp=8)
    assert lay.megatron_layout() == "Et*8|(t*8|)*6t*5mL"
    assert stages_of(lay) == ["E" + "t" * 8] + ["t" * 8] * 6 + ["t" * 5 + "mL"]


def test_deepseek_pp4_vpp4_matches_the_gb200_recipe():
    # GB200 recipe (4,4) map: [E+t*4]+[t*4]*14+[t,m,L]
    lay = pipeline_layout(DS, pp=4, vpp=4)
    assert stages_of(lay) == ["Etttt"] + ["tttt"] * 14 + ["tmL"]
    assert lay.megatron_layout() == "Et*4|(t*4|)*14tmL"


def test_deepseek_pp8_vpp4_matches_the_1024_gpu_recipe_string():
    # 1024xH100 recipe: "Et|(tt|)*30mL"
    assert pipeline_layout(DS, pp=8, vpp=4).megatron_layout() == "Et|(tt|)*30mL"


@pytest.mark.parametrize(
    "pp, vpp, expected",
    [
        (4, 1, ["E" + "t" * 16, "t" * 16, "t" * 16, "t" * 13 + "mL"]),
        (4, 2, ["E" + "t" * 8] + ["t" * 8] * 6 + ["t" * 5 + "mL"]),
        (16, 1, ["Etttt"] + ["tttt"] * 14 + ["tmL"]),
        (8, 2, ["Etttt"] + ["tttt"] * 14 + ["tmL"]),
    ],
)
def test_deepseek_bridge_layout_map(pp, vpp, expected):
    assert stages_of(pipeline_layout(DS, pp=pp, vpp=vpp)) == expected


def test_stage_order_and_for_rank():
    lay = pipeline_layout(DS, pp=4, vpp=4)
    # stage v*pp + r is rank r's v-th chunk
    chunks = lay.for_rank(0)
    assert [c.embedding for c in chunks] == [True, False, False, False]
    assert chunks[1].layers == (16, 17, 18, 19)  # stage 4: after 4 + 3*4 = 16 layers
    last = lay.for_rank(3)[-1]
    assert last.loss and last.mtp == 1 and last.layers == (60,)
    assert lay.rank_of_layer(60) == 3 and lay.rank_of_layer(0) == 0
    assert lay.to_list()[-1] == ["decoder", "mtp", "loss"]
    with pytest.raises(ValueError):
        lay.for_rank(4)


# ----- Megatron's syntax --------------------------------------------------------------------

def test_parser_matches_megatron_docstring_examples():
    # megatron-core parse_str_to_list: "Ettt|(tt|)*29,m|L" -> [Ettt] + [tt]*29 + [m] + [L]
    assert parse_layout("Ettt|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    # its comment examples with layout letters: ab,(cd|)*2 -> abcd|cd| ; (|ab)*2,cd -> |ab|abcd
    assert parse_layout("Et,(tt|)*2") == ["Ettt", "tt", ""]
    assert parse_layout("(|tt)*2,mL") == ["", "tt", "ttmL"]
    assert parse_layout("Et*3|t*12L") == ["Ettt", "t" * 12 + "L"]
    with pytest.raises(InputError, match="invalid character"):
        parse_layout("Ex|L")


def test_layout_validation_mirrors_megatron():
    good = layout_from_string("Et*8|(t*8|)*6t*5mL", DS, pp=8)
    assert good == pipeline_layout(DS, pp=8)
    with pytest.raises(InputError, match="not a multiple of pp=8"):
        layout_from_string("Et*9|(t*9|)*5t*7mL", DS, pp=8)     # 7 stages
    with pytest.raises(InputError, match="has 60 decoder layers"):
        layout_from_string("Et*8|(t*8|)*6t*4mL", DS, pp=8)
    with pytest.raises(InputError, match="MTP layers m"):
        layout_from_string("Et*8|(t*8|)*6t*5L", DS, pp=8)
    with pytest.raises(InputError, match="before the MTP"):
        layout_from_string("Et*8|(t*8|)*6t*4mtL", DS, pp=8)
    with pytest.raises(InputError, match="last virtual stage"):
        layout_from_string("Et*61|m||L", DS, pp=2)               # m on rank 1, chunk 0 of 2
    with pytest.raises(InputError, match="embedding E"):
        layout_from_string("t*61mL", DS, pp=1)


def test_compress_layout_forms():
    assert compress_layout(["Ett", "tt", "tt", "tL"]) == "Ett|(tt|)*2tL"
    assert compress_layout(["E", "ttt", "ttt", "ttt"]) == "E|(t*3|)*2t*3"
    assert compress_layout(["Et", "t", "L"]) == "Et|t|L"
    assert compress_layout(["E", "", "", "tL"]) == "E|(|)*2tL"


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(catalog())), pp=st.integers(1, 16), vpp=st.sampled_from([1, 2, 3, 4, 8]))
def test_every_layout_round_trips_and_obeys_megatron(name, pp, vpp):
    if vpp > 1 and pp < 2:
        vpp = 1
    m = load_model(name)
    lay = pipeline_layout(m, pp, vpp)
    text = lay.megatron_layout()
    flat = "".join(parse_layout(text))
    assert flat.count("t") == m.num_layers and flat.count("m") == m.mtp_layers
    assert len(parse_layout(text)) == pp * vpp and len(parse_layout(text)) % pp == 0
    assert layout_from_string(text, m, pp) == lay
    # layers are contiguous and in order
    assert [i for s in lay.stages for i in s.layers] == list(range(m.num_layers))
    # balance: stage layer counts differ by at most a few (weights are near-uniform)
    counts = [s.num_layers for s in lay.stages]
    if m.num_layers >= pp * vpp > 1:
        assert max(counts[:-1]) - min(counts[:-1]) <= 2


def test_first_and_last_counts_are_honoured():
    lay = pipeline_layout(DS, pp=8, pp_first=6, pp_last=4)
    assert lay.stages[0].num_layers == 6 and lay.stages[-1].num_layers == 4
    assert sum(lay.layer_counts) == 61
    assert max(lay.layer_counts[1:-1]) - min(lay.layer_counts[1:-1]) <= 1
    with pytest.raises(InputError, match="pp_first"):
        pipeline_layout(DS, pp=8, pp_first=70)
    with pytest.raises(InputError, match="exceeds"):
        pipeline_layout(DS, pp=8, pp_first=40, pp_last=30)
    with pytest.raises(InputError, match="cannot hold"):
        pipeline_layout(DS, pp=2, pp_first=20, pp_last=20)
    with pytest.raises(InputError, match="vpp=2 needs pp >= 2"):
        pipeline_layout(DS, pp=1, vpp=2)
    assert pipeline_layout(DS, pp=1).stages == (StageSpec(layers=tuple(range(61)), embedding=True, loss=True, mtp=1),)


@settings(max_examples=50, deadline=None)
@given(
    w=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    stages=st.integers(2, 4),
    extra=st.integers(0, 12),
    pin=st.sampled_from([None, "first", "last", "both"]),
    data=st.data(),
)
def test_split_minimises_the_heaviest_stage_like_brute_force(w, stages, extra, pin, data):
    n = len(w)
    first = data.draw(st.integers(0, n)) if pin in ("first", "both") else None
    last = data.draw(st.integers(0, n - (first or 0))) if pin in ("last", "both") else None
    if stages == 2 and first is not None and last is not None and first + last != n:
        last = n - first

    def stage_costs(counts):
        out, a = [], 0
        for s, c in enumerate(counts):
            out.append(sum(w[a : a + c]) + (extra if s == stages - 1 else 0))
            a += c
        return out

    # brute force over every composition of n layers into `stages` (possibly empty) stages
    best_max, best_sq = None, None
    for cuts in itertools.combinations_with_replacement(range(n + 1), stages - 1):
        counts = [b - a for a, b in zip((0,) + cuts, cuts + (n,))]
        if (first is not None and counts[0] != first) or (last is not None and counts[-1] != last):
            continue
        c = stage_costs(counts)
        key = (max(c), sum(x * x for x in c))
        if best_max is None or key < (best_max, best_sq):
            best_max, best_sq = key
    got = _split(w, stages, extra, first, last)
    assert sum(got) == n
    assert first is None or got[0] == first
    assert last is None or got[-1] == last
    c = stage_costs(got)
    assert (max(c), sum(x * x for x in c)) == (best_max, best_sq)
