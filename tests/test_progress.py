"""The progress helper draws only for a person: never on a pipe, a file, or with --json."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest

from planner.cli import progress as pg


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_enabled_only_on_a_tty_without_json(monkeypatch):
    monkeypatch.delenv("TOPOPLAN_NO_PROGRESS", raising=False)
    assert pg.enabled(stream=_TTY()) is True
    assert pg.enabled(stream=io.StringIO()) is False
    assert pg.enabled(json_output=True, stream=_TTY()) is False
    monkeypatch.setenv("TOPOPLAN_NO_PROGRESS", "1")
    assert pg.enabled(stream=_TTY()) is False


def test_closed_stream_counts_as_no_tty():
    s = io.StringIO()
    s.close()
    assert pg.enabled(stream=s) is False


def test_silent_handle_prints_nothing_and_counts(capsys):
    # under pytest's capture stdout is not a TTY
    with pg.progress("sweeping", total=3) as bar:
        for _ in range(3):
            bar.advance()
        bar.update(description="done", completed=3)
    assert bar.completed == 3 and bar.description == "done"
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_track_yields_every_item_silently(capsys):
    assert list(pg.track(range(5), "layers")) == [0, 1, 2, 3, 4]
    assert list(pg.track((i for i in range(3)), "gen")) == [0, 1, 2]  # no len(): total unknown
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


_SCRIPT = textwrap.dedent("""
    import sys, time
    from planner.cli.progress import track
    json_flag = "--json" in sys.argv
    total = 0
    for i in track(range(4), "work", json_output=json_flag):
        total += i
    print('{"total": %d}' % total)
""")


def _run(args, **kw):
    env = {**os.environ, "COLUMNS": "80"}
    env.pop("TOPOPLAN_NO_PROGRESS", None)
    return subprocess.run([sys.executable, "-c", _SCRIPT, *args], env=env, **kw)


def test_pipe_gets_only_the_result():
    res = _run([], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert res.stdout == '{"total": 6}\n'
    assert res.stderr == ""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal (POSIX)")
@pytest.mark.parametrize("json_flag,expect_bar", [(False, True), (True, False)])
def test_terminal_shows_the_bar_unless_json(json_flag, expect_bar):
    """On a real pseudo-terminal the bar is drawn (on stderr) unless --json is given."""
    master, slave = os.openpty()
    try:
        res = _run(["--json"] if json_flag else [], stdin=slave, stdout=slave, stderr=slave, timeout=60)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert res.returncode == 0
    assert '{"total": 6}' in out
    # rich's live display hides the cursor with an escape sequence; a silent run writes none
    assert ("\x1b[?25l" in out) is expect_bar, repr(out[:300])


def _scale_on_pty(extra: list[str], stderr_on_pty: bool) -> tuple[int, str, str]:
    """Run ``topoplan scale`` with stdout on a pseudo-terminal and stderr on the same terminal or a pipe."""
    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "100"}
    env.pop("TOPOPLAN_NO_PROGRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "scale", "--model", "llama3-8b", "--cluster",
                             "dgx-h100", "--gpus", "8,16", "--gbs", "64", *extra],
                            stdin=slave, stdout=slave, stderr=slave if stderr_on_pty else subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    err = "" if stderr_on_pty else proc.stderr.read().decode("utf-8", "replace")
    code = proc.wait(timeout=600)
    return code, b"".join(chunks).decode("utf-8", "replace"), err


pty_only = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal (POSIX)")


@pty_only
@pytest.mark.slow
@pytest.mark.parametrize("json_flag", [True, False])
def test_scale_with_stderr_redirected_writes_no_bar_there(json_flag):
    """stdout on a terminal, stderr into a file or pipe: the log gets no escape codes."""
    code, out, err = _scale_on_pty(["--json"] if json_flag else [], stderr_on_pty=False)
    assert code == 0, err
    assert "\x1b[" not in err
    if json_flag:
        assert err == "" and '"rows"' in out


@pty_only
@pytest.mark.slow
@pytest.mark.parametrize("json_flag,expect_bar", [(False, True), (True, False)])
def test_scale_on_a_terminal_draws_the_bar_unless_json(json_flag, expect_bar):
    code, out, _ = _scale_on_pty(["--json"] if json_flag else [], stderr_on_pty=True)
    assert code == 0, out[-2000:]
    assert ("\x1b[?25l" in out) is expect_bar
