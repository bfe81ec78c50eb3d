"""Load test of `python -m spade_jax.serve`: throughput and latency at several client counts.

Starts the server on a free loopback port, then for each client count C runs C concurrent
clients (the official `openai` client, one thread each) sending M chat requests each, one
after the other; every request must be answered exactly once (a 200 with a unique id, and
the server's own count of answered requests agrees). An untimed pass of the same load
(``--warmup`` requests per client) first compiles the shape buckets that level uses: the
engine compiles each once for the server's lifetime, so the table is the steady state; its
last column says how long the timed pass still spent compiling. Prints a markdown table and stops the server (SIGTERM).

    nice -n 10 python bench/serve.py --workdir=/tmp/rl_fresh2 --config=configs/tiny.py
    nice -n 10 python bench/serve.py --workdir=/tmp/serve_smollm2 --config=configs/smollm2_135m.py --step=none \\
        --requests=2 --max_tokens=32
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url + "/health", timeout=5).read())


def start_server(args, port: int, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "spade_jax.serve", f"--workdir={args.workdir}", f"--config={args.config}",
               *([f"--bootstrap={args.bootstrap}"] if args.bootstrap else []),
               f"--step={args.step}", f"--port={port}", f"--rows={args.rows}", f"--max_queue={args.rows * 8}"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + args.start_timeout
    while True:
        try:
            _health(f"http://127.0.0.1:{port}")
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"the server did not start (see {log.name})")
            time.sleep(0.5)


def run_level(client_factory, model: str, clients: int, requests: int, max_tokens: int, tag: str) -> dict:
    """`clients` threads, `requests` sequential requests each; per-request latency and tokens."""
    def one_client(c: int) -> list[tuple[str, float, int]]:
        client = client_factory()
        out = []
        for r in range(requests):
            start = time.perf_counter()
            reply = client.chat.completions.create(
                model=model, max_tokens=max_tokens, temperature=1.0, seed=c * 1000 + r,
                messages=[{"role": "user", "content": f"{tag} {c}.{r}: write an environment."}])
            out.append((reply.id, time.perf_counter() - start, reply.usage.completion_tokens))
        return out

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [x for part in pool.map(one_client, range(clients)) for x in part]
    wall = time.perf_counter() - start
    ids = [r[0] for r in results]
    if len(results) != clients * requests or len(set(ids)) != len(ids):
        raise SystemExit(f"{clients} clients: {len(results)} answers, {len(set(ids))} distinct ids")
    latency = np.asarray([r[1] for r in results])
    tokens = sum(r[2] for r in results)
    return {"clients": clients, "requests": len(results), "tokens": tokens, "wall": wall, "tps": tokens / wall,
            "p50": float(np.percentile(latency, 50)), "p99": float(np.percentile(latency, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--config", default="configs/tiny.py")
    parser.add_argument("--step", default="latest")
    parser.add_argument("--bootstrap", default="", help="a bootstrap directory (spade_jax.serve --bootstrap)")
    parser.add_argument("--clients", default="1,4,16,32", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2, help="untimed requests per client before each level")
    parser.add_argument("--start_timeout", type=float, default=240)
    args = parser.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_serve_{port}.log"
    with open(log_path, "w") as log:
        proc = start_server(args, port, log)
        try:
            model = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=5).read())["data"][0]["id"]
            factory = lambda: openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
            rows = []
            for clients in (int(c) for c in args.clients.split(",")):
                run_level(factory, model, clients, args.warmup, args.max_tokens, "warm-up")
                before = _health(url)
                rows.append(run_level(factory, model, clients, args.requests, args.max_tokens, "request"))
                after = _health(url)
                if after.get("answered_done", 0) - before.get("answered_done", 0) != rows[-1]["requests"]:
                    raise SystemExit("the server's answered count disagrees with the clients'")
                rows[-1].update({k: after[k] - before[k] for k in ("compile_s", "append_s", "decode_s", "decode_steps")})
                print(f"{clients} clients: {rows[-1]['tps']:.1f} tokens/s", file=sys.stderr, flush=True)
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)
    base = rows[0]["tps"]
    print(f"\nspade_jax.serve on {model} ({args.rows} rows), {args.requests} requests per client, "
          f"max_tokens={args.max_tokens}, temperature 1\n")
    print("| clients | requests | completion tokens | wall s | tokens/s | vs first | p50 s | p99 s | "
          "decode / append / compile s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['clients']} | {r['requests']} | {r['tokens']} | {r['wall']:.1f} | {r['tps']:.1f} | "
              f"{r['tps'] / base:.1f}x | {r['p50']:.2f} | {r['p99']:.2f} | "
              f"{r['decode_s']:.1f} / {r['append_s']:.1f} / {r['compile_s']:.1f} |")


if __name__ == "__main__":
    main()
