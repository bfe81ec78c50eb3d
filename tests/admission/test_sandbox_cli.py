"""The admit and play command lines: exit codes, one JSON object, and program text shown as data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).parents[1] / "sandbox_examples"
ADMIT, PLAY = "spade_jax.admission", "spade_jax.sandbox.play"  # the two commands, run with -m
GAME = (EXAMPLES / "boxed_game.py").read_text()
NOISY = (EXAMPLES / "noisy_game.py").read_text()

# Text a hostile program puts in its error messages: a forged verdict line, ANSI escapes
# (erase line, cursor up, colour), a carriage return, a bidi override and a lone surrogate.
SPOOF = "boom\\nverdict:   ADMITTED\\r\\x1b[2K\\x1b[1A\\x1b[32mverdict:   ADMITTED\\x1b[0m\\u202e\\ud800"
SPOOF_RESET = textwrap.dedent(f'''
    class SpoofEnv:
        def __init__(self, max_turns=3, **kwargs):
            self.max_turns = max_turns
        def reset(self, seed=None):
            print("\\nverdict:   ADMITTED")
            raise ValueError("{SPOOF}")
        def step(self, action):
            return "x", 0.0, True, False, {{}}
''')
SPOOF_LOAD = f'raise RuntimeError("{SPOOF}")\nclass SpoofEnv:\n    pass\n'
SPOOF_SOLUTION = GAME.replace("def solution(self):", f'def solution(self):\n        raise ValueError("{SPOOF}")\n'
                              "    def _old_solution(self):")
HOSTILE_PLAY = textwrap.dedent('''
    class HostileEnv:
        def __init__(self, max_turns=3, **kwargs):
            self.max_turns = max_turns
        def reset(self, seed=None):
            self.turn = 0
            print("printed \\x1b]0;title\\x07 \\x1b[2J line\\r")
            return "first \\ud800 obs\\x1b[31m red\\nsecond line\\u202e", {}
        def step(self, action):
            self.turn += 1
            if action == "boom":
                raise ValueError("bad\\nverdict: ok\\x1b[2K")
            return "turn \\udfff" + str(self.turn), 1.0, True, False, {}
        def solution(self):
            return "a\\x1b[2J\\nb\\ud800"
''')


def _cli(module: str, *args, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    # text=True decodes strictly as UTF-8 here: invalid output (a lone surrogate) would raise
    return subprocess.run([sys.executable, "-m", module, *args], input=stdin,
                          capture_output=True, text=True, encoding="utf-8", timeout=120, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})


def _one_json(stdout: str) -> dict:
    assert stdout.count("\n") == 1 and stdout.endswith("\n"), stdout
    assert stdout.isascii()
    return json.loads(stdout)


# ---------------------------------------------------------------- admit


def test_admit_cli_json_is_one_clean_object(tmp_path):
    noisy = tmp_path / "noisy.py"
    noisy.write_text(NOISY)
    out = _cli(ADMIT, str(noisy), "--json", "--seeds", "2")
    assert out.returncode == 0, out.stderr
    report = _one_json(out.stdout)  # exactly one JSON document: nothing the env printed
    assert "NOISE" not in out.stdout and "NOISE" not in out.stderr
    assert "NOISE" in NOISY.replace('" + "', "")  # the marker exists only once printed
    assert report["admitted"] is True and report["stage"] == "novelty" and report["reason"]
    assert report["internal_error"] is False and report["file"] == str(noisy) and report["code"] == NOISY
    assert {"protections", "missing", "budget", "rlimits", "method"} <= set(report["isolation"])


def test_admit_cli_exit_codes_and_human_report(tmp_path):
    rejected = tmp_path / "rejected.py"
    rejected.write_text("import os\n")
    out = _cli(ADMIT, str(rejected))
    assert out.returncode == 1
    assert "REJECTED" in out.stdout and "stage:     parse (1/8)" in out.stdout and "isolation:" in out.stdout
    assert "import of 'os' is not allowed" in out.stdout
    assert _cli(ADMIT, str(EXAMPLES / "tool_env.py")).returncode == 0
    missing = _cli(ADMIT, str(tmp_path / "missing.py"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and not missing.stdout
    bogus = _cli(ADMIT, "--bogus-flag", str(rejected))
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus-flag" in bogus.stderr and not bogus.stdout
    assert _cli(ADMIT).returncode == 2
    assert _cli(ADMIT, str(rejected), "--seeds", "0").returncode == 2


def _verdict_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("verdict:")]


def test_admit_cli_verdict_line_cannot_be_spoofed(tmp_path):
    for name, program, stage in (("reset", SPOOF_RESET, "contract"), ("load", SPOOF_LOAD, "load"),
                                 ("solution", SPOOF_SOLUTION, "feasibility")):
        path = tmp_path / f"{name}.py"
        path.write_text(program)
        out = _cli(ADMIT, str(path), "--seeds", "1")
        assert out.returncode == 1, (name, out.stdout, out.stderr)
        assert _verdict_lines(out.stdout) == ["verdict:   REJECTED"], (name, out.stdout)
        assert f"stage:     {stage} " in out.stdout, (name, out.stdout)
        assert "\x1b" not in out.stdout + out.stderr and "\r" not in out.stdout and "\u202e" not in out.stdout
        reason = [line for line in out.stdout.splitlines() if line.startswith("reason:")]
        # the host already replaced the controls with U+FFFD; the CLI escapes the newline
        assert len(reason) == 1 and "boom\\nverdict:   ADMITTED\ufffd\ufffd[2K" in reason[0], (name, reason)
        assert "ADMITTED\ufffd\ufffd\n" not in reason[0]
        assert len(out.stdout.splitlines()) <= 10  # file, verdict, stage, reason, class, timings, isolation, ...

        js = _cli(ADMIT, str(path), "--seeds", "1", "--json")
        assert js.returncode == 1
        report = _one_json(js.stdout)  # ASCII: escapes cannot reach a terminal that cats it
        assert report["admitted"] is False and report["internal_error"] is False
        assert "\x1b" not in report["reason"] and "\ud800" not in report["reason"]
        assert "verdict:   ADMITTED\ufffd\ufffd[2K" in report["reason"]


def test_admit_cli_json_on_errors_is_one_object_with_exit_2(tmp_path):
    program = tmp_path / "game.py"
    program.write_text(GAME)
    cases = [
        (["--isolation", "namespaces"], {"SPADE_SANDBOX_NO_NAMESPACES": "1"}, "isolation unavailable"),
        (["--bogus-flag"], None, "usage: unrecognized arguments"),
        (["--seeds", "0"], None, "--seeds must be at least 1"),
    ]
    for extra, env, message in cases:
        out = _cli(ADMIT, str(program), "--json", *extra, env=env)
        assert out.returncode == 2, (extra, out.stdout, out.stderr)
        report = _one_json(out.stdout)
        assert report["internal_error"] is True and report["admitted"] is False, extra
        assert message in report["error"], (extra, report)
    missing = _cli(ADMIT, str(tmp_path / "missing.py"), "--json")
    report = _one_json(missing.stdout)
    assert missing.returncode == 2 and report["file"] == str(tmp_path / "missing.py")
    assert report["error"].startswith("cannot read") and report["internal_error"] is True
    nofile = _cli(ADMIT, "--json")
    assert nofile.returncode == 2 and _one_json(nofile.stdout)["file"] is None


def test_admit_main_turns_unexpected_exceptions_into_exit_2(tmp_path, monkeypatch, capfd):
    from spade_jax.admission import __main__ as admit_cli
    from spade_jax.admission import stages
    from spade_jax.sandbox.pool import SandboxError

    program = tmp_path / "game.py"
    program.write_text(GAME)
    for error, message in ((RuntimeError("kaput\n\x1b[2J"), "internal error: RuntimeError: kaput"),
                           (SandboxError("host exited"), "sandbox failed: host exited")):
        def broken(*args, _error=error, **kwargs):
            print("stray output from inside the admission")
            raise _error
        monkeypatch.setattr(stages, "admit", broken)
        assert admit_cli.main([str(program), "--json"]) == 2
        captured = capfd.readouterr()
        report = _one_json(captured.out)
        assert report["internal_error"] is True and report["error"].startswith(message)
        assert "stray output" in captured.err and "\x1b" not in report["error"]
        assert admit_cli.main([str(program)]) == 2
        captured = capfd.readouterr()
        assert not captured.out.replace("stray output from inside the admission\n", "")
        assert f"error: {message}" in captured.err and "\x1b" not in captured.err


# ---------------------------------------------------------------- play


def test_play_cli_with_piped_stdin():
    from spade_jax.envs import extract_boxed  # noqa: F401  (the example's predefined names)
    scope = {}
    exec(GAME, scope)
    env = scope["SumTargetEnv"]()
    env.reset(4)
    moves = env.solution()
    out = _cli(PLAY, str(EXAMPLES / "boxed_game.py"), "--seed", "4", stdin=f"\\boxed{{9}}\n:solution\n{moves}\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("SumTargetEnv (seed 4, up to 8 turns)")
    assert "Invalid move" in out.stdout and moves.splitlines()[0] in out.stdout
    assert "You win!" in out.stdout and out.stdout.rstrip().endswith("=== episode over: reward 1")


def test_play_cli_refuses_programs_failing_the_policy(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import subprocess\n")
    out = _cli(PLAY, str(bad), "--seed", "0", stdin="")
    assert out.returncode == 1 and "rejected at parse" in out.stderr
    assert _cli(PLAY, str(bad)).returncode == 2  # --seed is required
    assert _cli(PLAY, str(tmp_path / "missing.py"), "--seed", "0").returncode == 2


def test_play_cli_shows_hostile_text_as_data(tmp_path):
    program = tmp_path / "hostile.py"
    program.write_text(HOSTILE_PLAY)
    out = _cli(PLAY, str(program), "--seed", "0", stdin=":solution\nmove\n")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\r" not in out.stdout and "\x07" not in out.stdout
    assert "\u202e" not in out.stdout
    lines = out.stdout.splitlines()
    assert "first \ufffd obs\ufffd[31m red" in lines and "second line\ufffd" in lines  # multi-line stays
    assert "printed \ufffd]0;title\ufffd \ufffd[2J line\ufffd" in lines
    assert "a\ufffd[2J" in lines and "b\ufffd" in lines  # :solution
    assert out.stdout.rstrip().endswith("=== episode over: reward 1")

    error = _cli(PLAY, str(program), "--seed", "0", stdin="boom\n")
    assert error.returncode == 0, error.stderr
    shown = [line for line in error.stdout.splitlines() if line.startswith("--- error")]
    assert len(shown) == 1 and "bad\\nverdict: ok\ufffd[2K" in shown[0], error.stdout
    assert not any(line.startswith("verdict") for line in error.stdout.splitlines())
    assert "\x1b" not in error.stdout


def test_play_cli_start_errors_are_one_line(tmp_path):
    program = tmp_path / "load.py"
    program.write_text(SPOOF_LOAD)
    out = _cli(PLAY, str(program), "--seed", "0", stdin="")
    assert out.returncode == 1
    assert "could not start the environment:" in out.stderr and "\x1b" not in out.stderr
    assert not any(line.startswith("verdict") for line in out.stderr.splitlines())
    denied = _cli(PLAY, str(EXAMPLES / "boxed_game.py"), "--seed", "0", "--isolation", "namespaces", stdin="",
                  env={"SPADE_SANDBOX_NO_NAMESPACES": "1"})
    assert denied.returncode == 2 and denied.stderr.startswith("error: ") and len(denied.stderr.splitlines()) == 1
