"""Serves a run's policy over OpenAI's HTTP API (chat, completions, tools, streaming).

    python -m spade_jax.serve --workdir=workdirs/tiny --port=8000
    python -m spade_jax.serve --config=configs/smollm2_135m.py --workdir=/tmp/s --step=none --port=8000

The policy is the one `spade_jax.evals` scores: the run's own config (``WORKDIR/config.json``,
which the main job writes; ``--config`` names another preset instead) with the parameters of
checkpoint ``--step`` of ``--workdir`` (a step, ``latest`` (default: the newest if any) or
``none``). A bootstrap preset must find its bootstrap already cached (the server never trains
one). Binds 127.0.0.1 unless ``--host`` says otherwise. Logs a line per request
(``--noaccess_log``: only refused, failed and disconnected ones). SIGTERM (or Ctrl-C) stops
accepting requests, fails the queued ones with 503, lets the decoding ones finish for up to
``--shutdown_timeout`` seconds, fails the rest explicitly, then exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

import uvicorn
from absl import app, flags
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Preset file (default: the run's WORKDIR/config.json).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (its checkpoints, its cached bootstrap).", required=True)
flags.DEFINE_string("step", "latest", "A checkpoint step, 'latest' or 'none' (initial weights).")
flags.DEFINE_string("bootstrap", None, "A bootstrap directory to serve (with WORKDIR's checkpoints) instead of the "
                    "one the preset keys: for a run whose bootstrap the current code would key differently.")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0 for every interface).")
flags.DEFINE_integer("port", 8000, "Port to bind.")
flags.DEFINE_integer("rows", 32, "Engine rows: replies decoded at once.")
flags.DEFINE_integer("max_queue", 256, "Requests waiting for a row before new ones get 503.")
flags.DEFINE_integer("max_tokens", 2048, "Most tokens one reply may ask for.")
flags.DEFINE_float("shutdown_timeout", 30.0, "Seconds decoding requests get to finish after SIGTERM.")
flags.DEFINE_string("model_name", "", "Model id served (default: the workdir's name and the step).")
flags.DEFINE_bool("access_log", True, "Log a line per request (else only refused, failed and disconnected ones).")
FLAGS = flags.FLAGS


def _require_cached_bootstrap(config, workdir: str) -> None:
    from spade_jax.bootstrap import cache_path
    from spade_jax.selfplay.config import bootstrap_config
    from spade_jax.selfplay.initial_policy import bootstrap_cache_dir

    if config.model.source != "bootstrap":
        return
    path = cache_path(bootstrap_cache_dir(config, workdir), bootstrap_config(config))
    if not (path / "DONE").exists():
        print(f"error: no finished bootstrap at {path}: train the run first (the server never trains one)",
              file=sys.stderr)
        raise SystemExit(2)


def _policy(config, workdir: str):
    """`(policy, step)` as `spade_jax.evals` loads it, or from `--bootstrap` with the workdir's checkpoint."""
    from spade_jax import cli

    if not FLAGS.bootstrap:
        _require_cached_bootstrap(config, workdir)
        return cli.policy_from(config, workdir, FLAGS.step)
    from spade_jax.bootstrap import load_bootstrap
    from spade_jax.selfplay.checkpoint import restore_parameters
    from spade_jax.selfplay.initial_policy import mesh_from_config

    cli.use_compile_cache(config, workdir)
    policy = load_bootstrap(os.path.expanduser(FLAGS.bootstrap), mesh_from_config(config))
    return policy, restore_parameters(policy, config, workdir, FLAGS.step)


def main(argv) -> None:
    del argv
    from spade_jax import cli
    from spade_jax.serve.app import create_app
    from spade_jax.serve.protocol import Limits
    from spade_jax.serve.scheduler import Scheduler

    workdir = os.path.abspath(FLAGS.workdir)
    config = FLAGS.config if FLAGS.config is not None else cli.run_config(workdir)
    if config is None:
        print(f"error: {workdir} has no config.json (not a run directory?): name its preset with --config",
              file=sys.stderr)
        raise SystemExit(cli.USAGE_ERROR)
    config = cli.validated(config)
    policy, step = _policy(config, workdir)
    if policy.tokenizer is None:
        raise app.UsageError("the policy has no tokenizer: serving needs text (set model.tokenizer_path)")
    model_id = FLAGS.model_name or f"{os.path.basename(workdir)}-{'initial' if step is None else step}"
    scheduler = Scheduler(policy, rows=FLAGS.rows, max_queue=FLAGS.max_queue)
    context = policy.config.max_position_embeddings
    limits = Limits(context=context, max_tokens=min(FLAGS.max_tokens, context - 1),
                    max_choices=min(scheduler.rows, 8))
    _log_requests()
    scheduler.start()
    app_ = create_app(scheduler, limits, model_id, access_log=FLAGS.access_log)
    server = _Server(uvicorn.Config(app_, host=FLAGS.host, port=FLAGS.port, log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=FLAGS.shutdown_timeout + 5),
                     scheduler, FLAGS.shutdown_timeout)
    print(f"serving {model_id} on http://{FLAGS.host}:{FLAGS.port}/v1 ({scheduler.rows} rows, context {context})",
          flush=True)
    server.run()
    scheduler.shutdown(0.0)
    print("server stopped: " + ", ".join(f"{k}={v}" for k, v in sorted(scheduler.status().items())), flush=True)


def _log_requests() -> None:
    """The request log (`app.RequestLog`'s ``spade_jax.serve`` logger) at info level on stderr."""
    logger = logging.getLogger("spade_jax.serve")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


class _Server(uvicorn.Server):
    """uvicorn's server whose first SIGTERM/SIGINT also drains the scheduler, and which exits 0 after."""

    def __init__(self, config, scheduler, drain_s: float):
        super().__init__(config)
        self._drain = threading.Thread(target=scheduler.shutdown, args=(drain_s,), daemon=True)

    def handle_exit(self, sig, frame) -> None:
        if self._drain.ident is None:
            logging.warning("signal %d: draining (no new requests)", sig)
            self._drain.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


if __name__ == "__main__":
    app.run(main)
