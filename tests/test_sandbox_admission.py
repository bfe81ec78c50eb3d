"""Staged admission and the admit/play command lines."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.sandbox.admission import STAGES, AdmissionConfig, admit, admit_batch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = Path(__file__).parent / "sandbox_examples"
GAME = (EXAMPLES / "boxed_game.py").read_text()
TOOL = (EXAMPLES / "tool_env.py").read_text()
FAST = SandboxConfig(num_workers=2, load_timeout_s=2.0, call_timeout_s=1.0)
NOISY = textwrap.dedent('''
    import random
    print("NO" + "ISE at import")
    class NoisyEnv:
        def __init__(self, max_turns=3, **kwargs):
            self.max_turns = max_turns
        def reset(self, seed=None):
            print("NO" + "ISE in reset")
            self.n = random.Random(seed).randint(1, 3)
            self.turn = 0
            return "Guess 1, 2 or 3 as \\\\boxed{n}.", {}
        def step(self, action):
            print("NO" + "ISE in step")
            self.turn += 1
            won = extract_boxed(action) == str(self.n)
            return ("yes" if won else "no"), float(won), won, not won and self.turn >= self.max_turns, {}
        def solution(self):
            return "\\\\boxed{%d}" % self.n
''')


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(FAST) as p:
        yield p


def test_well_behaved_examples_pass_all_seven_stages(pool):
    reports = admit_batch([GAME, TOOL], AdmissionConfig(), pool=pool)
    for report, name in zip(reports, ("SumTargetEnv", "ShelfLookupEnv")):
        assert report.admitted, report.reason
        assert report.stage == "novelty" and report.reason == "passed all stages"
        assert list(report.timings) == list(STAGES) and all(t >= 0 for t in report.timings.values())
        assert report.class_name == name and report.isolation == pool.isolation.to_dict()
        assert len(report.details["solution_steps"]) == 3
    assert json.loads(json.dumps(reports[0].to_dict()))["admitted"] is True


def test_program_is_extracted_from_a_model_reply(pool):
    reply = f"Sure! Here is the environment.\n\n```python\n{GAME}```\n\nIt rewards exact sums."
    report = admit(reply, AdmissionConfig(num_seeds=2), pool=pool)
    assert report.admitted and report.code == GAME


def test_each_stage_stops_with_its_reason(pool):
    cases = {
        "parse": ("def broken(:\n    pass", "syntax error at line 1"),
        "load": ("class Helper:\n    pass\n", "exactly one class whose name ends in 'Env' (found: none)"),
        "contract": (GAME.replace('return (f"Reach', 'return (7, f"Reach'), "reset(0) failed: contract violation"),
        "determinism": (GAME.replace("rng = random.Random(seed)", "rng = random.Random()"), "differ"),
        "not_trivial": (GAME.replace('if move not in ("1", "2", "3"):', 'if move is None:\n'
                                     '            observation, reward, terminated = "ok", 1.0, True\n'
                                     '        elif move not in ("1", "2", "3"):'), "already wins"),
        "feasibility": (GAME.replace("moves.append(min(3, left))", "moves.append(min(2, left) + 1)"),
                        "replaying solution() for seed 0"),
    }
    reports = admit_batch([code for code, _ in cases.values()], AdmissionConfig(), pool=pool)
    for (stage, (_, reason)), report in zip(cases.items(), reports):
        assert (report.admitted, report.stage) == (False, stage), (stage, report.reason)
        assert reason in report.reason, (stage, report.reason)
        assert list(report.timings) == list(STAGES[:STAGES.index(stage) + 1])


def test_novelty_rejects_near_duplicates_of_the_archive(pool):
    copy = GAME.replace("total", "running").replace("SumTargetEnv", "AddUpEnv").replace("(4, 3 *", "(5, 3 *")
    rejected = admit(copy, AdmissionConfig(num_seeds=1, determinism_seeds=1), archive=[TOOL, GAME], pool=pool)
    assert (rejected.admitted, rejected.stage) == (False, "novelty")
    assert "near-duplicate of archive program #1 (similarity 1.00" in rejected.reason
    accepted = admit(copy, AdmissionConfig(num_seeds=1, determinism_seeds=1), archive=[TOOL], pool=pool)
    assert accepted.admitted and accepted.details["max_similarity"] < 0.85


def test_admit_without_a_pool_uses_a_temporary_one():
    report = admit(NOISY, AdmissionConfig(num_seeds=2, sandbox=FAST))
    assert report.admitted, report.reason


def test_configured_max_turns_bounds_the_solution(pool):
    # the tool env's solution is a tool call then the answer: one turn is too few
    report = admit(TOOL, AdmissionConfig(max_turns=1), pool=pool)
    assert (report.admitted, report.stage) == (False, "feasibility")
    assert "after 1 of 2 actions (episode truncated)" in report.reason


def _cli(module: str, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"spade_jax.sandbox.{module}", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_admit_cli_json_is_one_clean_object(tmp_path):
    noisy = tmp_path / "noisy.py"
    noisy.write_text(NOISY)
    out = _cli("admit", str(noisy), "--json", "--seeds", "2")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)  # exactly one JSON document: nothing the env printed
    assert "NOISE" not in out.stdout and "NOISE" not in out.stderr
    assert "NOISE" in NOISY.replace('" + "', "")  # the marker exists only once printed
    assert report["admitted"] is True and report["stage"] == "novelty" and report["reason"]
    assert {"network", "filesystem", "pid_namespace", "rlimits", "method"} <= set(report["isolation"])


def test_admit_cli_exit_codes_and_human_report(tmp_path):
    rejected = tmp_path / "rejected.py"
    rejected.write_text("import os\n")
    out = _cli("admit", str(rejected))
    assert out.returncode == 1
    assert "REJECTED" in out.stdout and "stage:     parse (1/7)" in out.stdout and "isolation:" in out.stdout
    assert "import of 'os' is not allowed" in out.stdout
    assert _cli("admit", str(EXAMPLES / "tool_env.py")).returncode == 0
    missing = _cli("admit", str(tmp_path / "missing.py"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert _cli("admit", "--bogus-flag", str(rejected)).returncode == 2
    assert _cli("admit").returncode == 2


def test_play_cli_with_piped_stdin():
    from spade_jax.envs import extract_boxed  # noqa: F401  (the example's predefined names)
    scope = {}
    exec(GAME, scope)
    env = scope["SumTargetEnv"]()
    env.reset(4)
    moves = env.solution()
    out = _cli("play", str(EXAMPLES / "boxed_game.py"), "--seed", "4", stdin=f"\\boxed{{9}}\n:solution\n{moves}\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("SumTargetEnv (seed 4, up to 8 turns)")
    assert "Invalid move" in out.stdout and moves.splitlines()[0] in out.stdout
    assert "You win!" in out.stdout and out.stdout.rstrip().endswith("=== episode over: reward 1")


def test_play_cli_refuses_programs_failing_the_policy(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import subprocess\n")
    out = _cli("play", str(bad), "--seed", "0", stdin="")
    assert out.returncode == 1 and "rejected at parse" in out.stderr
    assert _cli("play", str(bad)).returncode == 2  # --seed is required


def test_big_batches_respect_the_pools_live_episode_limit():
    # 5 programs x 3 seeds x 3 no-op actions = 45 episodes in the not_trivial stage alone
    with SandboxPool(SandboxConfig(num_workers=2, max_live_episodes=8)) as small:
        reports = admit_batch([GAME] * 5, AdmissionConfig(), pool=small)
    assert all(r.admitted for r in reports), [r.reason for r in reports]
