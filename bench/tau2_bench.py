"""τ²-bench end to end through `python -m spade_jax.serve`: its own CLI, a few tasks per domain.

Starts the server on a loopback port, puts a logging proxy in front of it, then runs
τ²-bench's own `tau2 run` once per domain with the served model as the agent (and, unless
`--user_llm` names another, as the user simulator too). Every request the harness sends is
written to `OUT/requests.jsonl` (domain, route, status, seconds, prompt/cached/completion
tokens, the error message of a non-200); the server's own output (its access log too) goes
to `OUT/server.log`, τ²'s to `OUT/tau2_<domain>.log` and its results to
`OUT/<domain>/results.json`. Prints (and writes to `OUT/table.md`) one row per domain: tasks,
pass^1 (τ²'s, from its results), requests, errors (non-200 responses), and stops the server.

The preset must hold τ²'s prompts: the server's window is the model's context
(`max_position_embeddings`, `max_model_len` in `/v1/models`), and a prompt plus `max_tokens`
beyond it is refused (OpenAI's `context_length_exceeded`). Retail's first agent prompt (policy
and 16 tools) is 5,163 tokens in SmolLM2-135M-Instruct's tokenizer (the default preset,
context 8192) and 6,623 in `tiny`'s (context 4096: refused, issue 47). `--max_steps` and `--max_tokens`
bound how far a conversation grows past it.

τ²-bench is not a dependency of spade_jax: install it from its public repository into its
own Python 3.12 venv, then pass both paths:

    git clone https://github.com/sierra-research/tau2-bench /work/tau2/tau2-bench
    PYENV_VERSION=3.12.1 python3.12 -m venv /work/tau2/venv    # any Python 3.12 or 3.13
    /work/tau2/venv/bin/pip install -e /work/tau2/tau2-bench
    nice -n 10 .venv/bin/python bench/tau2_bench.py --tau2_venv=/work/tau2/venv \\
        --tau2_repo=/work/tau2/tau2-bench --out=/tmp/tau2_bench

With the served model as user simulator the numbers measure this server and a 135M model
talking to itself; τ²'s published numbers use a GPT-4-class user simulator, so they are not
comparable. A user simulator elsewhere: `--user_llm=openai/gpt-4.1 --user_llm_args='{}'`
(litellm reads its key from the environment as usual; only the agent's requests are
routed to the server, by `api_base` in the agent's llm-args, not by OPENAI_API_BASE).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOMAINS = ("mock", "retail")
SERVED = "served"  # --user_llm value: the user simulator is the served model too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the τ² venv and checkout checked (one message naming how to make them)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tau2_venv", required=True, help="the venv τ²-bench is installed in (has bin/tau2)")
    parser.add_argument("--tau2_repo", required=True, help="the tau2-bench checkout (its data/tau2/ is read)")
    parser.add_argument("--out", required=True, help="directory for the request log, logs, results and table")
    parser.add_argument("--domains", default=",".join(DOMAINS), help="comma-separated τ² domains")
    parser.add_argument("--num_tasks", type=int, default=3, help="tasks per domain (τ²'s --num-tasks)")
    parser.add_argument("--max_steps", type=int, default=12, help="τ²'s --max-steps per simulation")
    parser.add_argument("--max_tokens", type=int, default=96, help="tokens per reply (agent and served user)")
    parser.add_argument("--concurrency", type=int, default=1, help="τ²'s --max-concurrency")
    parser.add_argument("--sim_timeout", type=float, default=900, help="τ²'s --timeout: seconds per simulation")
    parser.add_argument("--domain_timeout", type=float, default=3600, help="seconds before a domain's run is killed")
    parser.add_argument("--user_llm", default=SERVED, help=f"'{SERVED}' (the served model) or a litellm model")
    parser.add_argument("--user_llm_args", default=None, help="JSON llm-args for a --user_llm other than served")
    parser.add_argument("--config", default="configs/smollm2_135m.py", help="the preset served")
    parser.add_argument("--workdir", default=None, help="the served run (default: OUT/serve, initial weights)")
    parser.add_argument("--step", default="none", help="checkpoint step served (spade_jax.serve --step)")
    parser.add_argument("--rows", type=int, default=4, help="engine rows (spade_jax.serve --rows)")
    parser.add_argument("--start_timeout", type=float, default=600, help="seconds for the server to come up")
    args = parser.parse_args(argv)
    args.tau2_venv, args.tau2_repo, args.out = (Path(p).expanduser().resolve()
                                                for p in (args.tau2_venv, args.tau2_repo, args.out))
    how = ("install τ²-bench in its own venv: git clone https://github.com/sierra-research/tau2-bench REPO; "
           "python3.12 -m venv VENV; VENV/bin/pip install -e REPO")
    if not (args.tau2_venv / "bin" / "tau2").is_file():
        parser.error(f"--tau2_venv={args.tau2_venv} has no bin/tau2: {how}")
    args.domains = [d for d in args.domains.split(",") if d]
    if not args.domains:
        parser.error("--domains names no domain")
    for domain in args.domains:
        if not (args.tau2_repo / "data" / "tau2" / "domains" / domain).is_dir():
            parser.error(f"--tau2_repo={args.tau2_repo} has no data/tau2/domains/{domain}: {how}")
    for name in ("num_tasks", "max_steps", "max_tokens", "concurrency", "rows"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.user_llm == SERVED and args.user_llm_args is not None:
        parser.error("--user_llm_args is for a --user_llm other than the served model")
    if args.user_llm_args is not None:
        try:
            args.user_llm_args = json.loads(args.user_llm_args)
        except ValueError as e:
            parser.error(f"--user_llm_args is not JSON: {e}")
        if not isinstance(args.user_llm_args, dict):
            parser.error("--user_llm_args must be a JSON object")
    args.workdir = Path(args.workdir).expanduser().resolve() if args.workdir else args.out / "serve"
    return args


# ---- the request log: a proxy in front of the server


def _reply_fields(status: int, data: bytes) -> dict:
    """What the request log keeps of one response body: usage and tool calls, or the error."""
    try:
        body = json.loads(data)
    except ValueError:
        return {} if status == 200 else {"error": data[:300].decode("utf-8", "replace")}
    if not isinstance(body, dict):
        return {}
    if status != 200:
        error = body.get("error") if isinstance(body.get("error"), dict) else {}
        return {"error": str(error.get("message", body))[:300], "code": error.get("code")}
    usage = body.get("usage") or {}
    choice = (body.get("choices") or [{}])[0]
    return {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "finish_reason": choice.get("finish_reason"),
            "tool_calls": len((choice.get("message") or {}).get("tool_calls") or [])}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        tag, start = self.server.tag, time.monotonic()  # the domain running when the request came
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=self.server.upstream_timeout)
        try:
            upstream.request(self.command, self.path, body,
                             {"Content-Type": self.headers.get("Content-Type", "application/json")})
            response = upstream.getresponse()
            status, content_type, data = response.status, response.getheader("Content-Type"), response.read()
        except OSError as e:  # the server is gone or stalled: the client sees a 502, the log says why
            status, content_type = 502, "application/json"
            data = json.dumps({"error": {"message": f"proxy: {type(e).__name__}: {e}"}}).encode()
        finally:
            upstream.close()
        # logged before the client has its reply: once `tau2 run` exits, the log holds all of its requests
        self.server.record(tag, {"method": self.command, "path": self.path, "status": status,
                                 "seconds": round(time.monotonic() - start, 3), **_reply_fields(status, data)})
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args) -> None:  # the JSONL log is the record
        del format, args


class LoggingProxy(http.server.ThreadingHTTPServer):
    """Forwards every request to `upstream_url` as it is; appends one JSON line per request to `log_path`,
    tagged with `tag` (the domain the script is running)."""

    daemon_threads = True

    def __init__(self, upstream_url: str, log_path: Path, upstream_timeout: float = 3600):
        super().__init__(("127.0.0.1", 0), _Handler)
        parsed = urllib.parse.urlsplit(upstream_url)
        self.upstream = (parsed.hostname, parsed.port)
        self.upstream_timeout = upstream_timeout
        self.tag = ""
        self._log = open(log_path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, name="tau2-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def record(self, tag: str, entry: dict) -> None:
        with self._lock:
            self._log.write(json.dumps({"domain": tag, "time": round(time.time(), 3), **entry}) + "\n")
            self._log.flush()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
        self._log.close()


# ---- the table


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def request_summary(entries: list[dict], domain: str) -> dict:
    """Requests of `domain` in the log: counts, non-200s, prompt sizes, tokens, reused prefix share."""
    mine = [e for e in entries if e.get("domain") == domain]
    ok = [e for e in mine if e["status"] == 200]
    prompt = sum(e.get("prompt_tokens") or 0 for e in ok)
    cached = sum(e.get("cached_tokens") or 0 for e in ok)
    return {"requests": len(mine), "errors": sum(e["status"] != 200 for e in mine),
            "statuses": dict(sorted(collections.Counter(e["status"] for e in mine).items())),
            "tool_calls": sum(e.get("tool_calls") or 0 for e in ok),
            "max_prompt_tokens": max((e.get("prompt_tokens") or 0 for e in ok), default=0),
            "completion_tokens": sum(e.get("completion_tokens") or 0 for e in ok),
            "cached_share": cached / prompt if prompt else 0.0,
            "seconds": sum(e["seconds"] for e in mine)}


def results_summary(results: dict) -> dict:
    """Tasks, pass^1 and terminations from τ²'s results.json, as τ²'s metrics compute them: a simulation
    succeeds at reward 1 (within 1e-6), infrastructure errors are left out, pass^1 is the mean over tasks
    of each task's success rate."""
    sims = results.get("simulations") or []
    terminations = collections.Counter(str(s.get("termination_reason")) for s in sims)
    by_task = collections.defaultdict(list)
    for s in sims:
        if s.get("termination_reason") != "infrastructure_error":
            reward = (s.get("reward_info") or {}).get("reward")
            by_task[s["task_id"]].append(reward is not None and abs(reward - 1.0) <= 1e-6)
    pass1 = sum(sum(v) / len(v) for v in by_task.values()) / len(by_task) if by_task else float("nan")
    return {"tasks": len({s["task_id"] for s in sims}), "simulations": len(sims), "pass1": pass1,
            "terminations": dict(sorted(terminations.items()))}


_ACCESS_LINE = re.compile(r"\s\S+:\d+ POST (/v1/\S+) (\d{3})(\s|$)")


def server_log_statuses(text: str) -> dict[int, int]:
    """Statuses of the POSTs to /v1/ in the server's own access log (one line per request)."""
    return dict(sorted(collections.Counter(int(m.group(2)) for m in map(_ACCESS_LINE.search, text.splitlines())
                                           if m).items()))


def table(rows: list[dict]) -> str:
    """The markdown table: one row per domain, from `request_summary` and `results_summary` (and status)."""
    lines = ["| domain | tasks | pass^1 | requests | errors (non-200) | tool calls | max prompt tokens | "
             "prefix reused | terminations | wall s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        ends = ", ".join(f"{k} {v}" for k, v in r["terminations"].items()) or "-"
        if r.get("status"):
            ends += f" ({r['status']})"
        lines.append(f"| {r['domain']} | {r['tasks']} | {r['pass1']:.3f} | {r['requests']} | {r['errors']} | "
                     f"{r['tool_calls']} | {r['max_prompt_tokens']} | {r['cached_share']:.0%} | {ends} | "
                     f"{r['wall']:.0f} |")
    return "\n".join(lines)


# ---- the run


def tau2_command(args: argparse.Namespace, domain: str, model: str, api_base: str) -> list[str]:
    """`tau2 run` on `domain` with the served model as agent (api_base in its llm-args) and the chosen user."""
    served = {"temperature": 0.0, "max_tokens": args.max_tokens, "api_base": api_base, "api_key": "unused"}
    user_llm, user_args = (f"openai/{model}", served) if args.user_llm == SERVED else (args.user_llm,
                                                                                       args.user_llm_args or {})
    return [str(args.tau2_venv / "bin" / "tau2"), "run", "--domain", domain,
            "--agent-llm", f"openai/{model}", "--agent-llm-args", json.dumps(served),
            "--user-llm", user_llm, "--user-llm-args", json.dumps(user_args),
            "--num-tasks", str(args.num_tasks), "--num-trials", "1", "--max-steps", str(args.max_steps),
            "--max-concurrency", str(args.concurrency), "--timeout", str(args.sim_timeout),
            "--save-to", str(args.out / domain)]


def start_server(args: argparse.Namespace, port: int, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "spade_jax.serve", f"--config={args.config}", f"--workdir={args.workdir}",
               f"--step={args.step}", f"--port={port}", f"--rows={args.rows}"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + args.start_timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise SystemExit(f"the server did not start (see {log.name})")
            time.sleep(1)


def run_domain(args: argparse.Namespace, domain: str, model: str, proxy: LoggingProxy) -> dict:
    """One `tau2 run`, bounded by --domain_timeout; its results and requests summarised."""
    results_path = args.out / domain / "results.json"
    if results_path.exists():  # τ² would resume a run with this name; each bench run starts fresh
        results_path.unlink()
    proxy.tag = domain
    status, start = "", time.monotonic()
    with open(args.out / f"tau2_{domain}.log", "w") as log:
        proc = subprocess.Popen(tau2_command(args, domain, model, proxy.url + "/v1"), cwd=args.tau2_repo,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=args.domain_timeout)
            if code:
                status = f"tau2 exited {code}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"killed after {args.domain_timeout:.0f} s"
    wall = time.monotonic() - start
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    return {"domain": domain, "wall": wall, "status": status, **results_summary(results),
            **request_summary(read_log(args.out / "requests.jsonl"), domain)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    (args.out / "requests.jsonl").unlink(missing_ok=True)
    port = _free_port()
    with open(args.out / "server.log", "w") as server_log:
        proc = start_server(args, port, server_log)
        try:
            models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read())
            model, context = models["data"][0]["id"], models["data"][0].get("max_model_len")
            rows = []
            with LoggingProxy(f"http://127.0.0.1:{port}", args.out / "requests.jsonl") as proxy:
                for domain in args.domains:
                    rows.append(run_domain(args, domain, model, proxy))
                    print(f"{domain}: {rows[-1]}", file=sys.stderr, flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    user = "the served model" if args.user_llm == SERVED else args.user_llm
    logged = server_log_statuses((args.out / "server.log").read_text(errors="replace"))
    proxied = collections.Counter(e["status"] for e in read_log(args.out / "requests.jsonl") if e["method"] == "POST")
    agree = "agrees with" if logged == dict(proxied) else "DISAGREES with"
    text = (f"τ²-bench through spade_jax.serve: agent {model} (context {context}, {args.config}, step "
            f"{args.step}), user simulator {user}; {args.num_tasks} tasks per domain, 1 trial, max {args.max_steps} "
            f"steps, max_tokens {args.max_tokens}, temperature 0, concurrency {args.concurrency}\n\n{table(rows)}\n\n"
            f"The server's access log: POST statuses {logged} ({agree} the proxy's request log).\n")
    (args.out / "table.md").write_text(text)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    print("\n" + text)


if __name__ == "__main__":
    main()
