"""Staged admission and the admit/play command lines."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path

import pytest

from spade_jax.admission import STAGES, AdmissionConfig, admit, admit_batch
from spade_jax.admission.probes import NOOP_ACTIONS, answer_key, blind_script, fixed_answers, random_actions
from spade_jax.envs import library
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.sandbox import SandboxConfig, SandboxPool, SolutionResult, StepResult

# Wall-clock and process-count bounds: run alone, not beside other tests (tests/run.sh).
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).parents[1] / "sandbox_examples"
HOSTILE = Path(__file__).parents[1] / "hostile_admission"
GAME = (EXAMPLES / "boxed_game.py").read_text()
TOOL = (EXAMPLES / "tool_env.py").read_text()
FAST = SandboxConfig(num_workers=2, load_timeout_s=2.0, call_timeout_s=1.0)
NOISY = (Path(__file__).parents[1] / "sandbox_examples" / "noisy_game.py").read_text()



@pytest.fixture(scope="module")
def pool():
    with SandboxPool(FAST) as p:
        yield p


def test_well_behaved_examples_pass_all_eight_stages(pool):
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
        "contract": (GAME.replace('return (f"Reach', 'return (7, f"Reach'), "reset({seed}) failed: contract violation"),
        "determinism": (GAME.replace("rng = random.Random(seed)", "rng = random.Random()"), "differ"),
        "not_trivial": (GAME.replace('if move not in ("1", "2", "3"):', 'if action == "pass":\n'
                                     '            observation, reward, terminated = "ok", 1.0, True\n'
                                     '        elif move not in ("1", "2", "3"):'),
                        "the no-op action 'pass' already wins"),
        # the solution's moves reach target - 1, then add 2: it overshoots on every seed
        "feasibility": (GAME.replace("moves, left = [], self.target", "moves, left = [], self.target - 1")
                        .replace("for m in moves)", "for m in moves + [2])"),
                        "replaying solution() for seed {seed}"),
    }
    reports = admit_batch([code for code, _ in cases.values()], AdmissionConfig(), pool=pool)
    for (stage, (_, reason)), report in zip(cases.items(), reports):
        assert (report.admitted, report.stage) == (False, stage), (stage, report.reason)
        seeds = report.details["probe_seeds"]["contract"]  # random, so name one of them
        assert any(reason.format(seed=seed) in report.reason for seed in seeds), (stage, report.reason)
        assert list(report.timings) == list(STAGES[:STAGES.index(stage) + 1])


def test_novelty_rejects_near_duplicates_of_the_archive(pool):
    copy = GAME.replace("total", "running").replace("SumTargetEnv", "AddUpEnv").replace("(4, 3 *", "(5, 3 *")
    one = AdmissionConfig(num_seeds=1, determinism_seeds=1)
    rejected = admit(copy, dataclasses.replace(one, novelty="structure"), archive=[TOOL, GAME], pool=pool)
    assert (rejected.admitted, rejected.stage) == (False, "novelty")
    assert "near-duplicate of archive program #1 (similarity 1.00" in rejected.reason
    rejected = admit(copy, one, archive=[TOOL, GAME], pool=pool)  # one changed number is still the same game
    assert (rejected.admitted, rejected.stage) == (False, "novelty") and "(similarity 0.94" in rejected.reason
    accepted = admit(copy, one, archive=[TOOL], pool=pool)
    assert accepted.admitted and accepted.details["max_similarity"] < 0.85


@pytest.mark.parametrize("novelty, admitted", [("structure", False), ("constants", True), ("off", True)])
def test_novelty_modes_tell_a_known_game_with_new_settings_from_a_copy(pool, novelty, admitted):
    retuned = (GAME.replace("max_turns=8", "max_turns=10").replace("randint(4, 3 *", "randint(5, 2 *")
               .replace("-0.5", "-0.25"))
    config = AdmissionConfig(num_seeds=1, determinism_seeds=1, novelty=novelty)
    reports = admit_batch([retuned, GAME.replace("total", "sum_so_far")], config, archive=[GAME], pool=pool)
    assert reports[0].admitted == admitted, reports[0].reason
    assert reports[1].admitted == (novelty == "off"), reports[1].reason  # a renamed copy is new only without the stage
    with pytest.raises(ValueError, match="novelty"):
        AdmissionConfig(novelty="semantic")


def test_admit_without_a_pool_uses_a_temporary_one():
    report = admit(NOISY, AdmissionConfig(num_seeds=2, sandbox=FAST))
    assert report.admitted, report.reason


def test_configured_max_turns_bounds_the_solution(pool):
    # the tool env's solution is a tool call then the answer: one turn is too few
    report = admit(TOOL, AdmissionConfig(max_turns=1), pool=pool)
    assert (report.admitted, report.stage) == (False, "feasibility")
    assert "after 1 of 2 actions (episode truncated)" in report.reason


def test_big_batches_respect_the_pools_live_episode_limit():
    # 5 programs x 3 seeds x 3 no-op actions = 45 episodes in the not_trivial stage alone
    with SandboxPool(SandboxConfig(num_workers=2, max_live_episodes=8)) as small:
        reports = admit_batch([GAME] * 5, AdmissionConfig(batch_novelty=False), pool=small)
    assert all(r.admitted for r in reports), [r.reason for r in reports]


def test_novelty_rejects_a_near_duplicate_of_an_earlier_program_of_the_batch(pool):
    reports = admit_batch([GAME, TOOL, GAME + "\n# the same game again\n"], AdmissionConfig(), pool=pool)
    assert [r.admitted for r in reports] == [True, True, False]
    assert (reports[2].stage, reports[2].reason) == ("novelty", "near-duplicate of program 0 of the same batch")
    apart = admit_batch([GAME, GAME], AdmissionConfig(batch_novelty=False), pool=pool)
    assert all(r.admitted for r in apart)


# --- probes a program cannot tell from play -----------------------------------------------------

def _hostile(name: str) -> str:
    return (HOSTILE / name).read_text()


def test_random_actions_mix_plausible_actions_no_ops_and_garbage():
    rng = random.Random(3)
    games = random_actions(rng, 400, tool_use=False)
    assert random_actions(random.Random(3), 400, tool_use=False) == games  # reproducible from the rng
    assert any(a.startswith("\\boxed{") and a.endswith("}") for a in games)
    assert any("\\boxed{" in a and not a.startswith("\\boxed{") for a in games)  # inside model-like text
    assert set(NOOP_ACTIONS) <= set(games)
    assert any(len(a) >= 3500 for a in games) and any(not a.isascii() for a in games)
    assert len(set(games)) > 200
    tools = random_actions(rng, 400, tool_use=True, tools=["locate", "count"])
    calls = [json.loads(a[len("<tool_call>"):-len("</tool_call>")]) for a in tools
             if a.startswith("<tool_call>{\"name\"") and a.endswith("}</tool_call>")]
    assert {c["name"] for c in calls} >= {"locate", "count"} and any(c["arguments"] for c in calls)
    assert any(a.startswith("<answer>") and a != "<answer></answer>" for a in tools)
    assert "<tool_call>not json</tool_call>" in tools
    plausible = random_actions(rng, 200, tool_use=False, plausible_only=True)
    assert all("\\boxed{" in a and len(a) < 200 for a in plausible)


def test_answer_key_says_when_two_actions_give_the_same_answer():
    assert answer_key("\\boxed{ Yes. }", tool_use=False) == answer_key("I think \\boxed{yes}", tool_use=False) == "yes"
    assert answer_key("\\boxed{2}", tool_use=False) == answer_key("\\boxed{2.0}", tool_use=False) == "2.0"
    assert answer_key("flip 1", tool_use=False) == "flip 1"  # no box: the action itself
    assert answer_key("<answer> Paris </answer>", tool_use=True) == "paris"
    assert answer_key("\\boxed{}", tool_use=False) is None and answer_key("<answer></answer>", tool_use=True) is None


def test_fixed_answers_come_from_the_programs_own_moves_then_its_examples():
    moves = ["\\boxed{7}", "\\boxed{7.0}", "\\boxed{9}"]  # 7 and 7.0 are one answer
    observation = "Pick a number, e.g. \\boxed{3} or \\boxed{9}."
    answers = fixed_answers(random.Random(0), tool_use=False, moves=moves, observation=observation, count=4)
    assert answers[:3] == ["\\boxed{7}", "\\boxed{9}", "\\boxed{3}"]
    assert len(answers) == 4 and answer_key(answers[3], tool_use=False) not in {"7.0", "9.0", "3.0"}
    assert fixed_answers(random.Random(0), tool_use=False, moves=moves, observation="", count=4) == \
        fixed_answers(random.Random(0), tool_use=False, moves=moves, observation="", count=4)  # reproducible
    tools = fixed_answers(random.Random(1), tool_use=True, moves=["<answer>Ann</answer>"], observation="", count=3)
    assert tools[:2] == ["<answer>Ann</answer>", "<answer>1</answer>"] and tools[2].startswith("<answer>")
    assert blind_script("\\boxed{7}", tool_use=False, tools=["look"], turns=3) == ["\\boxed{7}"] * 3
    assert blind_script("<answer>Ann</answer>", tool_use=True, tools=["compare", "look"], turns=3) == [
        '<tool_call>{"name": "compare", "arguments": {}}</tool_call>', "<answer>Ann</answer>", "<answer>Ann</answer>"]


def test_probe_seeds_are_fresh_random_or_reproducible(pool):
    quick = AdmissionConfig(pause_s=0.0)
    first, second = (admit(GAME, quick, pool=pool) for _ in range(2))
    same = [admit(GAME, quick, pool=pool, seed=7) for _ in range(2)]
    assert first.admitted and second.admitted and all(r.admitted for r in same)
    assert first.details["probe_seeds"] != second.details["probe_seeds"]
    assert first.details["admission_seed"] != second.details["admission_seed"]
    assert same[0].details["probe_seeds"] == same[1].details["probe_seeds"]
    assert same[0].details["admission_seed"] == 7
    assert same[0].details["random_play_wins"] == same[1].details["random_play_wins"]
    for report in (first, second, *same):
        seeds = report.details["probe_seeds"]
        assert seeds["contract"] != list(range(quick.num_seeds))
        assert len(seeds["not_trivial"]) == quick.random_plays + len(NOOP_ACTIONS)
        assert len(seeds["blind"]) == quick.blind_seeds
        everything = seeds["contract"] + seeds["not_trivial"] + seeds["blind"]
        assert all(0 <= s < EPISODE_SEED_SPACE for s in everything) and len(set(everything)) == len(everything)


def test_hostile_programs_are_rejected_where_they_show(pool):
    expect = {
        "seed_backdoor.py": ("not_trivial", "random play wins"),
        "noop_dodge.py": ("not_trivial", "random play wins"),
        "probe_aware_noise.py": ("determinism", "seed "),
        "pause_switch_real_clock.py": ("determinism", "(the replay paused 1 s before step"),
    }
    reports = admit_batch([_hostile(n) for n in expect], AdmissionConfig(), pool=pool)
    for (name, (stage, reason)), report in zip(expect.items(), reports):
        assert (report.admitted, report.stage) == (False, stage), (name, report.stage, report.reason)
        assert reason in report.reason, (name, report.reason)
    assert "of 8 plays (limit 0.5)" in reports[0].reason
    # without the pause the clock-keyed program looks like a fair game
    assert admit(_hostile("pause_switch_real_clock.py"), AdmissionConfig(pause_s=0.0), pool=pool).admitted
    # keyed to datetime it cannot see any pause (virtual clock): a fair game in admission and in play alike
    assert admit(_hostile("pause_switch.py"), AdmissionConfig(), pool=pool).admitted


def test_a_program_whose_calls_crawl_is_stopped_by_its_time_budget(pool):
    assert pool.config.call_timeout_s == 1.0  # slow_calls.py spends 0.75 s in every call
    started = time.monotonic()
    report = admit(_hostile("slow_calls.py"), AdmissionConfig(time_budget_s=5.0), pool=pool)
    wall = time.monotonic() - started
    assert (report.admitted, report.stage) == (False, "contract"), report.reason
    assert "used up its admission time budget" in report.reason and "time_budget_s=5 s" in report.reason
    assert 5.0 < report.details["sandbox_time_s"] < 5.0 + 3 * 1.0  # one round of its 3 episodes over
    assert wall < 15.0, wall


class _HostKillingPool:
    """A stand-in for a SandboxPool whose host dies whenever an episode of a program holding
    ``step_marker`` is stepped, or one holding ``start_marker`` is started: as the real pool
    does after restarting its host, every call in flight is answered with a ``failed_call ==
    "host"`` error, and the episodes that were live are gone."""

    ERROR = "the sandbox host exited with code -9 (it was restarted)"

    def __init__(self, real: SandboxPool, step_marker: str, start_marker: str):
        self.real, self.config, self.isolation = real, real.config, real.isolation
        self.markers = step_marker, start_marker
        self.programs: dict[int, str] = {}
        self.live: set[int] = set()
        self.dead: set[int] = set()
        self.losses = 0
        self._fake_id = -1

    def _lose_host(self):
        self.losses += 1
        self.dead |= self.live
        self.live.clear()

    def _lost(self, eid):
        return StepResult(eid, error=self.ERROR, truncated=True, failed_call="host")

    def start(self, specs):
        if any(self.markers[1] in spec.program for spec in specs):
            self._lose_host()
            ids = [self._fake_id - i for i in range(len(specs))]
            self._fake_id -= len(specs)
            return [self._lost(eid) for eid in ids]
        results = self.real.start(specs)
        for spec, result in zip(specs, results):
            self.programs[result.episode_id] = spec.program
            if result.ok:
                self.live.add(result.episode_id)
        return results

    def step(self, ids, actions):
        if any(self.markers[0] in self.programs.get(eid, "") for eid in ids):
            self._lose_host()
            return [self._lost(eid) for eid in ids]
        assert not self.dead.intersection(ids), "admission stepped an episode the lost host took with it"
        return self.real.step(ids, actions)

    def solution_results(self, ids):
        if self.dead.intersection(ids):
            return [SolutionResult(eid, error=self.ERROR, failed_call="host") if eid in self.dead else self.real.solution_results([eid])[0]
                    for eid in ids]
        return self.real.solution_results(ids)

    def close(self, ids):
        self.live.difference_update(ids)
        self.real.close([eid for eid in ids if eid >= 0])


def test_a_program_that_crashes_the_sandbox_host_is_found_and_the_others_judged_alone(pool):
    fake = _HostKillingPool(pool, "# kills the host when stepped", "# kills the host when started")
    step_killer = GAME + "# kills the host when stepped\n"
    start_killer = GAME + "# kills the host when started\n"
    reports = admit_batch([GAME, step_killer, TOOL, start_killer], AdmissionConfig(pause_s=0.0), pool=fake)
    assert [(r.admitted, r.stage) for r in reports] == [
        (True, "novelty"), (False, "contract"), (True, "novelty"), (False, "load")], [r.reason for r in reports]
    for report in (reports[1], reports[3]):
        assert report.reason == f"crashed the sandbox host: {_HostKillingPool.ERROR}"
    # each killer: once in the batch, once alone
    assert fake.losses == 4
    assert pool.stats()["live"] == 0


def test_admission_config_checks_its_new_fields():
    defaults = AdmissionConfig()
    assert (defaults.random_plays, defaults.max_random_win_rate, defaults.pause_s, defaults.time_budget_s) == (
        8, 0.5, 1.0, 30.0)
    for bad in (dict(random_plays=-1), dict(max_random_win_rate=1.5), dict(pause_s=-1.0), dict(time_budget_s=0.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AdmissionConfig(**bad)
    with pytest.raises(TypeError, match="seed"):
        admit_batch([], seed="7")
