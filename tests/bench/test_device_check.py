"""The accelerator check's dry run: `bench/device_check.sh --dry-run` runs every job on CPU with toy
shapes and writes one table holding every planned row, measured or skipped for memory."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPES = [f"{r} x {c}" for r, c in ((32, 2048), (128, 2048), (32, 8192), (256, 2048), (128, 8192), (256, 8192))]
SKIPPED = {("qwen3_0p6b", "256 x 8192"), ("qwen3_4b", "128 x 8192"), ("qwen3_4b", "256 x 8192")}  # > 85% of 139 GiB


def test_the_dry_run_writes_every_row_of_the_table(tmp_path, tiny_bootstrap_cache):
    out = tmp_path / "device_check.md"
    done = subprocess.run(["bash", "bench/device_check.sh", "--dry-run", f"--out={out}",
                           f"--tiny-bootstrap={tiny_bootstrap_cache}"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    header, rows = lines[0], [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]
    assert "prefill tok/s" in header and "MFU" in header and "989 TFLOP/s" in out.read_text()
    cells = {(job, model, shape): rest for job, model, shape, *rest in rows}
    expected = [(job, model, shape) for job in ("engine", "hf generate") for model in ("qwen3_0p6b", "qwen3_4b")
                for shape in SHAPES]
    expected += [("update", model, "2 x 8192 tok") for model in ("qwen3_0p6b", "qwen3_4b")]
    expected += [("tiny:runlocal e2e", "tiny", "runlocal")]
    assert sorted(cells) == sorted(expected)
    for (job, model, shape), (prefill, decode, step_s, mfu, peak, compile_s, note) in cells.items():
        if (model, shape) in SKIPPED and job != "update":
            assert note.startswith("skipped: KV cache"), (job, model, shape, note)
        elif job in ("engine", "hf generate"):
            assert prefill and not note.startswith(("error", "not reached")), (job, model, shape, note)
        elif job == "update":
            assert float(step_s) > 0 and mfu.endswith("%"), note
        else:
            assert note.startswith("1 iteration(s)"), note
