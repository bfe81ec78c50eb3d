"""The algorithm end to end: regret from real sandboxed plays, one full self-play iteration."""

import dataclasses
import math
import types

import jax
import numpy as np
import pytest

from spade_jax.agent import AgentConfig, EpisodeRequest, play_episodes
from spade_jax.agent.rollout import SOLUTION_HINT_PREFIX
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.rl import rewards
from spade_jax.sampling import Generation, GenerationStats
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.selfplay import loop
from spade_jax.selfplay.config import base_config

SECRET_ENV = r'''
import random
from spade_jax.envs import SUCCESS_REWARD, extract_boxed

WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "haven", "inlet", "jolly"]


class SecretEnv:
    def __init__(self, max_turns=1, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).choice(WORDS)
        return "Guess the secret word, one of: " + ", ".join(WORDS) + ". Answer in \\boxed{}.", {}

    def step(self, action):
        won = extract_boxed(action) == self.secret
        return ("Right." if won else "Wrong."), (SUCCESS_REWARD if won else 0.0), True, False, {}

    def solution(self):
        return "\\boxed{" + self.secret + "}"
'''
EASY_ENV = SECRET_ENV.replace("won = extract_boxed(action) == self.secret", "won = True")
IMPOSSIBLE_ENV = SECRET_ENV.replace("won = extract_boxed(action) == self.secret", "won = False")
HINT_MARK = SOLUTION_HINT_PREFIX + "1) "


def scripted_sample(policy, prompts, *, max_new_tokens, seed, **unused):
    """A stand-in for the sampler: follows a hint when it sees one, else guesses by seed."""
    tok = policy.tokenizer
    words = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "haven", "inlet", "jolly"]
    rows = []
    for i, prompt in enumerate(prompts):
        text = tok.decode(prompt)
        if HINT_MARK in text:
            reply = text.split(HINT_MARK)[-1].split("<|im_end|>")[0].strip()
        else:
            reply = "\\boxed{" + words[(seed + 7 * i) % len(words)] + "}"
        rows.append(tok.encode(reply)[: max_new_tokens - 1] + [tok.eos_token_ids[0]])
    width = max(len(r) for r in rows)
    tokens = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    lengths = np.array([len(r) for r in rows], np.int32)
    return Generation(
        tokens=tokens,
        logprobs=np.zeros(tokens.shape, np.float32),
        lengths=lengths,
        finished=np.ones(len(rows), bool),
        stats=GenerationStats(compile_s=0.0, prefill_s=0.0, decode_s=0.0, steps=width, bucket=(len(rows), 0, width)),
    )


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2)) as p:
        yield p


def _stats(pool, tokenizer, program, k=16):
    policy = types.SimpleNamespace(tokenizer=tokenizer)
    requests = [
        EpisodeRequest(0, program, seed, hinted=hinted, hint_from_solution=hinted)
        for hinted in (False, True)
        for seed in range(k)
    ]
    trajectories = play_episodes(
        policy, pool, requests, AgentConfig(max_turns=1, max_new_tokens=16, context_budget=512), sample=scripted_sample
    )
    plain = [t for t in trajectories if not t.hinted]
    hinted = [t for t in trajectories if t.hinted]
    return rewards.env_stats([t.reward for t in plain], [t.reward for t in hinted]), trajectories


def test_hint_that_carries_the_strategy_gives_positive_regret(pool, small_tokenizer):
    stats, trajectories = _stats(pool, small_tokenizer, SECRET_ENV)
    assert stats.hinted_win_rate == 1.0
    assert 0.0 < stats.win_rate < 0.5
    assert stats.regret == pytest.approx(1.0 - stats.win_rate)
    hinted = next(t for t in trajectories if t.hinted)
    first_user = next(m for m in hinted.messages if m["role"] == "user")
    assert "HINT: " + HINT_MARK in first_user["content"]
    # the trained tokens are exactly the reply the agent produced
    assert small_tokenizer.decode(hinted.tokens[hinted.loss_mask]).startswith("\\boxed{")


@pytest.mark.parametrize("program, win_rate", [(EASY_ENV, 1.0), (IMPOSSIBLE_ENV, 0.0)])
def test_trivial_or_impossible_environment_has_zero_regret_and_zero_blend(pool, small_tokenizer, program, win_rate):
    stats, _ = _stats(pool, small_tokenizer, program)
    assert stats.win_rate == win_rate and stats.regret == 0.0
    # blend = 0.4 * clip(0 / 0.15) + 0.6 * plateau(p): plateau(0) = plateau(1) = 0
    assert rewards.designer_reward(stats) == 0.0


def tiny_selfplay_config():
    c = base_config()
    c.num_iterations = 1
    c.model.source = "random"
    c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
    c.mesh.shape = (1, 1, 1)
    c.designer.prompt.doc_max_words = 20
    c.designer.num_slots = 2
    c.designer.max_new_tokens = 24
    c.designer.max_attempts = 1  # one attempt per slot (the retries have tests of their own)
    c.agent.episodes_per_env = 2
    c.agent.hinted_episodes_per_env = 2
    c.agent.max_turns = 2
    c.agent.max_new_tokens = 8
    c.agent.context_budget = 768
    c.agent.replay_envs = 2
    c.hints.mode = "self"
    c.hints.max_new_tokens = 8
    c.rl.row_length = 4096  # the designer prompt alone is ~2k tokens with a 512-piece vocabulary
    c.rl.lr = 1e-3
    c.log.progress = False
    return c


def _tiny_policy(c, tokenizer):
    arch = ModelConfig(vocab_size=tokenizer.vocab_size, **{k: v for k, v in c.model.arch.items() if k != "vocab_size"})
    return random_policy(arch, tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))


def _run_loop(c, workdir, tokenizer):
    """Runs ``c`` on a tiny random policy; the metrics of every iteration and the closed run."""
    run = loop.SelfPlay(c, str(workdir), policy=_tiny_policy(c, tokenizer))
    try:
        return run.run(), run
    finally:
        run.close()


def test_one_iteration_end_to_end_on_a_tiny_random_model(tmp_path, small_tokenizer):
    c = tiny_selfplay_config()
    c.designer.reward.rejected = "penalty"  # the random policy's designs fail admission: train on them anyway
    c.designer.max_attempts = 3  # a failed slot is designed again: the random policy's designs all fail
    policy = _tiny_policy(c, small_tokenizer)
    before = jax.tree.map(np.asarray, policy.model.embed_VD[...])
    run = loop.SelfPlay(c, str(tmp_path), policy=policy)
    try:
        history = run.run()
    finally:
        run.close()
    (metrics,) = history
    # designer prompts built, programs sampled and judged; every rejection counted at its stage
    assert metrics["designer/proposed"] == 2
    rejected = sum(v for k, v in metrics.items() if k.startswith("designer/rejected/"))
    assert metrics["designer/admitted"] == 0 and metrics["designer/attempts"] == rejected == 6
    # the replayed seed environments: per skill and apart from new designs
    assert metrics["env/replayed"] == 2 and any(k.startswith("skill/") for k in metrics)
    # agent episodes: 2 replayed seed environments x 2 plain (replays are not hinted: the
    # reference plays hints only for the designs of a regeneration step)
    assert metrics["agent/episodes"] == 4
    # one update applied over designer and agent tokens
    assert metrics["train/tokens"] > 0 and metrics["train/designer_tokens"] > 0
    assert not np.allclose(before, np.asarray(policy.model.embed_VD[...]))
    # memory updated: the replayed seeds now carry measured statistics
    measured = [r for r in run.memory.records() if r.measured]
    assert len(measured) == 2
    numbers = {k: v for k, v in metrics.items() if not k.startswith("agent/hinted") and isinstance(v, float)}
    assert all(math.isfinite(v) for v in numbers.values()), {k: v for k, v in numbers.items() if not math.isfinite(v)}
    assert (tmp_path / "gallery" / "index.html").exists() and (tmp_path / "checkpoints" / "1").exists()


def _admit_everything_as(program):
    """An admission stand-in: every designer sample becomes `program`, admitted."""
    from spade_jax.admission import AdmissionReport

    def admit(samples, pool, memory, admission, seed=None, earlier=()):
        report = AdmissionReport(admitted=True, stage="novelty", reason="", code=program)
        return [dataclasses.replace(s, report=report) for s in samples]

    return admit


@pytest.mark.parametrize("reply, kept", [("no, the reward is wrong", False), ("yes", True)])
def test_self_review_keeps_or_rejects_new_environments(tmp_path, small_tokenizer, monkeypatch, reply, kept):
    from spade_jax.envs import library

    c = tiny_selfplay_config()
    c.designer.self_review = True
    c.hints.mode = "resample"
    c.agent.replay_envs = 0
    monkeypatch.setattr(loop, "admit_samples", _admit_everything_as(library.load_source("arithmetic")))
    calls = []

    def scripted_review(policy, programs, transcripts, cfg, **kw):
        calls.append((programs, transcripts))
        return [(reply.startswith("yes"), reply)] * len(programs)

    monkeypatch.setattr(loop, "review", scripted_review)
    (metrics,), run = _run_loop(c, tmp_path, small_tokenizer)
    (programs, transcripts), = calls
    assert len(programs) == 2 and all(any(m["role"] == "user" for m in t) for t in transcripts)
    assert metrics["designer/review_rejected"] == (0 if kept else 2)
    # episodes of rejected environments are neither trained on nor counted
    assert metrics["agent/episodes"] == (8 if kept else 0)
    # rejected designs leave the designer's update (designer.reward.rejected="drop"); kept ones
    # are measured and remembered
    if kept:
        assert metrics["designer/reward_mean"] > -1.0 and len(run.memory) == 17 + 2
    else:
        assert "designer/reward_mean" not in metrics and len(run.memory) == 17
    lines = [e for e in run_log(tmp_path) if e.slot is not None]
    assert {e.admitted for e in lines} == {kept}
    assert all((e.stage == "self_review") != kept for e in lines)


def run_log(workdir):
    from spade_jax.selfplay.runlog import EnvLog

    return EnvLog(workdir).read()


def test_review_parses_yes_no_from_a_real_sampler(small_tokenizer):
    from spade_jax.designer.review import ReviewConfig, accepts, review

    assert accepts(" Yes, it works") and not accepts("no") and not accepts("maybe yes")
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
    policy = random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    out = review(policy, ["class AEnv: pass"] * 2, [[{"role": "user", "content": "hi"}]] * 2, ReviewConfig(max_new_tokens=4))
    assert len(out) == 2 and all(isinstance(k, bool) and isinstance(r, str) for k, r in out)


# Designed programs that reach `os` past the text-only import policy (a function's globals hold
# the real builtins) and then attack at run time.
_REACH_OS = 'from spade_jax.envs import extract_boxed\n_os = getattr(extract_boxed, "__glo" + "bals__")["__buil" + "tins__"]["__imp" + "ort__"]("os")\n'
KILLS_ITS_WORKER = _REACH_OS + '''

class CrashEnv:
    def __init__(self, max_turns=2, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Answer in \\\\boxed{}.", {}

    def step(self, action):
        _os.kill(_os.getpid(), 9)  # ignored by the kernel when the worker is init of its PID namespace
        _os._exit(9)

    def solution(self):
        return "\\\\boxed{1}"
'''
ATTACKS_THE_HOST = _REACH_OS + '''

class FrameEnv:
    def __init__(self, max_turns=2, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Answer in \\\\boxed{}.", {}

    def step(self, action):
        for payload in (b'{"ok":true,"value":' + b"[" * 300000 + b"]" * 300000 + b"}",
                        b'{"ok":true,"value":{"__tuple__":["x",' + b"9" * 4000 + b',true,false,{}]}}'):
            _os.write(3, len(payload).to_bytes(4, "big") + payload)
        return "never", 1.0, True, False, {}

    def solution(self):
        return "\\\\boxed{1}"
'''


@pytest.mark.parametrize("admitted", [False, True], ids=["through-admission", "played-by-the-agent"])
def test_a_run_survives_designs_that_kill_their_worker_or_attack_the_host(tmp_path, small_tokenizer, monkeypatch,
                                                                          admitted):
    """One designer batch holds a program that kills its own worker and one that writes hostile
    frames to the host: admission rejects both (or, forced through, the agent's episodes of
    them fail), the sandbox host is never lost, and the iteration trains and checkpoints."""
    from spade_jax.designer.prompts import designer_answer

    c = tiny_selfplay_config()
    c.hints.mode = "resample"  # hinted plays whatever the random policy writes as a hint
    programs = [KILLS_ITS_WORKER, ATTACKS_THE_HOST]
    real_propose = loop.propose

    def hostile_propose(*args, **kwargs):
        samples = real_propose(*args, **kwargs)
        return [dataclasses.replace(s, text=designer_answer(p)) for s, p in zip(samples, programs)]

    monkeypatch.setattr(loop, "propose", hostile_propose)
    if admitted:
        c.agent.replay_envs = 0
        from spade_jax.admission import AdmissionReport

        def admit_as_written(samples, pool, memory, admission, **unused):
            return [dataclasses.replace(s, report=AdmissionReport(True, "novelty", "", code=p))
                    for s, p in zip(samples, programs)]

        monkeypatch.setattr(loop, "admit_samples", admit_as_written)
    run = loop.SelfPlay(c, str(tmp_path), policy=_tiny_policy(c, small_tokenizer))
    try:
        (metrics,) = run.run()
        assert run.pool.local.host_restarts == 0
    finally:
        run.close()
    assert metrics["designer/proposed"] == 2
    if admitted:
        assert metrics["agent/episodes"] == 8  # 2 programs x (2 plain + 2 hinted), every one failed
        errors = [e for e in run_log(tmp_path) if e.slot is not None]
        assert len(errors) == 2
    else:
        assert metrics["designer/admitted"] == 0
        lines = [e for e in run_log(tmp_path) if e.slot is not None]
        reasons = [e.reason for e in lines]
        assert any("killed by SIGKILL" in r or "exited with code 9" in r for r in reasons), reasons
        assert any("protocol error" in r for r in reasons), reasons
    assert metrics["train/tokens"] > 0
    assert (tmp_path / "checkpoints" / "1").exists()


def test_a_delayed_designer_reward_scores_the_designs_on_every_iteration_of_their_pool(tmp_path, small_tokenizer,
                                                                                      monkeypatch):
    from spade_jax.envs import library

    c = tiny_selfplay_config()
    c.num_iterations = 2
    c.designer.regeneration_period, c.designer.reward_delay = 2, 2
    c.agent.replay_envs = 0
    c.hints.mode = "resample"
    monkeypatch.setattr(loop, "admit_samples", _admit_everything_as(library.load_source("arithmetic")))
    (first, second), run = _run_loop(c, tmp_path, small_tokenizer)
    assert "designer/reward_mean" not in first and first["train/designer_tokens"] == 0  # not due yet
    # the same pool played again, hinted only in the iteration it was designed
    assert first["agent/episodes"] == 2 * (2 + 2) and second["agent/episodes"] == 2 * 2
    # due at 0 + 2, but iteration 1 ends the run: flushed there on the plays of both iterations
    assert second["designer/reward_mean"] > -1.0 and second["train/designer_tokens"] > 0
    scored = {e.env_id: e.designer_reward for e in run_log(tmp_path) if e.designer_reward is not None}
    assert scored == {"it0000-slot00": pytest.approx(second["designer/reward_mean"]),
                      "it0000-slot01": pytest.approx(second["designer/reward_mean"])}


@pytest.mark.parametrize("switch", ["no_designer", "frozen_designer_no_memory_no_corpus"])
def test_ablation_switches(tmp_path, small_tokenizer, monkeypatch, switch):
    c = tiny_selfplay_config()
    if switch == "no_designer":
        c.designer.enabled = False
    else:
        c.designer.train = False
        c.memory.enabled = False
        c.corpus.enabled = False
        c.corpus.paths = ("/nonexistent/corpus.jsonl",)  # never read
    prompts = []
    original = loop.propose

    def recording_propose(policy, memory, corpus, cfg, **kwargs):
        designs = original(policy, memory, corpus, cfg, **kwargs)
        prompts.extend(small_tokenizer.decode(d.prompt_tokens.tolist()) for d in designs)
        return designs

    monkeypatch.setattr(loop, "propose", recording_propose)
    (metrics,), run = _run_loop(c, tmp_path, small_tokenizer)
    assert metrics["agent/episodes"] == 4 and metrics["train/tokens"] > 0  # 2 replays x 2 plain
    if switch == "no_designer":
        assert prompts == [] and "designer/proposed" not in metrics and metrics["train/designer_tokens"] == 0
    else:
        assert len(prompts) == metrics["designer/proposed"] == 2 and metrics["train/designer_tokens"] == 0
        assert all("reference_document" not in p and "EXAMPLE_ENVIRONMENTS" not in p
                   and "Do not design environments like these" not in p for p in prompts)


def test_held_out_seed_programs_stay_out_of_memory(tmp_path, small_tokenizer):
    c = tiny_selfplay_config()
    c.memory.heldout = ("tallest", "shopping")
    run = loop.SelfPlay(c, str(tmp_path), policy=_tiny_policy(c, small_tokenizer))
    try:
        names = {r.env_id for r in run.memory.records()}
    finally:
        run.close()
    assert len(names) == 15 and not any("tallest" in n or "shopping" in n for n in names), names


def test_an_agent_token_budget_ends_the_run_evaluates_its_last_iteration_and_resumes(
        tmp_path, small_tokenizer, canned_sampler, random_selfplay, monkeypatch):
    from spade_jax.envs import library
    from spade_jax.selfplay.components import evaluation

    sample = canned_sampler(small_tokenizer.encode("<answer>1</answer>"))
    monkeypatch.setattr(loop, "play_episodes", lambda *a, **k: play_episodes(*a, sample=sample, **k))
    evaluated = []
    monkeypatch.setattr(evaluation.Evaluation, "run", lambda self, step: evaluated.append(step) or {})

    def configure(budget):
        def edit(c):
            c.num_iterations = 10
            c.agent_token_budget = budget
            c.eval.suites = f"envs:{library.source_path('arithmetic')}"
            c.eval.every = 5
        return edit

    run = random_selfplay(tmp_path, configure(1))
    try:
        (metrics,) = run.run()
        assert len(run.run()) == 1  # restored at the budget: nothing left to run
    finally:
        run.close()
    per_iteration = metrics["agent/generated_tokens"]
    assert per_iteration > 0 and evaluated == [1]  # the budget's last iteration, not a multiple of eval.every
    # A larger budget resumes the run; it stops at the first iteration that reaches the budget
    # (iterations stood in for: each generates `per_iteration` tokens).
    monkeypatch.setattr(loop.SelfPlay, "iteration", lambda self, it: ({"agent/generated_tokens": per_iteration}, []))
    larger = random_selfplay(tmp_path, configure(2 * per_iteration + 1))
    try:
        assert len(larger.run()) == 3 and larger.lifecycle.agent_tokens() == 3 * per_iteration
    finally:
        larger.close()


def test_a_negative_agent_token_budget_is_refused():
    from spade_jax.selfplay.config import validate

    c = base_config()
    c.model.source = "random"
    c.agent_token_budget = -1
    with pytest.raises(ValueError, match="config.agent_token_budget: must be >= 0"):
        validate(c, 1)


def test_a_fourth_side_system_is_its_file_and_one_registration_line(tmp_path, small_tokenizer, canned_sampler,
                                                                   monkeypatch):
    """A periodic job with state, registered beside the built-in side systems: the loop runs it on
    its cadence, times it, reports its metrics and checkpoints its state; a resume restores it."""
    from spade_jax.selfplay import components

    class Counter:
        kind, name, every, at_budget_end, state_key = "job", "counter", 2, False, "counter"

        def __init__(self, context):
            self.context, self.runs = context, []

        def run(self, step):
            self.runs.append(step)
            return {"counter/runs": len(self.runs), "counter/memory": len(self.context.memory_records())}

        def to_state(self):
            return {"runs": self.runs}

        def load_state(self, state):
            self.runs = list((state or {}).get("runs", []))

    registry = components.REGISTRY + (Counter,)
    sample = canned_sampler(small_tokenizer.encode("\\boxed{1}"))
    monkeypatch.setattr(loop, "play_episodes", lambda *a, **k: play_episodes(*a, sample=sample, **k))
    c = tiny_selfplay_config()
    c.designer.enabled = False
    c.num_iterations = 2
    run = loop.SelfPlay(c, str(tmp_path), policy=_tiny_policy(c, small_tokenizer), registry=registry)
    try:
        first, second = run.run()
        assert run.components.named("counter").runs == [2]
    finally:
        run.close()
    assert "counter/runs" not in first and second["counter/runs"] == 1 and second["counter/memory"] == 17
    assert second["time/counter_s"] >= 0
    resumed = loop.SelfPlay(c, str(tmp_path), policy=_tiny_policy(c, small_tokenizer), registry=registry)
    try:
        assert resumed.lifecycle.restore() and resumed.components.named("counter").runs == [2]
    finally:
        resumed.close()
