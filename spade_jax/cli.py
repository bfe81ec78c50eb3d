"""What every command line does before its work (the main job, `spade_jax.evals`,
`spade_jax.related.trajectories`): the parsed config validated, with a bad field stopping the
command as one message and exit code 2, then the policy on its mesh, optionally with the
parameters of a run's checkpoint. It sits above the packages: they never import it.
"""

from __future__ import annotations

import sys

USAGE_ERROR = 2  # absl's and argparse's exit code for a bad command line


def validated(config):
    """`config` after `selfplay.config.validate` on this process's devices; a bad field exits with
    "error: config.<field>: ..." on stderr and status 2."""
    import jax

    from spade_jax.selfplay.config import validate

    try:
        validate(config, jax.device_count())
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    return config


def run_config(workdir: str):
    """The config the run in `workdir` was started with (``WORKDIR/config.json``, which the main job
    writes), or None when `workdir` holds none. A field added to the config since the run was
    saved takes its default (`selfplay.config.base_config`), named on stderr."""
    import json
    import os

    import ml_collections

    from spade_jax.selfplay.config import base_config

    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        saved = json.load(f)
    added = _fill_defaults(saved, base_config().to_dict())
    if added:
        print(f"note: {path} predates config fields {', '.join(added)}: they take their defaults", file=sys.stderr)
    return ml_collections.ConfigDict(saved)


def _fill_defaults(saved: dict, defaults: dict, prefix: str = "") -> list[str]:
    """Adds to `saved` (in place) every field of `defaults` it lacks; returns their dotted names."""
    added = []
    for key, value in defaults.items():
        if key not in saved:
            saved[key] = value
            added.append(prefix + key)
        elif isinstance(value, dict) and isinstance(saved[key], dict):
            added += _fill_defaults(saved[key], value, f"{prefix}{key}.")
    return added


def use_compile_cache(config, workdir: str | None) -> None:
    """Turns on the persistent compilation cache `config.compile_cache_dir` names
    (`compile_cache.cache_dir`) before this command's first compile, and logs where it is."""
    from absl import logging

    from spade_jax import compile_cache

    directory = compile_cache.cache_dir(config.compile_cache_dir, workdir)
    if directory is not None:
        logging.info("compilation cache: %s", compile_cache.enable(directory))


def policy_from(config, workdir: str, checkpoint: str = "none"):
    """`(policy, step)`: the preset's policy on the config's mesh (a bootstrap is cached under
    `workdir` unless the config names a cache) with the parameters of checkpoint `checkpoint` of
    `workdir` ("latest", a step, or "none": `step` is None and the initial weights stay)."""
    from spade_jax.selfplay.checkpoint import restore_parameters
    from spade_jax.selfplay.initial_policy import build_policy, mesh_from_config

    use_compile_cache(config, workdir)
    policy = build_policy(config, workdir, mesh_from_config(config))
    return policy, restore_parameters(policy, config, workdir, checkpoint)
