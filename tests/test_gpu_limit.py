"""Absurd GPU counts are refused before any per-GPU list is built: each preset connects at most the
endpoints of its fabric (a fat tree of its switches' ports), checked here by hand calculation."""

from __future__ import annotations

import pytest

from planner.cli import main
from topologies.errors import InputError
from topologies.presets import NDR_PORTS, PRESETS, XDR_PORTS, build_preset, fat_tree_endpoints


def test_fat_tree_endpoints_by_hand():
    # k-ary fat tree (Al-Fares et al. 2008): k^3/4 hosts with three layers, k^2/2 with two
    assert fat_tree_endpoints(4, 3) == 16          # the paper's k = 4 example: 16 hosts
    assert fat_tree_endpoints(48, 3) == 27_648     # the paper's k = 48 example: 27,648 hosts
    assert fat_tree_endpoints(64, 2, planes=8) == 16_384   # DeepSeek's 8-plane two-layer fabric
    assert (NDR_PORTS, XDR_PORTS) == (64, 144)


@pytest.mark.parametrize("name, expected", [("dgx-h100", 65_536), ("gb200-nvl72", 65_536), ("h800", 16_384),
                                            ("dgx-b300", 10_368), ("gb300-nvl72", 746_496)])
def test_each_preset_has_its_fabric_limit(name, expected):
    assert PRESETS[name].max_gpus == expected


def test_the_limit_itself_is_accepted_and_one_node_more_is_refused():
    p = PRESETS["h800"]
    assert build_preset("h800", gpus=p.max_gpus).num_gpus == p.max_gpus
    with pytest.raises(InputError, match=r"--gpus 16392: .*at most 16,384 GPUs"):
        build_preset("h800", gpus=p.max_gpus + 8)


@pytest.mark.parametrize("cmd", [
    ["plan", "--model", "deepseek-v3", "--cluster", "gb300-nvl72", "--precision", "mxfp8", "--gbs", "4096"],
    ["topology", "show", "dgx-h100"],
])
def test_the_cli_refuses_an_absurd_count_in_one_line(capsys, cmd):
    rc = main([*cmd, "--gpus", "100000000"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("error: --gpus 100000000: ") and "at most" in err[0]
