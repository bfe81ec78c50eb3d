"""`python -m spade_jax.export` on a `tiny:runlocal` run directory: the checkpoint's parameters come out.

The run directory is made as the main job leaves it, without running it: its `config.json` and
an orbax checkpoint of a `Trainer` whose parameters differ from the bootstrap's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import presets

REPO = Path(__file__).resolve().parents[2]
STEP = 2


def _export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spade_jax.export", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))


def _params(policy) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.to_pure_dict(nnx.state(policy.model, nnx.Param)))]


@pytest.fixture(scope="module")
def run_dir(runlocal_config, tmp_path_factory):
    """A run directory with the config and one checkpoint (step 2), and the parameters checkpointed."""
    from spade_jax.bootstrap import cache_path, load_bootstrap
    from spade_jax.rl.train import Trainer
    from spade_jax.selfplay import config as config_lib
    from spade_jax.selfplay.checkpoint import Checkpointer

    config = presets.load(str(runlocal_config(1)))
    workdir = tmp_path_factory.mktemp("run")
    (workdir / "config.json").write_text(config.to_json())
    policy = load_bootstrap(cache_path(config.bootstrap.cache_dir, config_lib.bootstrap_config(config)))
    state = nnx.state(policy.model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda w: w * 1.5 + 0.01, nnx.to_pure_dict(state)))  # "trained"
    nnx.update(policy.model, state)
    trainer = Trainer(policy, config_lib.optim_config(config), config_lib.loss_config(config))
    checkpointer = Checkpointer(workdir / "checkpoints", async_save=False)
    checkpointer.save(STEP, trainer.state_dict(), {"iteration": STEP})
    checkpointer.close()
    return workdir, _params(policy)


def test_cli_exports_the_runs_latest_checkpoint(run_dir, tmp_path):
    from spade_jax.models import load_pretrained

    workdir, trained = run_dir
    out = tmp_path / "hf"
    proc = _export(f"--workdir={workdir}", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"exported step {STEP} of {workdir}" in proc.stdout
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()
    back = load_pretrained(out, progress=False)
    assert back.tokenizer is not None
    for a, b in zip(trained, _params(back)):
        np.testing.assert_array_equal(a, b)


def test_run_directory_errors_name_the_problem(run_dir, tmp_path):
    from spade_jax.export import ExportError
    from spade_jax.export.source import checkpoint_step, load_policy, run_config

    workdir, _ = run_dir
    assert checkpoint_step(str(workdir), "latest") == checkpoint_step(str(workdir), str(STEP)) == STEP
    with pytest.raises(ExportError, match=rf"has no checkpoint step 5; its steps: \[{STEP}\]"):
        checkpoint_step(str(workdir), "5")
    with pytest.raises(ExportError, match="must be a checkpoint step or 'latest', got 'last'"):
        checkpoint_step(str(workdir), "last")
    (tmp_path / "checkpoints" / f"{STEP}.orbax-checkpoint-tmp-1").mkdir(parents=True)  # a save cut short
    with pytest.raises(ExportError, match=f"no checkpoint in {tmp_path / 'checkpoints'}"):
        checkpoint_step(str(tmp_path), "latest")
    with pytest.raises(ExportError, match="has no config.json"):
        run_config(str(tmp_path))
    config = run_config(str(workdir))
    with pytest.raises(ExportError, match="does not exist"):
        load_policy(config, str(tmp_path / "nowhere"))
    config.bootstrap.cache_dir = ""
    with pytest.raises(ExportError, match="bootstrap.cache_dir"):
        load_policy(config, None)
