"""Evaluates a run's checkpoint (or the preset's initial weights) on held-out suites.

    python -m spade_jax.evals --config=configs/tiny.py --workdir=workdirs/tiny --suites=envs:heldout/
    python -m spade_jax.evals --config=configs/smollm2_135m.py --workdir=/tmp/ev --suites=aime:aime25.jsonl --limit=5

Results go to ``WORKDIR/evals/<step>/`` (``initial`` without a checkpoint): per suite the
per-item JSONL and its summary as JSON and markdown; one table across suites is printed.
``--checkpoint`` takes a step, ``latest`` (the default: the newest if the workdir has any)
or ``none`` (the preset's initial weights). Config overrides work as for the main job
(``--config.eval.generation.envs.temperature=0.7``).
"""

from __future__ import annotations

import dataclasses
import os

from absl import app, flags
from ml_collections import config_flags

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

config_flags.DEFINE_config_file("config", os.path.join(_REPO, "configs", "tiny.py"), "Preset file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (its checkpoints; results go to WORKDIR/evals/).", required=True)
flags.DEFINE_string("suites", None, "Comma-separated suites (default: config.eval.suites), e.g. envs:DIR,aime:FILE.")
flags.DEFINE_string("checkpoint", "latest", "A checkpoint step, 'latest' or 'none' (initial weights).")
flags.DEFINE_integer("limit", None, "Items per suite (default: config.eval.limit; 0 = all).")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    from spade_jax import cli
    from spade_jax.evals import runner
    from spade_jax.sandbox import SandboxPool
    from spade_jax.selfplay import config as config_lib

    config = cli.validated(FLAGS.config)
    workdir = os.path.abspath(FLAGS.workdir)
    cfg = config_lib.eval_config(config)
    cfg = dataclasses.replace(cfg, suites=FLAGS.suites if FLAGS.suites is not None else cfg.suites,
                              limit=FLAGS.limit if FLAGS.limit is not None else cfg.limit)
    if not cfg.specs:
        raise app.UsageError("no suites: give --suites=... or set config.eval.suites")
    policy, step = cli.policy_from(config, workdir, FLAGS.checkpoint)
    step = "initial" if step is None else str(step)
    out_dir = os.path.join(workdir, "evals", step)
    with SandboxPool(config_lib.sandbox_config(config)) as pool:
        results = runner.run_suites(policy, pool, cfg, config_lib.agent_config(config), out_dir,
                                    config_lib.eval_generation(config), progress=config.log.progress)
    print(f"\nevaluation of {step} in {out_dir}\n" + runner.table(results), flush=True)


if __name__ == "__main__":
    app.run(main)
