"""bench/tau2_bench.py without τ²-bench: its arguments, the proxy's request log, the table from hand-made logs."""

import http.server
import json
import threading
import urllib.error
import urllib.request

import pytest

from bench import tau2_bench as tau2


def _tau2_install(tmp_path, domains=("mock", "retail")):
    venv, repo = tmp_path / "venv", tmp_path / "tau2-bench"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "tau2").write_text("#!/bin/sh\n")
    for domain in domains:
        (repo / "data" / "tau2" / "domains" / domain).mkdir(parents=True)
    return [f"--tau2_venv={venv}", f"--tau2_repo={repo}", f"--out={tmp_path / 'out'}"]


def test_arguments_default_to_both_domains_and_the_served_user(tmp_path):
    args = tau2.parse_args(_tau2_install(tmp_path))
    assert args.domains == ["mock", "retail"] and args.user_llm == tau2.SERVED
    assert args.workdir == tmp_path / "out" / "serve" and args.config == "configs/smollm2_135m.py"


@pytest.mark.parametrize("broken, message", [
    ("no_tau2", "has no bin/tau2: install τ²-bench in its own venv"),
    ("no_retail", "has no data/tau2/domains/retail"),
    ("served_user_args", "--user_llm_args is for a --user_llm other than the served model"),
    ("bad_json", "--user_llm_args is not JSON"),
    ("zero_tasks", "--num_tasks must be at least 1"),
])
def test_a_missing_install_or_bad_argument_is_one_message(tmp_path, capsys, broken, message):
    argv = _tau2_install(tmp_path, domains=("mock",) if broken == "no_retail" else ("mock", "retail"))
    if broken == "no_tau2":
        (tmp_path / "venv" / "bin" / "tau2").unlink()
    argv += {"served_user_args": ["--user_llm_args={}"], "bad_json": ["--user_llm=openai/x", "--user_llm_args={"],
             "zero_tasks": ["--num_tasks=0"]}.get(broken, [])
    with pytest.raises(SystemExit) as exit_info:
        tau2.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_only_the_agent_and_a_served_user_are_routed_to_the_server(tmp_path):
    install = _tau2_install(tmp_path)

    def llm_args(argv, flag):
        command = tau2.tau2_command(tau2.parse_args(install + argv), "retail", "m-1",
                                    "http://127.0.0.1:9/v1")
        return command[command.index(flag) + 1]

    served = {"temperature": 0.0, "max_tokens": 96, "api_base": "http://127.0.0.1:9/v1", "api_key": "unused"}
    assert json.loads(llm_args([], "--agent-llm-args")) == served
    assert json.loads(llm_args([], "--user-llm-args")) == served and llm_args([], "--user-llm") == "openai/m-1"
    other = ["--user_llm=openai/gpt-4.1", '--user_llm_args={"temperature": 0.5}']
    assert json.loads(llm_args(other, "--user-llm-args")) == {"temperature": 0.5}
    assert llm_args(other, "--user-llm") == "openai/gpt-4.1" and llm_args(other, "--agent-llm") == "openai/m-1"
    assert llm_args([], "--save-to") == str(tmp_path / "out" / "retail")


class _Upstream(http.server.ThreadingHTTPServer):
    """A stand-in server: 200 with usage and a tool call, or OpenAI's 400 context error."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body["messages"][0]["content"] == "too long":
                    status, reply = 400, {"error": {"message": "This model's maximum context length is 8192 tokens",
                                                    "code": "context_length_exceeded"}}
                else:
                    status, reply = 200, {"choices": [{"finish_reason": "tool_calls", "message": {
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 7,
                                  "prompt_tokens_details": {"cached_tokens": 60}}}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def _post(url, content):
    request = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"messages": [{"role": "user", "content": content}]}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_proxy_passes_replies_through_and_logs_each_request(tmp_path):
    upstream = _Upstream()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    log = tmp_path / "requests.jsonl"
    try:
        with tau2.LoggingProxy(f"http://127.0.0.1:{upstream.server_address[1]}", log) as proxy:
            proxy.tag = "mock"
            ok = _post(proxy.url, "hi")
            proxy.tag = "retail"
            refused = _post(proxy.url, "too long")
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert ok[0] == 200 and ok[1]["usage"]["prompt_tokens"] == 100
    assert refused == (400, {"error": {"message": "This model's maximum context length is 8192 tokens",
                                       "code": "context_length_exceeded"}})
    entries = tau2.read_log(log)
    assert [(e["domain"], e["status"], e["path"]) for e in entries] == [
        ("mock", 200, "/v1/chat/completions"), ("retail", 400, "/v1/chat/completions")]
    assert (entries[0]["prompt_tokens"], entries[0]["cached_tokens"], entries[0]["tool_calls"]) == (100, 60, 1)
    assert entries[1]["code"] == "context_length_exceeded" and "maximum context length" in entries[1]["error"]


def test_a_server_that_is_gone_is_a_logged_502(tmp_path):
    closed = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()
    with tau2.LoggingProxy(f"http://127.0.0.1:{port}", tmp_path / "requests.jsonl") as proxy:
        status, body = _post(proxy.url, "hi")
    assert status == 502 and body["error"]["message"].startswith("proxy: ConnectionRefusedError")
    assert [e["status"] for e in tau2.read_log(tmp_path / "requests.jsonl")] == [502]


def test_the_table_from_a_request_log_and_results(tmp_path):
    log = [{"domain": "retail", "status": 200, "seconds": 2.0, "prompt_tokens": 5000, "cached_tokens": 0,
            "completion_tokens": 10, "tool_calls": 1},
           {"domain": "retail", "status": 200, "seconds": 1.0, "prompt_tokens": 5200, "cached_tokens": 4800,
            "completion_tokens": 20, "tool_calls": 0},
           {"domain": "retail", "status": 400, "seconds": 0.5, "error": "too long"},
           {"domain": "mock", "status": 200, "seconds": 9.0, "prompt_tokens": 800, "cached_tokens": 0}]
    requests = tau2.request_summary(log, "retail")
    assert requests == {"requests": 3, "errors": 1, "statuses": {200: 2, 400: 1}, "tool_calls": 1,
                        "max_prompt_tokens": 5200, "completion_tokens": 30, "cached_share": 4800 / 10200,
                        "seconds": 3.5}
    # task a: 2 trials, one at reward 1 (within 1e-6) -> 0.5; task b: 0.99 fails -> 0; task c only an
    # infrastructure error, left out as τ² leaves it out: pass^1 = (0.5 + 0) / 2
    results = {"simulations": [
        {"task_id": "a", "termination_reason": "user_stop", "reward_info": {"reward": 1.0 - 1e-7}},
        {"task_id": "a", "termination_reason": "max_steps", "reward_info": {"reward": 0.0}},
        {"task_id": "b", "termination_reason": "agent_stop", "reward_info": {"reward": 0.99}},
        {"task_id": "c", "termination_reason": "infrastructure_error", "reward_info": None}]}
    outcome = tau2.results_summary(results)
    assert outcome == {"tasks": 3, "simulations": 4, "pass1": 0.25, "terminations": {
        "agent_stop": 1, "infrastructure_error": 1, "max_steps": 1, "user_stop": 1}}
    text = tau2.table([{"domain": "retail", "wall": 12.4, "status": "killed after 60 s", **outcome, **requests}])
    assert text.splitlines()[2] == ("| retail | 3 | 0.250 | 3 | 1 | 1 | 5200 | 47% | agent_stop 1, "
                                    "infrastructure_error 1, max_steps 1, user_stop 1 (killed after 60 s) | 12 |")
    empty = tau2.results_summary({})
    assert empty["tasks"] == 0 and empty["pass1"] != empty["pass1"]  # nan: no task ran


def test_the_servers_access_log_is_counted_by_status():
    text = "\n".join([
        "2026-12-06 06:29:36,262 INFO 127.0.0.1:39200 POST /v1/chat/completions 200 tokens=840+96 13.637s",
        "2026-12-06 06:29:37,001 INFO 127.0.0.1:39202 POST /v1/chat/completions 400 0.010s the prompt has 9000 tokens",
        "2026-12-06 06:29:38,001 INFO 127.0.0.1:39203 GET /v1/models 200 0.001s",
        "2026-12-06 06:29:39,001 INFO 127.0.0.1:39204 POST /v1/chat/completions 499 2.000s client disconnected",
        "I1206 05:58:24.846859 140275285547904 loading.py:503] loaded SmolLM2-135M-Instruct.Q4_1.gguf: llama",
        "a reply that quotes 127.0.0.1:1 POST /v1/chat/completions 200x is no access line"])
    assert tau2.server_log_statuses(text) == {200: 1, 400: 1, 499: 1}
