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

import os
import sys

from absl import app, flags
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Preset file (default: the run's WORKDIR/config.json).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory whose checkpoint is exported.")
flags.DEFINE_string("step", "latest", "The checkpoint step to export, or 'latest'.")
flags.DEFINE_string("out", None, "Output directory (must not exist or be empty).", required=True)
flags.DEFINE_enum("dtype", "f32", ["f32", "bf16", "float32", "bfloat16"], "Stored weight dtype.")
flags.DEFINE_integer("max_shard_mb", 5000, "Largest safetensors file, in MB (10**6 bytes).", lower_bound=1)
FLAGS = flags.FLAGS

_DTYPES = {"f32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}


def main(argv) -> None:
    del argv
    from spade_jax import cli
    from spade_jax.export import ExportError, check_destination, export_hf
    from spade_jax.export.source import load_policy, run_config

    workdir = os.path.abspath(FLAGS.workdir) if FLAGS.workdir else None
    if workdir is None and FLAGS.config is None:
        raise app.UsageError("give --workdir (a run's checkpoint) or --config (a preset's base weights)")
    if workdir is None and FLAGS.step != "latest":
        raise app.UsageError("--step names a checkpoint of --workdir; give --workdir too")
    try:
        check_destination(FLAGS.out)
        config = cli.validated(FLAGS.config if FLAGS.config is not None else run_config(workdir))
        policy, step = load_policy(config, workdir, FLAGS.step)
        result = export_hf(policy, FLAGS.out, dtype=_DTYPES[FLAGS.dtype], max_shard_bytes=FLAGS.max_shard_mb * 10**6,
                           progress=config.log.progress)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(cli.USAGE_ERROR) from None
    source = f"step {step} of {workdir}" if step is not None else "the preset's base weights"
    print(f"exported {source} to {result.out_dir}: {len(result.weight_files)} weight file(s), "
          f"{result.num_tensors} tensors, {result.weight_bytes / 1e6:.1f} MB, tokenizer files "
          f"{', '.join(result.tokenizer_files) or 'none'} ({result.seconds:.1f}s)", flush=True)


if __name__ == "__main__":
    app.run(main)
