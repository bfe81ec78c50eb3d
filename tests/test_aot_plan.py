"""`bench/aot_tpu.py --dry_run`: every large preset is runnable on the TPU slice its docstring
names (the config validates there: mesh, micro-batch rows), without compiling anything."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_large_preset_plans_for_its_tpu_slice():
    out = subprocess.run([sys.executable, "bench/aot_tpu.py", "--dry_run"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for preset, slice_, mesh in (("qwen3_0p6b", "v4-8", "(4, 1, 1)"), ("qwen3_4b", "v4-32", "(1, 8, 2)"),
                                 ("qwen3_8b", "v4-64", "(1, 8, 4)"), ("qwen3_30b_a3b", "v5p-64", "(1, 8, 4)")):
        assert f"{preset} on {slice_} " in out.stdout and f"mesh {mesh}" in out.stdout, out.stdout
    assert "not runnable" not in out.stdout + out.stderr
