"""A run with every side system on (calibration, procedure memory, trajectory synthesis and
held-out evaluation, every iteration) survives one design batch holding each program that
attacks them: level tricks, a class that claims a held-out family, tool programs whose schemas
crash, poison or blow up synthesis. Through admission they are rejected with their reasons; forced
past it, calibration, procedure memory and synthesis each contain them and the run trains,
evaluates and checkpoints. Held-out guidance never shows what a designed program wrote."""

import dataclasses
import json
from pathlib import Path

from tests.related.test_trajectories import (DECOY, DEEP_EXPRESSION, MARKED, NON_JSON_SCHEMAS, REQUIRED_INT,
                                            SHARED_CONSTANTS)
from tests.selfplay.test_selfplay import _tiny_policy, run_log, tiny_selfplay_config

from spade_jax.admission import AdmissionReport
from spade_jax.designer.prompts import designer_answer
from spade_jax.envs import library
from spade_jax.selfplay import loop

HOSTILE = Path(__file__).parents[1] / "hostile_admission"
# A playable tool game whose class name claims the held-out family `hidden_rule`.
CLAIMS_HIDDEN_RULE = library.load_source("shopping").replace("class ShoppingEnv(", "class HiddenRuleEnv(")
PROGRAMS = {
    "level_coin": (HOSTILE / "level_coin.py").read_text(),  # a coin flip at one declared level
    "level_infeasible": (HOSTILE / "level_infeasible.py").read_text(),  # a level nobody can win
    "claims_hidden_rule": CLAIMS_HIDDEN_RULE,
    "required_int": REQUIRED_INT,  # a schema whose `required` is 3
    "set_schema": NON_JSON_SCHEMAS["set"],  # a set literal in a schema
    "deep_expression": DEEP_EXPRESSION,  # 40000 terms: RecursionError in ast.parse
    "decoy": DECOY,  # a ToolUseEnv subclass the sandbox never runs
    "shared_constants": SHARED_CONSTANTS,  # module constants that would make a GB observation
    "marked": MARKED,  # chat markers in a tool description
}
NAMES = list(PROGRAMS)
TOOL_PROGRAMS = NAMES[3:]


def _config():
    c = tiny_selfplay_config()
    c.num_iterations = 2
    c.designer.num_slots = len(PROGRAMS)
    c.agent.replay_envs = 0
    c.calibration.enabled = True
    c.calibration.band = (0.0, 1.0)  # the random agent wins nothing: every verified level is in band
    c.agent.procedure_memory.enabled = True
    c.trajectories.update(every=1, max_envs=32, chains_per_env=2)  # every tool program in memory
    c.memory.heldout = ("hidden_rule",)
    c.eval.suites = f"envs:{library.source_path('hidden_rule')}"
    c.eval.update(every=1, plays_per_program=1, default_turns=2)
    return c


def _hostile_designs(monkeypatch):
    real_propose = loop.propose

    def propose(*args, **kwargs):
        samples = real_propose(*args, **kwargs)
        return [dataclasses.replace(s, text=designer_answer(PROGRAMS[n])) for s, n in zip(samples, NAMES)]

    monkeypatch.setattr(loop, "propose", propose)


def _run(c, workdir, tokenizer, prepare=lambda run: None):
    run = loop.SelfPlay(c, str(workdir), policy=_tiny_policy(c, tokenizer))
    try:
        prepare(run)
        history = run.run()
        assert run.pool.local.host_restarts == 0
        heldout_text = run.context.heldout_guidance(library.load_source("hidden_rule"))
    finally:
        run.close()
    return history, heldout_text


def test_through_admission_every_level_trick_is_rejected_and_the_run_goes_on(tmp_path, small_tokenizer,
                                                                            monkeypatch):
    _hostile_designs(monkeypatch)
    c = _config()
    c.designer.reward.rejected = "penalty"  # the rejected designs train too, so every iteration updates
    history, heldout_text = _run(c, tmp_path, small_tokenizer)
    assert len(history) == 2 and (tmp_path / "checkpoints" / "2").exists()
    designed = [e for e in run_log(tmp_path) if e.slot is not None and e.iteration == 0]
    for env_class in ("LevelCoinEnv", "LevelInfeasibleEnv"):
        (entry,) = [e for e in designed if f"class {env_class}" in e.code]
        assert not entry.admitted and entry.stage in ("blind", "feasibility"), (entry.stage, entry.reason)
    assert not heldout_text or "peek_answer_key" not in heldout_text
    assert all(m["train/tokens"] > 0 for m in history)


def test_forced_past_admission_each_side_system_contains_them(tmp_path, small_tokenizer, monkeypatch):
    _hostile_designs(monkeypatch)

    def admit_as_written(samples, pool, memory, admission, **unused):
        return [dataclasses.replace(s, report=AdmissionReport(True, "novelty", "", code=PROGRAMS[n]))
                for s, n in zip(samples, NAMES)]

    def remember_tool_programs(run):  # as if admitted by an earlier iteration: synthesis reads them
        for i, name in enumerate(TOOL_PROGRAMS):
            run.memory.add(PROGRAMS[name], "tool_use", iteration=i, env_id=name)

    monkeypatch.setattr(loop, "admit_samples", admit_as_written)
    history, heldout_text = _run(_config(), tmp_path, small_tokenizer, remember_tool_programs)
    first, second = history
    assert (tmp_path / "checkpoints" / "2").exists() and all(m["train/tokens"] > 0 for m in history)
    # calibration played every forced program; the infeasible level is never the chosen one
    assert first["calibration/episodes"] > 0
    chosen = {n: e.level for e in run_log(tmp_path) if e.iteration == 0 and e.slot is not None
              for n, p in PROGRAMS.items() if p == e.code and e.admitted}
    assert chosen.get("level_infeasible") != "hard"
    # procedure memory never learns from the class that claims a held-out family, and held-out
    # evaluation is guided by nothing a designed program wrote (no seed program was played)
    assert "claims_hidden_rule" in chosen and all(m["procedures/heldout_claims"] > 0 for m in history)
    assert heldout_text is None
    # synthesis read every tool program that reached memory, rejected the broken ones with a
    # reason, and exported nothing raw
    summary = (tmp_path / "trajectories" / "2" / "summary.md").read_text()
    rows = {line.split(" ")[1]: line for line in summary.splitlines() if line.startswith("| ")}
    for name in ("required_int", "set_schema", "deep_expression", "shared_constants"):
        assert name in rows and "|" in rows[name], rows  # one row with its reason, not a crash
    assert first["trajectories/rejected"] >= 4 and "<|im_" not in summary
    for line in (tmp_path / "trajectories" / "2" / "sft.jsonl").read_text().splitlines():
        assert len(line) <= 1 << 17 and "<|im_" not in json.dumps(json.loads(line)["messages"])
    assert any(k.startswith("eval/") and k.endswith("/score") for k in second)  # held-out evaluation ran
