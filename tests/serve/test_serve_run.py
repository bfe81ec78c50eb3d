"""`python -m spade_jax.serve --workdir=RUN` with no `--config` on a `tiny:runlocal` run: the server
reads the run's own config (as `python -m spade_jax.export` does) and serves its latest checkpoint.

The run directory is tests/export/test_export_cli.py's: made as the main job leaves it, without running
it (its `config.json` and an orbax checkpoint of a `Trainer`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.export.test_export_cli import STEP, run_dir  # noqa: F401  (the fixture, shared)

REPO = Path(__file__).resolve().parents[2]


def _serve(*args: str, log: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "spade_jax.serve", *args, f"--port={port}", "--rows=2"], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
                                 "XLA_FLAGS": "--xla_backend_optimization_level=0"})
    return proc, port


def test_a_run_is_served_with_its_own_config(run_dir, tmp_path):  # noqa: F811
    workdir, _ = run_dir
    log = tmp_path / "server.log"
    proc, port = _serve(f"--workdir={workdir}", log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # a liveness bound: loading the run takes a while on a busy machine
        while True:
            try:
                models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=2).read())
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        assert [m["id"] for m in models["data"]] == [f"{workdir.name}-{STEP}"]  # the run's latest checkpoint
        body = json.dumps({"model": f"{workdir.name}-{STEP}", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 4}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
        assert reply["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def test_a_directory_that_is_not_a_run_needs_a_config(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spade_jax.serve", f"--workdir={tmp_path}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2 and f"{tmp_path} has no config.json" in proc.stderr and "--config" in proc.stderr


def test_a_run_saved_before_a_field_existed_reads_with_its_default(tmp_path, capsys):
    """A run's config.json lacks the fields added since it was saved: each takes its default, named."""
    from spade_jax import cli
    from spade_jax.selfplay.config import base_config

    saved = json.loads(base_config().to_json())
    field = sorted(saved["agent"])[0]
    default = saved["agent"].pop(field)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = cli.run_config(str(tmp_path))
    assert config.agent[field] == default and f"fields agent.{field}:" in capsys.readouterr().err
    assert cli.run_config(str(tmp_path / "nowhere")) is None
