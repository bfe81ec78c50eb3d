"""One timed pass over what an accelerator changes, as one markdown table (`bench/device_check.sh`).

    python bench/device_check.py --out=device_check.md          # on the GPU: about 7 minutes
    python bench/device_check.py --dry-run --out=/tmp/dry.md    # on CPU: the same code on toy shapes
    python bench/device_check.py --only=engine:qwen3_4b --budget-scale=3   # one job, more time

Jobs, each in its own subprocess with a wall-clock budget (a job past it is killed; the rows it
finished stay, the others say they were not reached), one after the other on the device:

- `engine:<model>`: the rollout engine (`generate_on_rows`) on random weights of the preset's
  published shape, sampling from the bfloat16 copy of float32 masters (`SamplingWeights`, as the
  loop does), at 32/128/256 rows x 2k/8k contexts (prompt = context - new tokens; every row
  decodes `NEW_TOKENS`). Prefill tok/s = prompt tokens / append seconds, decode tok/s =
  generated tokens / decode seconds, compilation apart. A combination whose KV cache and weights
  exceed `FIT_SHARE` of the device memory is skipped, saying so.
- `hf:<model>`: transformers' `generate` (torch, sdpa, bfloat16, greedy, no stop) on random
  weights of the same shape, same rows and contexts: prefill = a 1-token `generate`, decode =
  the `NEW_TOKENS` call minus it.
- `update:<model>`: `Trainer.update` (pg objective, float32 masters, bfloat16 compute) on
  16k tokens per step (bench/train_step.py's batch: the loss on each row's second half), the
  median of the timed steps after the compiling one; MFU = `model_flops` / step time / the
  chip's dense bfloat16 peak.
- `tiny`: `python -m spade_jax.main --config=configs/tiny.py:runlocal` end to end (bootstrap
  included unless one is given; on an accelerator it samples from the loop's bfloat16 copy),
  started first and run beside the other jobs (its own process, memory allocated on demand).

Peak memory is the process's device peak after the row (rows run smallest first). `--dry-run`
runs every job on CPU with toy shapes (a 2-layer model, 2 rows, contexts of 48/96 tokens, a few
steps) under short budgets; the table keeps the real rows' labels.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODELS = ("qwen3_0p6b", "qwen3_4b")
ROWS = (32, 128, 256)
CONTEXTS = (2048, 8192)
NEW_TOKENS = 64
UPDATE_TOKENS = 16384
UPDATE_ROW_LENGTH = 8192
PEAK_FLOPS = 989e12  # H200 (as H100 SXM): dense bfloat16 tensor-core peak, no sparsity
FIT_SHARE = 0.85  # of the H200's memory (memory_plan.CHIP_HBM_GIB): a combination's KV cache and weights fit in it
BUDGET_S = {"engine:qwen3_0p6b": 80, "engine:qwen3_4b": 110, "hf:qwen3_0p6b": 40, "hf:qwen3_4b": 50,
            "update:qwen3_0p6b": 45, "update:qwen3_4b": 75, "tiny": 300}
DRY_BUDGET_S = {**{job: 120 for job in BUDGET_S}, "tiny": 240}  # bounds on a loaded CPU, not durations
DRY = dict(rows=2, contexts={2048: 48, 8192: 96}, new_tokens=4, update_rows=2, update_row_length=32)
COLUMNS = ("job", "model", "shape", "prefill tok/s", "decode tok/s", "step s", "MFU", "peak GiB", "compile s",
           "note")


@dataclasses.dataclass
class Row:
    """One line of the table; a measurement left None is an empty cell."""

    job: str
    model: str
    shape: str
    prefill: float | None = None
    decode: float | None = None
    step_s: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None
    compile_s: float | None = None
    note: str = ""

    def cells(self) -> list[str]:
        def num(x, fmt):
            return "" if x is None else format(x, fmt)

        return [self.job, self.model, self.shape, num(self.prefill, ",.0f"), num(self.decode, ",.0f"),
                num(self.step_s, ".3f"), num(self.mfu, ".1%"), num(self.peak_gib, ".1f"), num(self.compile_s, ".1f"),
                self.note.replace("|", "/").replace("\n", " ")[:300]]


# ---- shapes


def arch(name: str, dry: bool):
    """The preset's published shape, or a 2-layer toy of the same family for a dry run."""
    from spade_jax.sampling.memory_plan import PUBLISHED_ARCHITECTURES

    cfg = PUBLISHED_ARCHITECTURES[name]
    if dry:
        cfg = cfg.replace(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=16)
    return cfg.replace(dtype="bfloat16", param_dtype="float32")


def sampling_shapes(name: str) -> list[tuple[int, int, str | None]]:
    """(rows, context, why skipped or None), smallest first, by the real shapes' memory."""
    from spade_jax.sampling.memory_plan import CHIP_HBM_GIB

    cfg, device_gib = arch(name, dry=False), CHIP_HBM_GIB["h200"]
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    weights = 2 * cfg.num_params
    out = []
    for rows, context in sorted(((r, c) for r in ROWS for c in CONTEXTS), key=lambda rc: (rc[0] * rc[1], rc[1])):
        need = (kv_per_token * rows * context + weights) / 2**30
        skip = (f"skipped: KV cache + bf16 weights {need:.0f} GiB > {FIT_SHARE:.0%} of {device_gib:.0f} GiB"
                if need > FIT_SHARE * device_gib else None)
        out.append((rows, context, skip))
    return out


def planned(job: str) -> list[Row]:
    """Every row `job` reports, in order, before it runs (the ones it never reaches keep a note)."""
    if job == "tiny":
        return [Row("tiny:runlocal e2e", "tiny", "runlocal")]
    kind, name = job.split(":")
    if kind == "update":
        rows = UPDATE_TOKENS // UPDATE_ROW_LENGTH
        return [Row("update", name, f"{rows} x {UPDATE_ROW_LENGTH} tok")]
    label = "engine" if kind == "engine" else "hf generate"
    return [Row(label, name, f"{r} x {c}", note=skip or "") for r, c, skip in sampling_shapes(name)]


def jobs() -> list[str]:
    return ["tiny"] + [f"{kind}:{m}" for kind in ("engine", "hf", "update") for m in MODELS]


# ---- children: one job each, a JSON line per finished row on stdout


def emit(row: Row) -> None:
    print("ROW " + json.dumps(dataclasses.asdict(row)), flush=True)


def device_peak_gib() -> float | None:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else None


def shape_of(row: Row, dry: bool) -> tuple[int, int, int]:
    """(rows, prompt tokens, new tokens) of a sampling row, toy-sized in a dry run."""
    rows, context = (int(x) for x in row.shape.split(" x "))
    new = DRY["new_tokens"] if dry else NEW_TOKENS
    if dry:
        rows, context = DRY["rows"], DRY["contexts"][context]
    return rows, context - new, new


def run_engine(name: str, dry: bool) -> None:
    import numpy as np

    from spade_jax.models import random_policy
    from spade_jax.models.sampling_weights import SamplingWeights
    from spade_jax.sampling import generate_on_rows

    cfg = arch(name, dry)
    policy = SamplingWeights(random_policy(cfg), "bfloat16").policy  # the masters are dropped here
    for row in planned(f"engine:{name}"):
        if row.note:
            emit(row)
            continue
        try:
            rows, prompt, new = shape_of(row, dry)
            prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, prompt)).tolist()
            stats = generate_on_rows(policy, prompts, max_new_tokens=new, rows=rows, stop_token_ids=[]).stats
            row.prefill = rows * prompt / stats.prefill_s
            row.decode = rows * new / stats.decode_s
            row.compile_s, row.peak_gib = stats.compile_s, device_peak_gib()
            row.note = f"append {stats.prefill_s:.2f} s, decode {stats.decode_s:.2f} s ({stats.steps} steps)"
        except Exception as err:  # the table says what failed; the next row runs
            row.note = f"error: {type(err).__name__}: {err}"
        emit(row)


def run_hf(name: str, dry: bool) -> None:
    import torch
    import transformers

    from spade_jax.export.hf import hf_config

    transformers.utils.logging.disable_progress_bar()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = hf_config(arch(name, dry), dtype="bfloat16")
    config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None  # no early stop: every row decodes every token

    @torch.no_grad()
    def timed(ids, new: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, pad_token_id=0)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    generator = torch.Generator().manual_seed(0)
    timed(torch.randint(0, config.vocab_size, (1, 8), generator=generator).to(device), 2)  # warm-up
    for row in planned(f"hf:{name}"):
        if row.note:
            emit(row)
            continue
        try:
            rows, prompt, new = shape_of(row, dry)
            ids = torch.randint(0, config.vocab_size, (rows, prompt), generator=generator).to(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            first_s = timed(ids, 1)
            all_s = timed(ids, new)
            row.prefill = rows * prompt / first_s
            row.decode = rows * (new - 1) / (all_s - first_s) if all_s > first_s else None
            if device == "cuda":
                row.peak_gib = torch.cuda.max_memory_allocated() / 2**30
            row.note = f"1 token {first_s:.2f} s, {new} tokens {all_s:.2f} s"
        except Exception as err:
            row.note = f"error: {type(err).__name__}: {err}"
        emit(row)


def model_flops(cfg, rows: int, length: int, trained: int) -> float:
    """FLOPs one update needs: forward and backward (3 x 2 per weight and token) through the body on
    every token, through the LM head on the `trained` (loss-masked) tokens only, as the trainer runs
    it, and causal attention's q.k and p.v at an average context of length / 2. Embedding lookups
    and rematerialisation are not counted."""
    D, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    body = L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F)
    attention = 2 * 2 * L * N * H * (length / 2)
    return 3 * (rows * length * (2 * body + attention) + trained * 2 * V * D)


def run_update(name: str, dry: bool) -> None:
    import jax

    from bench.train_step import make_batch
    from spade_jax.models import random_policy
    from spade_jax.rl.train import LossConfig, OptimConfig, Trainer

    (row,) = planned(f"update:{name}")
    try:
        cfg = arch(name, dry)
        rows, length = ((DRY["update_rows"], DRY["update_row_length"]) if dry
                        else (UPDATE_TOKENS // UPDATE_ROW_LENGTH, UPDATE_ROW_LENGTH))
        batch = make_batch(rows, length, cfg.vocab_size)
        trainer = Trainer(random_policy(cfg), OptimConfig(lr=1e-6), LossConfig(micro_batch_rows=1, remat="dots"))
        start = time.perf_counter()
        trainer.update(batch)
        row.compile_s = time.perf_counter() - start  # compilation and the first step
        times = [trainer.update(batch)["step_time_s"] for _ in range(2 if dry else 3)]
        row.step_s = statistics.median(times)
        row.mfu = model_flops(cfg, rows, length, int(batch.target_mask_RT.sum())) / row.step_s / PEAK_FLOPS
        row.peak_gib = device_peak_gib()
        steps = ", ".join(f"{t:.3f}" for t in times)
        row.note = (f"{rows * length / row.step_s:,.0f} tok/s; micro-batches of 1 row, remat dots, f32 masters + "
                    f"Adam; compile s includes the first step; steps {steps} s on {jax.devices()[0].device_kind}")
    except Exception as err:
        row.note = f"error: {type(err).__name__}: {err}"
    emit(row)


def run_tiny(dry: bool, bootstrap: str, workdir: str) -> None:
    """The main job on `tiny:runlocal` (one iteration in a dry run), its bootstrap cached in `bootstrap`
    (built there when it holds none)."""
    (row,) = planned("tiny")
    built = not any(Path(bootstrap).glob("bootstrap-*"))
    command = [sys.executable, "-m", "spade_jax.main", "--config=configs/tiny.py:runlocal", f"--workdir={workdir}",
               f"--config.bootstrap.cache_dir={bootstrap}"] + ["--config.num_iterations=1"] * dry
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    metrics = Path(workdir, "metrics.jsonl")
    iterations = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    if done.returncode:
        row.note = f"error: exit {done.returncode} after {wall:.0f} s: {done.stderr.strip()[-240:]}"
    else:
        row.note = f"{iterations} iteration(s) in {wall:.0f} s wall (bootstrap {'built' if built else 'cached'})"
    emit(row)


def child(job: str, args) -> None:
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        from spade_jax import compile_cache

        compile_cache.enable(os.environ["JAX_COMPILATION_CACHE_DIR"])  # every program, however fast it compiled
    if job == "tiny":
        return run_tiny(args.dry_run, args.tiny_bootstrap, args.workdir)
    kind, name = job.split(":")
    {"engine": run_engine, "hf": run_hf, "update": run_update}[kind](name, args.dry_run)


# ---- parent


def xla_cache(args) -> str | None:
    """The persistent compilation cache the jobs share (a rerun loads its programs), or None."""
    if args.xla_cache == "none" or (args.dry_run and not args.xla_cache):
        return None
    return os.path.abspath(args.xla_cache or ROOT / "workdirs" / "device_check_xla")


def child_env(job: str, args) -> dict:
    dry = args.dry_run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if xla_cache(args):
        env["JAX_COMPILATION_CACHE_DIR"] = xla_cache(args)
    if dry:
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # toy programs: compiling is their cost
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif job == "tiny":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # it runs beside the other jobs
    else:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.9"
    return env


@dataclasses.dataclass
class Running:
    """A started job: its process, the file its stderr goes to, its budget and deadline."""

    job: str
    proc: subprocess.Popen
    stderr: Path
    budget: float
    deadline: float


def start(job: str, args, budget: float, scratch: str) -> Running:
    """Starts `job` in its own process group (a timed-out job is killed with its children)."""
    command = [sys.executable, __file__, f"--job={job}", f"--workdir={os.path.join(scratch, 'tiny')}"]
    home = scratch if args.dry_run else ROOT / "workdirs"
    bootstrap = args.tiny_bootstrap or os.path.join(home, "device_check_bootstrap")
    command += ["--dry-run"] * args.dry_run + [f"--tiny-bootstrap={bootstrap}"]
    stderr = Path(scratch, job.replace(":", "_") + ".stderr")
    with stderr.open("w") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=child_env(job, args), stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)
    return Running(job, proc, stderr, budget, time.monotonic() + budget)


def collect(run: Running, stopped: str = "") -> list[Row]:
    """The job's rows: those it reported, then its planned ones it did not reach (with why). With
    `stopped` (why the check stops), the job is given a second to finish, then killed."""
    try:
        out, _ = run.proc.communicate(timeout=1.0 if stopped else max(1.0, run.deadline - time.monotonic()))
        why = f"not reached: the job exited {run.proc.returncode}: {run.stderr.read_text().strip()[-240:]}"
    except subprocess.TimeoutExpired:
        os.killpg(run.proc.pid, signal.SIGKILL)
        out, _ = run.proc.communicate()
        why = f"not reached: {stopped}" if stopped else f"not reached within the job's {run.budget:.0f} s budget"
    done = [Row(**json.loads(line[4:])) for line in out.splitlines() if line.startswith("ROW ")]
    plan = planned(run.job)
    return done + [dataclasses.replace(r, note=r.note or why) for r in plan[len(done):]]


def table(rows: list[Row], args, wall: float) -> str:
    import jax  # the version only: the parent never starts a backend (the jobs hold the device)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    cache = xla_cache(args)
    new = DRY["new_tokens"] if args.dry_run else NEW_TOKENS
    head = (f"Device check{' (dry run: toy shapes on CPU)' if args.dry_run else ''}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit "
            f"{commit.stdout.strip() or '?'}, jax {jax.__version__}, {wall:.0f} s. MFU against "
            f"{PEAK_FLOPS / 1e12:.0f} TFLOP/s (H200 dense bf16 peak). Engine rows sample {new} new tokens per "
            f"row from bf16 copies of f32 masters. Peaks are per process. Compile s: "
            f"{f'programs an earlier run compiled load from {cache}' if cache else 'no persistent cache'}.\n\n")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return head + "\n".join(lines) + "\n"


def write(selected: list[str], results: dict[str, list[Row]], args, begin: float) -> str:
    """Writes the table: every selected job's rows, planned rows for the jobs not done yet."""
    pending = f"not reached: the check stopped before this job ({time.monotonic() - begin:.0f} s)"
    rows = [r for job in selected
            for r in results.get(job) or [dataclasses.replace(p, note=p.note or pending) for p in planned(job)]]
    text = table(rows, args, time.monotonic() - begin)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU, toy shapes, short budgets")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", tempfile.gettempdir()), "device_check.md"))
    p.add_argument("--only", default="", help="comma-separated jobs (default: all): " + ",".join(jobs()))
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiplies every job's budget")
    p.add_argument("--xla-cache", default="", help="persistent compilation cache the jobs share (default "
                   "workdirs/device_check_xla; none in a dry run); 'none' = off")
    p.add_argument("--tiny-bootstrap", default="", help="the tiny run's bootstrap cache (default "
                   "workdirs/device_check_bootstrap, built by the first run; a scratch one in a dry run)")
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        return child(args.job, args)
    selected = [j for j in jobs() if not args.only or j in args.only.split(",")]
    budgets = {j: (DRY_BUDGET_S if args.dry_run else BUDGET_S)[j] * args.budget_scale for j in selected}
    begin = time.monotonic()
    results: dict[str, list[Row]] = {}
    running: list[Running] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` in device_check.sh: clean up, then go
    with tempfile.TemporaryDirectory(prefix="device_check_") as scratch:
        try:
            if "tiny" in selected:
                running.append(start("tiny", args, budgets["tiny"], scratch))
            for job in selected:
                if job != "tiny":
                    running.append(start(job, args, budgets[job], scratch))
                    results[job] = collect(running[-1])
                    write(selected, results, args, begin)  # a table so far, should the check be cut short
                    print(f"{job}: done at {time.monotonic() - begin:.0f} s", file=sys.stderr, flush=True)
            if "tiny" in selected:
                results["tiny"] = collect(running[0])
        finally:  # a stopped check (SIGTERM) keeps the rows its running jobs finished
            for run in running:
                if run.job not in results:
                    results[run.job] = collect(run, stopped=f"the check stopped at {time.monotonic() - begin:.0f} s")
            print(write(selected, results, args, begin))


if __name__ == "__main__":
    main()
