"""Synthesizes tool-use trajectories from a directory of environment programs.

    python -m spade_jax.related.trajectories --envs DIR --out FILE [--num N] [--rl_out FILE]
    python -m spade_jax.related.trajectories --envs library --out /tmp/traj.jsonl --config=configs/tiny.py \\
        --workdir=workdirs/tiny --num 16

``--envs`` is a directory of ``.py`` programs, a comma-separated list of files, or ``library``
(the seed library's tool-use programs). The policy (query writer and verifying agent) is
the preset's (``--config``, default configs/tiny.py) with the newest checkpoint of
``--workdir`` (``--checkpoint`` a step, ``latest`` or ``none``); the tiny preset's bootstrap is
cached under ``WORKDIR/bootstrap`` unless the config names a cache; ``--bootstrap_dir`` loads a
finished bootstrap directory instead. The verifying agent
plays greedily with the preset's agent settings and at least ``--max_calls`` + 2 turns.
A summary table per environment is printed at the end.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

config_flags.DEFINE_config_file("config", os.path.join(_REPO, "configs", "tiny.py"), "Preset file.", lock_config=True)
flags.DEFINE_string("envs", None, "Directory of programs, comma-separated files, or 'library'.", required=True)
flags.DEFINE_string("out", None, "SFT JSONL output (chat format with tool calls).", required=True)
flags.DEFINE_string("rl_out", None, "RL tasks JSONL output (query, program, seed, checker).")
flags.DEFINE_integer("num", 8, "Chains sampled per environment.")
flags.DEFINE_integer("seed", 0, "Seed of probing, chain walks and query sampling.")
flags.DEFINE_integer("max_calls", 4, "Most tool calls in a chain.")
flags.DEFINE_float("skip_prob", 0.3, "Probability of skipping an optional step of a chain.")
flags.DEFINE_string("workdir", os.path.join("workdirs", "tiny"), "Run directory: its checkpoints and bootstrap cache.")
flags.DEFINE_string("checkpoint", "latest", "A checkpoint step, 'latest' or 'none' (initial weights).")
flags.DEFINE_string("bootstrap_dir", None, "A finished bootstrap directory to load instead of the preset's policy.")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    from spade_jax.related.trajectories.chains import ChainConfig
    from spade_jax.related.trajectories.synth import NoToolPrograms, SynthConfig, load_programs

    try:
        programs, skipped = load_programs(FLAGS.envs)
        cfg = SynthConfig(chains_per_env=FLAGS.num, seed=FLAGS.seed,
                          chain=ChainConfig(max_calls=FLAGS.max_calls, skip_prob=FLAGS.skip_prob))
    except (NoToolPrograms, ValueError) as err:
        raise app.UsageError(str(err))
    for name, reason in skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    for path in filter(None, (FLAGS.out, FLAGS.rl_out)):
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise app.UsageError(f"the directory of {path} does not exist")
    _run(programs, cfg)


def _run(programs, cfg) -> None:
    from spade_jax import cli
    from spade_jax.related.trajectories.export import rl_task, sft_record, write_jsonl
    from spade_jax.related.trajectories.run import policy_players
    from spade_jax.related.trajectories.synth import summary_table, synthesize
    from spade_jax.sandbox import SandboxPool
    from spade_jax.selfplay import config as config_lib

    config = cli.validated(FLAGS.config)
    workdir = os.path.abspath(FLAGS.workdir)
    if FLAGS.bootstrap_dir:
        from spade_jax.bootstrap import load_bootstrap

        policy, step = load_bootstrap(FLAGS.bootstrap_dir), f"bootstrap {FLAGS.bootstrap_dir}"
    else:
        policy, step = cli.policy_from(config, workdir, FLAGS.checkpoint)
        step = "initial" if step is None else f"checkpoint {step}"
    with SandboxPool(config_lib.sandbox_config(config)) as pool:
        complete, play = policy_players(policy, pool, config_lib.agent_config(config), cfg)
        examples, reports = synthesize(pool, programs, complete, play, cfg, progress=config.log.progress)
    written = write_jsonl(FLAGS.out, (sft_record(e) for e in examples))
    print(f"\npolicy {step}; {written} SFT records in {FLAGS.out}", end="")
    if FLAGS.rl_out:
        write_jsonl(FLAGS.rl_out, (rl_task(e) for e in examples))
        print(f", RL tasks in {FLAGS.rl_out}", end="")
    print("\n\n" + summary_table(reports), flush=True)


if __name__ == "__main__":
    app.run(main)
