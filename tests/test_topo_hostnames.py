"""Host names Slurm and DNS cannot use are refused when a cluster file loads, in one line naming the
file, the field and the host. Oracle: RFC 1123 section 2.1 / RFC 952 written out as a regex here,
independently of topologies.cluster.host_name_problem."""

import re

import pytest
from cli_run import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InputError
from topologies.cluster import host_name_problem
from topologies.loader import load_cluster

LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
RFC1123 = re.compile(rf"^(?=.{{1,253}}$){LABEL}(?:\.{LABEL})*$")


def _load(tmp_path, host):
    p = tmp_path / "c.yaml"
    p.write_text(f'gpu: h100\nnodes:\n  - {{name: "ok-1"}}\n  - {{name: "{host}"}}\n', encoding="utf-8")
    return p


@pytest.mark.parametrize("host,why", [
    ("gpü-01", "non-ASCII character 'ü'"),
    ("node_01", "character '_'"),
    ("-node01", "starts or ends with a hyphen"),
    ("node01-", "starts or ends with a hyphen"),
    ("a" * 64, "label of 64 characters"),
    ("n1..cluster", "empty label"),
    ("n1:rack", "character ':'"),
])
def test_bad_host_refused_at_load(tmp_path, host, why):
    p = _load(tmp_path, host)
    with pytest.raises(InputError) as ei:
        load_cluster(str(p))
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and "nodes[1].name" in msg and repr(host) in msg and why in msg
    assert "\n" not in msg


@pytest.mark.parametrize("host", ["node01", "gb300-r01-t07", "n1.rack2.example.org", "1node", "a" * 63,
                                  ".".join(["a" * 63] * 3) + "." + "b" * 61])
def test_good_hosts_load(tmp_path, host):
    assert load_cluster(str(_load(tmp_path, host))).hosts()[1] == host


def test_cli_exit_2_one_line(tmp_path):
    p = _load(tmp_path, "gpü-01")
    r = run_cli("topology", "show", p)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {p}: ") and "'gpü-01'" in r.stderr


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab9-._ü"), min_size=1, max_size=12)
       | st.from_regex(RFC1123, fullmatch=True))
def test_agrees_with_the_rfc_regex(name):
    assert (host_name_problem(name) is None) == bool(RFC1123.match(name))
