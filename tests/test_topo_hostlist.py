"""Slurm hostlist expressions: expand/compress, against hand-written expansions and round trips."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies.hostlist import HostlistError, compress, expand


def test_expand_examples():
    assert expand("node[001-003,020],gpu-a[1-3]") == [
        "node001", "node002", "node003", "node020", "gpu-a1", "gpu-a2", "gpu-a3"]
    assert expand("dev[0-5]") == [f"dev{i}" for i in range(6)]
    assert expand("single") == ["single"]
    assert expand("r[1-2]-t[01-02]") == ["r1-t01", "r1-t02", "r2-t01", "r2-t02"]
    assert expand("ultraserver1-[0-17]") == [f"ultraserver1-{i}" for i in range(18)]
    assert expand(["a[1-2]", "b"]) == ["a1", "a2", "b"]
    assert expand("n[8-11]") == ["n8", "n9", "n10", "n11"]
    assert expand("n[098-101]") == ["n098", "n099", "n100", "n101"]
    assert expand("") == []


def test_compress_examples():
    assert compress(["n01", "n02", "n03", "n07"]) == "n[01-03,07]"
    assert compress(["gb300-r01-t01", "gb300-r01-t02"]) == "gb300-r01-t[01-02]"
    assert compress(["a", "b1", "b2", "b3"]) == "a,b[1-3]"
    assert compress(["x0", "x1"]) == "x0,x1"
    # order is kept: a decreasing run is not merged
    assert expand(compress(["n3", "n1", "n2"])) == ["n3", "n1", "n2"]


@pytest.mark.parametrize("bad", ["node[1-", "node1-3]", "n[3-1]", "n[a-b]", "n[1,,2]", "a,,b", "n[[1]]", "a b"])
def test_malformed(bad):
    with pytest.raises(HostlistError):
        expand(bad)


names = st.lists(
    st.tuples(st.sampled_from(["node", "gpu-a", "r01-t", "x"]), st.integers(0, 300), st.sampled_from([0, 3, 4]),
              st.sampled_from(["", "-ib"])).map(lambda t: f"{t[0]}{str(t[1]).zfill(t[2])}{t[3]}"),
    min_size=1, max_size=40, unique=True,
)


@settings(max_examples=60, deadline=None)
@given(names)
def test_round_trip(hosts):
    expr = compress(hosts)
    assert expand(expr) == hosts
    assert len(expr) <= len(",".join(hosts))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 500), st.integers(0, 60), st.sampled_from([1, 3, 4]))
def test_range_expand_count(lo, span, width):
    expr = f"n[{str(lo).zfill(width)}-{str(lo + span).zfill(width)}]"
    out = expand(expr)
    assert len(out) == span + 1
    assert [int(x[1:]) for x in out] == list(range(lo, lo + span + 1))
    plain = ",".join(out)
    expected = plain if span == 0 or len(plain) < len(expr) else expr   # the shorter form, brackets on ties
    assert compress(out) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab9-._[],", min_size=1, max_size=12))
def test_a_plain_name_is_expanded_as_the_general_path_expands_it(expr):
    """``expand``'s shortcut for a name without brackets or commas (every host of a cluster file) returns
    what the general path (``_expand_items``: split on commas, multiply out the ranges) returns, or the
    same refusal."""
    from topologies.hostlist import _expand_items

    def outcome(fn):
        try:
            return fn(expr)
        except HostlistError as exc:
            return str(exc)

    assert outcome(expand) == outcome(_expand_items)
