"""Exact resume: checkpoints between iterations, SIGKILL during a save, SIGTERM, no overwrite."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 3


def _comparable(metrics: dict) -> dict:
    """Everything but wall-clock measurements."""
    return {
        k: v
        for k, v in metrics.items()
        if not (k.startswith("time/") or k.endswith("tokens_per_s") or k.endswith("step_time_s"))
    }


def _metrics(workdir: Path) -> list[dict]:
    return [_comparable(json.loads(line)) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _main(workdir: Path, config_path: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "spade_jax.main", f"--config={config_path}", f"--workdir={workdir}", *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.fixture(scope="module")
def config_path(runlocal_config):
    return runlocal_config(ITERATIONS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, config_path):
    """An uninterrupted run."""
    workdir = tmp_path_factory.mktemp("reference")
    proc = _main(workdir, config_path)
    out = _finish(proc)
    assert proc.returncode == 0, out
    metrics = _metrics(workdir)
    assert len(metrics) == ITERATIONS
    return metrics


def _wait_for(predicate, timeout: float = 600, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


def test_sigkill_during_a_save_then_resume_equals_uninterrupted_run(tmp_path, config_path, reference):
    checkpoints = tmp_path / "checkpoints"
    proc = _main(tmp_path, config_path)
    # Kill the moment the save of step 2 starts writing (orbax's temporary directory appears).
    saving = lambda: checkpoints.exists() and any(p.name.startswith("2.") for p in checkpoints.iterdir())
    seen = _wait_for(lambda: saving() or proc.poll() is not None)
    assert seen and proc.poll() is None, "the run ended before its second save started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = _main(tmp_path, config_path)
    out = _finish(resumed)
    assert resumed.returncode == 0, out
    # From 1, unless the kill came after orbax renamed the finished save to "2".
    step = int(re.search(r"resumed from checkpoint (\d+)", out).group(1))
    assert step == 1 or (step == 2 and not any(p.name.startswith("2.") for p in checkpoints.iterdir())), out
    assert _metrics(tmp_path) == reference


def test_sigterm_saves_and_exits_cleanly_then_resume_equals_uninterrupted_run(tmp_path, config_path, reference):
    proc = _main(tmp_path, config_path)
    # After the first checkpoint, so the handler is installed and the signal lands mid-run.
    assert _wait_for(lambda: (tmp_path / "checkpoints" / "1").is_dir() or proc.poll() is not None)
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc)
    assert proc.returncode == 0, out
    assert "SIGTERM: saved" in out, out
    steps = [int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and max(steps) < ITERATIONS, out
    resumed = _main(tmp_path, config_path)
    out = _finish(resumed)
    assert resumed.returncode == 0 and f"resumed from checkpoint {max(steps)}" in out, out
    assert _metrics(tmp_path) == reference


def test_a_previous_runs_outputs_are_not_overwritten(tmp_path, config_path):
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n')
    proc = _main(tmp_path, config_path)
    out = _finish(proc)
    assert proc.returncode != 0 and "no checkpoint to resume" in out
    assert (tmp_path / "metrics.jsonl").read_text() == '{"iteration": 0}\n'


def test_resuming_with_a_different_config_is_refused(tmp_path, config_path, reference):
    first = _main(tmp_path, config_path, "--config.num_iterations=1")
    assert _finish(first) is not None and first.returncode == 0
    changed = _main(tmp_path, config_path, "--config.rl.lr=0.5")
    out = _finish(changed)
    assert changed.returncode != 0 and "rl.lr" in out


def test_a_run_made_with_a_retired_switch_is_refused_with_the_commit_that_had_it(tmp_path):
    """A run saved with an earlier rule's switch set (here `designer.reward.matched_seeds`) cannot
    be continued by this code: one message names the field and the last commit that had it; one
    saved with the switch at today's rule resumes (the field is only dropped)."""
    from spade_jax import main
    from spade_jax.selfplay.config import RETIRED, base_config

    config = json.loads(base_config().to_json())
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    saved = json.loads(json.dumps(config))
    saved["designer"]["reward"]["matched_seeds"] = True
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(SystemExit, match=r"config\.designer\.reward\.matched_seeds=True.*retired after commit "
                                         + RETIRED["designer.reward.matched_seeds"][1]):
        main.check_workdir(str(tmp_path), config, allow_change=False)
    saved["designer"]["reward"]["matched_seeds"] = False
    (tmp_path / "config.json").write_text(json.dumps(saved))
    main.check_workdir(str(tmp_path), config, allow_change=False)
