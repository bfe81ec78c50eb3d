"""The SPADE self-play job.

    python -m spade_jax.main --config=configs/tiny.py --workdir=workdirs/tiny
    python -m spade_jax.main --config=configs/tiny.py:runlocal --workdir=/tmp/t --config.num_iterations=2

Any config field can be overridden (`--config.rl.lr=1e-6`). A workdir with checkpoints is
resumed; one with outputs but no checkpoint is refused rather than overwritten.
Multi-process runs (see launch/) run this same command in every process and set either
SPADE_DISTRIBUTED=auto (TPU pods, SLURM: jax.distributed finds its peers) or
SPADE_COORDINATOR, SPADE_NUM_PROCESSES and SPADE_PROCESS_ID (explicit, e.g. CPU processes).
"""

from __future__ import annotations

import json
import logging as std_logging
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

config_flags.DEFINE_config_file(
    "config", os.path.join(_REPO, "configs", "tiny.py"), "Preset file, optionally with `:args`.", lock_config=True
)
flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, gallery.", required=True)
flags.DEFINE_bool("allow_config_change", False, "Resume a workdir whose saved config differs.")
flags.DEFINE_bool("library_logs", False, "Also show INFO logs of orbax and tensorflow_datasets (very chatty).")

# Fields a resumed run may change without --allow_config_change.
_RESUMABLE_CHANGES = ("num_iterations", "agent_token_budget", "log", "checkpoint", "compile_cache_dir")


def _init_distributed() -> None:
    import jax

    if os.environ.get("SPADE_DISTRIBUTED") == "auto":
        jax.distributed.initialize()
        return
    count = int(os.environ.get("SPADE_NUM_PROCESSES", "1"))
    if count <= 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=os.environ["SPADE_COORDINATOR"],
        num_processes=count,
        process_id=int(os.environ["SPADE_PROCESS_ID"]),
    )


class _QuietLibraries(std_logging.Filter):
    """Drops the INFO/WARNING chatter of checkpointing and dataset libraries (errors still show)."""

    _CHATTY = ("orbax", "tensorflow_datasets", "etils", "xla_bridge")

    def filter(self, record: std_logging.LogRecord) -> bool:
        return record.levelno >= std_logging.ERROR or not any(name in record.pathname for name in self._CHATTY)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def refuse_retired(workdir: str, saved: dict) -> None:
    """Stops when the run saved in `workdir` used a retired switch (`selfplay.config.RETIRED`) with a
    value other than today's rule: this code cannot continue it."""
    from spade_jax.selfplay.config import RETIRED

    used = [(k, saved[k]) for k in RETIRED if k in saved and saved[k] != RETIRED[k][0]]
    if used:
        field, value = used[0]
        raise SystemExit(
            f"error: {workdir} holds a run made with config.{field}={value!r}, a rule spade_jax no longer has "
            f"(retired after commit {RETIRED[field][1]}, docs/DESIGN.md); resume it with spade_jax at that commit"
        )


def check_workdir(workdir: str, config_json: dict, allow_change: bool) -> None:
    """Refuses to overwrite a previous run's outputs; checks a resumed run's config."""
    from spade_jax.selfplay.config import RETIRED

    saved_path = os.path.join(workdir, "config.json")
    has_checkpoint = os.path.isdir(os.path.join(workdir, "checkpoints")) and any(
        name.isdigit() for name in os.listdir(os.path.join(workdir, "checkpoints"))
    )
    has_outputs = os.path.exists(os.path.join(workdir, "metrics.jsonl"))
    if has_outputs and not has_checkpoint:
        raise SystemExit(
            f"error: {workdir} holds outputs of an earlier run but no checkpoint to resume; "
            "choose a new --workdir or delete that one"
        )
    if not os.path.exists(saved_path) or not has_checkpoint:
        return
    with open(saved_path) as f:
        saved = _flatten(json.load(f))
    refuse_retired(workdir, saved)
    now = _flatten(config_json)
    changed = sorted(
        k for k in set(saved) | set(now)
        if saved.get(k) != now.get(k) and not k.startswith(_RESUMABLE_CHANGES) and k not in RETIRED
    )
    if changed and not allow_change:
        raise SystemExit(
            f"error: {workdir} holds a run with a different config ({', '.join(changed[:8])}); "
            "resume it with the same config, pass --allow_config_change, or choose a new --workdir"
        )


def main(argv) -> None:
    del argv
    if not flags.FLAGS.library_logs:
        logging.get_absl_handler().addFilter(_QuietLibraries())
    _init_distributed()
    import jax

    from spade_jax import cli
    from spade_jax.selfplay import loop

    config = cli.validated(flags.FLAGS.config)
    workdir = os.path.abspath(flags.FLAGS.workdir)
    config_json = json.loads(config.to_json())
    check_workdir(workdir, config_json, flags.FLAGS.allow_config_change)
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(config_json, f, indent=2)
    logging.info("devices: %s; workdir %s", jax.devices(), workdir)
    cli.use_compile_cache(config, workdir)
    history = loop.run(config, workdir)
    print(f"done: {len(history)} iterations in {workdir}", file=sys.stderr)


if __name__ == "__main__":
    app.run(main)
