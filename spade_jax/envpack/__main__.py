"""Packs a run's admitted environments as an installable Python package.

    python -m spade_jax.envpack --workdir=workdirs/tiny --out=/tmp/tiny_envs
    python -m spade_jax.envpack --workdir=RUN --out=DIR --name=my_envs --version=0.2.0 --noseeds

``--out`` must not exist or be empty. ``--name`` is the Python package (default
``spade_envs_<run directory name>``); ``--noseeds`` leaves out the handwritten seed
environments the run played. Programs the log holds but the sandbox's parse stage refuses are
skipped with their reason. ``pip install DIR`` installs the pack next to spade_jax (``DIR[openenv]``
adds openenv-core); ``python -m <name> list`` lists it.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "Run directory whose admitted environments are packed.", required=True)
flags.DEFINE_string("out", None, "Output directory (must not exist or be empty).", required=True)
flags.DEFINE_string("name", None, "Python package name (default: spade_envs_<run directory name>).")
flags.DEFINE_string("version", "0.1.0", "Package version.")
flags.DEFINE_bool("seeds", True, "Include the handwritten seed environments the run played.")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    from spade_jax import cli
    from spade_jax.envpack.manifest import PackError
    from spade_jax.envpack.source import admitted_envs
    from spade_jax.envpack.write import default_name, write_pack
    from spade_jax.selfplay.runlog import EnvLog

    workdir = os.path.abspath(FLAGS.workdir)
    name = FLAGS.name or default_name(workdir)
    try:
        admitted, skipped = admitted_envs(workdir, include_seeds=FLAGS.seeds)
        if not admitted:
            raise PackError(f"{workdir} has no admitted environment{'' if FLAGS.seeds else ' besides seeds'} "
                            f"with a program to pack{f' ({len(skipped)} skipped)' if skipped else ''}")
        iterations = [e.iteration for e in EnvLog(workdir).read()]
        run = {"workdir": os.path.basename(workdir), "last_iteration": max(iterations),
               "skipped": [list(s) for s in skipped]}
        manifest = write_pack(admitted, FLAGS.out, name=name, version=FLAGS.version, run=run)
    except PackError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(cli.USAGE_ERROR) from None
    for env_id, reason in skipped:
        print(f"skipped {env_id}: {reason}", file=sys.stderr)
    seeds = sum(e.is_seed for e in manifest.environments)
    print(f"packed {len(manifest.environments)} environment(s) ({seeds} seed(s)) of {workdir} as {name} "
          f"{manifest.version} in {os.path.abspath(FLAGS.out)}; install it with `pip install {FLAGS.out}`", flush=True)


if __name__ == "__main__":
    app.run(main)
