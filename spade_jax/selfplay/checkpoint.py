"""Checkpoints of a self-play run: orbax `CheckpointManager`, async, keep-N.

One checkpoint holds two items: `train` (parameters, optimizer state, optimizer step:
arrays restored onto the shardings of the running trainer) and `meta` (JSON: iteration,
RNG seed, environment memory, corpus cursor, environment pool, pending designer
samples, metric history). Orbax writes a step into a temporary directory and renames it
when complete, so a run killed at any moment, even during a save, resumes from the last
complete step.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from spade_jax.rl.train import Trainer
from spade_jax.selfplay import config as config_lib


class Checkpointer:
    """Saves and restores `(train pytree, meta dict)` pairs keyed by completed iterations."""

    def __init__(self, directory: str | os.PathLike, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save),
            item_names=("train", "meta"),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, train: Any, meta: dict) -> None:
        """Starts saving `step` (returns once arrays are copied off the devices when async)."""
        self.manager.save(
            step, args=ocp.args.Composite(train=ocp.args.StandardSave(train), meta=ocp.args.JsonSave(meta))
        )

    def restore(self, step: int, train_like: Any) -> tuple[Any, dict]:
        """Restores `step`; arrays take the shapes, dtypes and shardings of `train_like`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, train_like)
        restored = self.manager.restore(
            step, args=ocp.args.Composite(train=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
        return restored.train, restored.meta

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def restore_parameters(policy, config, workdir: str, checkpoint: str) -> int | None:
    """Loads the parameters of a run's checkpoint into ``policy`` (for the command-line tools).

    ``checkpoint``: a step, "latest" (the newest, if ``workdir`` has any) or "none". Returns the
    step loaded, or None when the policy keeps the preset's initial weights.
    """
    directory = os.path.join(workdir, "checkpoints")
    if checkpoint == "none" or (checkpoint == "latest" and not os.path.isdir(directory)):
        return None
    checkpointer = Checkpointer(directory, async_save=False)
    try:
        step = checkpointer.latest_step() if checkpoint == "latest" else int(checkpoint)
        if step is None:
            return None
        trainer = Trainer(policy, config_lib.optim_config(config), config_lib.loss_config(config))
        train, _ = checkpointer.restore(step, trainer.state_dict())
        trainer.load_state_dict(train)
        return step
    finally:
        checkpointer.close()
