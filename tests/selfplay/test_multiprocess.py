"""Two JAX processes (jax.distributed over gloo) run one self-play iteration and agree on its state."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_processes_run_one_iteration_and_agree(tmp_path, runlocal_config):
    workdir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    env = dict(os.environ, SPADE_PYTHON=sys.executable, SPADE_LOG_DIR=str(logs), PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)  # the launcher gives each process its own single device
    proc = subprocess.run(
        ["bash", str(REPO / "launch" / "multiprocess_cpu.sh"), "2", f"--config={runlocal_config(1)}",
         f"--workdir={workdir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    out0 = proc.stdout + proc.stderr
    out1 = (logs / "spade_process_1.log").read_text()
    assert proc.returncode == 0, out0[-4000:] + "\n--- process 1\n" + out1[-4000:]
    digests = [re.findall(rf"process {i} state digest (\w+)", out) for i, out in enumerate((out0, out1))]
    assert all(len(d) == 1 for d in digests), (out0[-2000:], out1[-2000:])
    assert digests[0] == digests[1]
    assert "it 0 |" in out0 and "it 0 |" not in out1  # only process 0 reports
    assert (workdir / "checkpoints" / "1").is_dir()
    assert len((workdir / "metrics.jsonl").read_text().splitlines()) == 1
    assert (workdir / "gallery" / "index.html").exists()
