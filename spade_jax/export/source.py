"""What an export reads: a run directory's config and checkpoint step, or a preset's base weights."""

from __future__ import annotations

import os

import ml_collections

from spade_jax.export.hf import ExportError


def run_config(workdir: str) -> ml_collections.ConfigDict:
    """The config a run was started with (``WORKDIR/config.json``, written by the main job)."""
    from spade_jax import cli

    if not os.path.isdir(workdir):
        raise ExportError(f"the run directory {workdir} does not exist")
    config = cli.run_config(workdir)
    if config is None:
        raise ExportError(f"{workdir} has no config.json (not a run directory?); name its preset with --config")
    return config


def checkpoint_steps(workdir: str) -> list[int]:
    """The complete checkpoints of a run, oldest first (orbax names a step's directory by its number
    once the step is written whole, as `spade_jax.main` reads them)."""
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory)
                  if name.isdigit() and os.path.isdir(os.path.join(directory, name)))


def checkpoint_step(workdir: str, step: str) -> int:
    """The checkpoint `step` ("latest" or a number) names in `workdir`; ExportError when there is none."""
    if step != "latest" and not step.isdigit():
        raise ExportError(f"the step must be a checkpoint step or 'latest', got {step!r}")
    steps = checkpoint_steps(workdir)
    directory = os.path.join(workdir, "checkpoints")
    if not steps:
        raise ExportError(f"no checkpoint in {directory}; to export a preset's base weights give --config "
                          "without --workdir")
    if step == "latest":
        return steps[-1]
    if int(step) not in steps:
        raise ExportError(f"{directory} has no checkpoint step {int(step)}; its steps: {steps}")
    return int(step)


def load_policy(config: ml_collections.ConfigDict, workdir: str | None, step: str = "latest"):
    """`(policy, step)`: the preset's policy with checkpoint `step` of `workdir` (`step` None: no
    workdir, the preset's base weights), loaded as `spade_jax.evals` loads it."""
    from spade_jax import cli

    if workdir is None:
        if config.model.source == "bootstrap" and not config.bootstrap.cache_dir:
            raise ExportError("a bootstrap preset's base weights live in its bootstrap cache: give "
                              "--config.bootstrap.cache_dir=DIR or the --workdir of a run that cached it")
        # Nothing reads the workdir then: the policy is loaded, random, or in the named bootstrap cache.
        return cli.policy_from(config, "", "none")
    if not os.path.isdir(workdir):
        raise ExportError(f"the run directory {workdir} does not exist")
    return cli.policy_from(config, workdir, str(checkpoint_step(workdir, step)))
