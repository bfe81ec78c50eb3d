"""Exports a run's policy, or a preset's base weights, as a Hugging Face model directory.

    python -m spade_jax.export --workdir=workdirs/tiny --out=/tmp/tiny_hf               # newest checkpoint
    python -m spade_jax.export --workdir=workdirs/tiny --step=10 --out=/tmp/tiny_hf --dtype=bf16
    python -m spade_jax.export --config=configs/smollm2_135m.py --out=/tmp/smollm2_hf  # base weights

With ``--workdir`` the run's own config (``WORKDIR/config.json``, written by the main job) says
which policy it trained, unless ``--config`` names one; ``--step`` is a checkpoint step or
``latest``. With ``--config`` alone the preset's initial weights are exported (a bootstrap preset
needs ``--config.bootstrap.cache_dir``, or a ``--workdir`` holding its cache). ``--out`` must not
exist or be empty; ``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` and
``AutoTokenizer.from_pretrained(OUT)`` load it.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

if __name__ == "__main__":  # before the config flag, whose definition already applies the overrides
    from spade_jax.cli import refuse_renamed

    refuse_renamed(sys.argv)

config_flags.DEFINE_config_file("config", None, "Preset file (default: the run's WORKDIR/config.json).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory whose checkpoint is exported.")
flags.DEFINE_string("step", "latest", "The checkpoint step to export, or 'latest'.")
flags.DEFINE_string("out", None, "Output directory (must not exist or be empty).", required=True)
flags.DEFINE_enum("dtype", "f32", ["f32", "bf16", "float32", "bfloat16"], "Stored weight dtype.")
flags.DEFINE_integer("max_shard_mb", 5000, "Largest safetensors file, in MB (10**6 bytes).", lower_bound=1)
FLAGS = flags.FLAGS

_DTYPES = {"f32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}


def run_config(workdir: str):
    """The config a run was started with (``WORKDIR/config.json``) as a ConfigDict."""
    import ml_collections

    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise app.UsageError(f"{workdir} has no config.json (not a run directory?); name its preset with --config")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))


def checkpoint_step(workdir: str, step: str) -> int:
    """The step `step` ("latest" or a number) names among the checkpoints of `workdir`; UsageError if none."""
    from spade_jax.selfplay.checkpoint import Checkpointer

    if step != "latest" and not step.isdigit():
        raise app.UsageError(f"--step must be a checkpoint step or 'latest', got {step!r}")
    directory = os.path.join(workdir, "checkpoints")
    steps: list[int] = []
    if os.path.isdir(directory):
        checkpointer = Checkpointer(directory, async_save=False)
        try:
            steps = sorted(checkpointer.manager.all_steps())
        finally:
            checkpointer.close()
    if not steps:
        raise app.UsageError(f"no checkpoint in {directory}; to export a preset's base weights give --config "
                             "without --workdir")
    if step == "latest":
        return steps[-1]
    if int(step) not in steps:
        raise app.UsageError(f"{directory} has no checkpoint step {step}; its steps: {steps}")
    return int(step)


def main(argv) -> None:
    del argv
    from spade_jax import cli
    from spade_jax.export import ExportError, check_destination, export_hf

    try:
        check_destination(FLAGS.out)
    except ExportError as err:
        raise app.UsageError(str(err)) from None
    workdir = os.path.abspath(FLAGS.workdir) if FLAGS.workdir else None
    if workdir is None and FLAGS.config is None:
        raise app.UsageError("give --workdir (a run's checkpoint) or --config (a preset's base weights)")
    if workdir is not None and not os.path.isdir(workdir):
        raise app.UsageError(f"--workdir {workdir} does not exist")
    config = cli.validated(FLAGS.config if FLAGS.config is not None else run_config(workdir))
    if workdir is None and config.model.source == "bootstrap" and not config.bootstrap.cache_dir:
        raise app.UsageError("a bootstrap preset's base weights live in its bootstrap cache: give "
                             "--config.bootstrap.cache_dir=DIR or the --workdir of a run that cached it")
    step = checkpoint_step(workdir, FLAGS.step) if workdir is not None else None
    # Without a workdir nothing reads it: the policy is loaded, random, or in the named bootstrap cache.
    policy, restored = cli.policy_from(config, workdir or "", "none" if step is None else str(step))
    try:
        result = export_hf(policy, FLAGS.out, dtype=_DTYPES[FLAGS.dtype], max_shard_bytes=FLAGS.max_shard_mb * 10**6,
                           progress=config.log.progress)
    except ExportError as err:  # an architecture transformers has no class for
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(cli.USAGE_ERROR) from None
    source = f"step {restored} of {workdir}" if restored is not None else "the preset's base weights"
    print(f"exported {source} to {result.out_dir}: {len(result.weight_files)} weight file(s), "
          f"{result.num_tensors} tensors, {result.weight_bytes / 1e6:.1f} MB, tokenizer files "
          f"{', '.join(result.tokenizer_files) or 'none'} ({result.seconds:.1f}s)", flush=True)


if __name__ == "__main__":
    app.run(main)
