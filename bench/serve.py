"""Load test of `python -m spade_jax.serve`: throughput and latency at several client counts.

Starts the server on a free loopback port, then for each client count C runs C concurrent
clients (the official `openai` client, one thread each) sending M chat requests each, one
after the other; every request must be answered exactly once (a 200 with a unique id, and
the server's own count of answered requests agrees). An untimed pass of the same load
(``--warmup`` requests per client) first compiles the shape buckets that level uses: the
engine compiles each once for the server's lifetime, so the table is the steady state; its
last column says how long the timed pass still spent compiling. Prints a markdown table and stops the server (SIGTERM).

``--mixed=K`` measures mixed load instead: K two-token greedy chats, one after another, on the idle
server and then beside a streaming completion with n=8, temperature 1.9 and max_tokens 2048
(before per-row sampling, such a request held every other setting back for its whole length).

    nice -n 10 python bench/serve.py --workdir=/tmp/rl_fresh2
    nice -n 10 python bench/serve.py --workdir=/tmp/serve_smollm2 --config=configs/smollm2_135m.py --step=none \\
        --requests=2 --max_tokens=32
    nice -n 10 python bench/serve.py --workdir=/tmp/rl_fresh2 --mixed=10
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
import threading
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
    command = [sys.executable, "-m", "spade_jax.serve", f"--workdir={args.workdir}",
               *([f"--config={args.config}"] if args.config else []),
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


def run_mixed(client_factory, model: str, url: str, shorts: int) -> dict:
    """Latencies of `shorts` two-token greedy chats on the idle server, then beside a streaming
    n=8, temperature 1.9, max_tokens 2048 completion (and how many of its rows still decoded)."""
    client = client_factory()

    def short(i: int) -> float:
        start = time.perf_counter()
        client.chat.completions.create(model=model, max_tokens=2, temperature=0,
                                       messages=[{"role": "user", "content": f"hello {i}"}])
        return time.perf_counter() - start

    idle = [short(i) for i in range(shorts)]
    stop, started = threading.Event(), threading.Event()

    def long() -> None:
        stream = client_factory().completions.create(model=model, prompt="Write a long environment.", n=8,
                                                     temperature=1.9, max_tokens=2048, stream=True, seed=0)
        for _ in stream:
            started.set()
            if stop.is_set():
                break
        stream.close()

    thread = threading.Thread(target=long)
    thread.start()
    started.wait(600)
    busy, decoding, compile_s = [], [], _health(url)["compile_s"]
    for i in range(shorts):
        decoding.append(_health(url)["decoding"])
        busy.append(short(i))
    compile_s = _health(url)["compile_s"] - compile_s
    stop.set()
    thread.join()
    return {"idle": idle, "busy": busy, "decoding": decoding, "compile_s": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--config", default="", help="a preset (default: the run's own config)")
    parser.add_argument("--step", default="latest")
    parser.add_argument("--bootstrap", default="", help="a bootstrap directory (spade_jax.serve --bootstrap)")
    parser.add_argument("--clients", default="1,4,16,32", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2, help="untimed requests per client before each level")
    parser.add_argument("--start_timeout", type=float, default=240)
    parser.add_argument("--mixed", type=int, default=0, help="measure mixed load with this many short chats")
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
            if args.mixed:
                run_mixed(factory, model, url, args.mixed)  # untimed: compiles the buckets the long reply grows through
                mixed = run_mixed(factory, model, url, args.mixed)
            for clients in (int(c) for c in args.clients.split(",") if not args.mixed):
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
    if args.mixed:
        print(f"\nspade_jax.serve on {model} ({args.rows} rows): {args.mixed} two-token greedy chats in turn\n")
        print("| server | chats | p50 s | max s | rows decoding the long request when each chat was sent |")
        print("| --- | ---: | ---: | ---: | --- |")
        for name, times in (("idle", mixed["idle"]), ("beside n=8, T=1.9, 2048 tokens", mixed["busy"])):
            rows_note = ", ".join(map(str, mixed["decoding"])) if times is mixed["busy"] else "-"
            print(f"| {name} | {len(times)} | {np.median(times):.2f} | {max(times):.2f} | {rows_note} |")
        print(f"\n(the server compiled for {mixed['compile_s']:.1f} s while the chats beside it ran)")
        return
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
