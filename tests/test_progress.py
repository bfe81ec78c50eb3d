"""spade_jax.progress: tqdm on a terminal, a few plain lines in a log, nothing when disabled."""

import io

import pytest

from spade_jax import progress
from spade_jax.progress import format_elapsed, progress_bar


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_log_stream_gets_few_plain_lines_with_postfix_and_a_done_line(clock):
    out = io.StringIO()
    with progress_bar(600, "bootstrap", unit="steps", file=out) as bar:
        for step in range(600):
            clock.now += 0.5  # 300 s in all: one line per 30 s at most, whatever the step count
            bar.set_postfix(loss=0.4213, tok_s="2400")
            bar.update()
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert 2 <= len(lines) <= 300 / 30 + 1, lines
    assert lines[0] == "bootstrap: 60/600 steps (10%) 30s loss=0.4213 tok_s=2400"
    assert lines[-1] == "bootstrap: done 600/600 steps (100%) in 5m00s loss=0.4213 tok_s=2400"


def test_short_run_writes_only_the_done_line(clock):
    out = io.StringIO()
    with progress_bar(4, "update", file=out) as bar:
        for _ in range(4):
            clock.now += 1
            bar.update()
        bar.set_postfix_str("pg 0.1")
    assert out.getvalue() == "update: done 4/4 it (100%) in 4s pg 0.1\n"


def test_leave_false_drops_the_closing_line_and_a_stopped_bar_says_so(clock):
    out = io.StringIO()
    with progress_bar(4, "   design", file=out, leave=False) as bar:
        bar.update(4)
    assert out.getvalue() == ""
    with pytest.raises(RuntimeError), progress_bar(10, "episodes", file=out) as bar:
        bar.update(3)
        clock.now += 75
        raise RuntimeError
    assert out.getvalue() == "episodes: stopped at 3/10 it (30%) after 1m15s\n"


def test_unknown_total_and_close_twice(clock):
    out = io.StringIO()
    bar = progress_bar(None, "loading", unit="tensor", file=out, interval_s=10)
    clock.now += 11
    bar.update(5)
    bar.close()
    bar.close()
    assert out.getvalue().splitlines() == ["loading: 5 tensor 11s", "loading: done 5 tensor in 11s"]


def test_disabled_writes_nothing(clock):
    for stream in (io.StringIO(), FakeTTY()):
        with progress_bar(10, "x", enabled=False, file=stream) as bar:
            bar.set_postfix(a=1)
            bar.set_postfix_str("b")
            clock.now += 100
            bar.update(10)
        assert stream.getvalue() == ""


def test_terminal_gets_a_tqdm_bar():
    from tqdm import tqdm

    tty = FakeTTY()
    with progress_bar(3, "bootstrap", unit="step", file=tty) as bar:
        assert isinstance(bar, tqdm)
        bar.set_postfix(loss="0.5")
        bar.update(3)
    text = tty.getvalue()
    assert "\r" in text and "bootstrap" in text and "3/3" in text and "loss=0.5" in text


def test_default_stream_is_stderr(capsys, clock):
    with progress_bar(2, "phase") as bar:  # pytest's captured stderr is not a terminal
        bar.update(2)
    assert capsys.readouterr().err == "phase: done 2/2 it (100%) in 0s\n"


def test_format_elapsed():
    assert [format_elapsed(s) for s in (0.4, 7, 72, 3599.6, 3725)] == ["0s", "7s", "1m12s", "1h00m", "1h02m"]
