"""Conformance: an agent episode's outcome follows the reference's rules (spade-rl/spade, issue 32).

Each test plays one small environment program in the real sandbox with a scripted agent
(`play_episodes(sample=...)`) and checks the reference's rule, computed here by hand from
its code:

* `ref_episode_reward` is core/utils/rewards.py:47-50 (last reward clipped to [-1, 1] when
  the episode terminated, else 0);
* a step() that raises or returns anything but a 5-tuple is answered by the reference's
  wrapper with reward -1.0 and terminated=True (core/envs/synthetic_game_env.py:402-434);
* a reply without EOS (cut at max_tokens) is not stepped: the episode stops, truncated,
  with the rewards so far (core/orchestrator.py:474-489);
* a step past ENV_STEP_TIMEOUT returns a FAILED trajectory, left out of the plays
  (orchestrator.py:490-510, 1614-1624);
* a game that fails to load is left out of the plays;
* hinted plays (the hint phase, orchestrator.py:1783-1917) step a cut reply and score a
  timeout 0;
* the actor's first prompt is one user message, no system turn, the observation wrapped in
  the actor template (orchestrator.py:256-266).

Evaluation's rule (`AgentConfig.every_play_counts`: no play dropped) and the prompt options are the last tests.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from spade_jax.agent import AgentConfig, EpisodeRequest, play_episodes
from spade_jax.sampling import Generation, GenerationStats
from spade_jax.sandbox import SandboxConfig, SandboxPool

AGENT = AgentConfig(max_turns=3, max_new_tokens=32, context_budget=1024)

GUESS = '''
class GuessEnv:
    """Answer \\\\boxed{7} to win."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say seven.", {}

    def step(self, action):
        won = extract_boxed(action) == "7"
        return ("Right." if won else "No."), (1.0 if won else 0.0), won, False, {}
'''

RAISES = GUESS.replace('won = extract_boxed(action) == "7"', 'raise ValueError("broken step")')
MALFORMED = GUESS.replace('return ("Right." if won else "No."), (1.0 if won else 0.0), won, False, {}',
                          'return "Right.", 1.0, won')
HANGS = GUESS.replace('won = extract_boxed(action) == "7"', "while True:\n            pass")


def ref_episode_reward(rewards: list[float], terminated: bool) -> float:
    """core/utils/rewards.py:47-50."""
    if not rewards or not terminated:
        return 0.0
    return max(-1.0, min(1.0, float(rewards[-1])))


def scripted(reply: str, finished: bool = True):
    """A sampler that answers every prompt with `reply`; `finished` False: cut at the token limit."""

    def sample(policy, prompts, *, max_new_tokens, **unused):
        tok = policy.tokenizer
        ids = tok.encode(reply) + ([tok.eos_token_ids[0]] if finished else [])
        assert len(ids) <= max_new_tokens
        n = len(prompts)
        return Generation(tokens=np.tile(np.asarray(ids, np.int32), (n, 1)),
                          logprobs=np.zeros((n, len(ids)), np.float32), lengths=np.full(n, len(ids), np.int32),
                          finished=np.full(n, finished), stats=GenerationStats(0.0, 0.0, 0.0, len(ids), (n, 0, len(ids))))

    return sample


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2, call_timeout_s=1.0)) as p:
        yield p


@pytest.fixture(scope="module")
def policy(small_tokenizer):
    return types.SimpleNamespace(tokenizer=small_tokenizer)


def play(policy, pool, program, sample, cfg=AGENT):
    return play_episodes(policy, pool, [EpisodeRequest(0, program, seed=5)], cfg, sample=sample)[0]


def test_a_step_that_raises_scores_minus_one(policy, pool):
    t = play(policy, pool, RAISES, scripted("\\boxed{7}"))
    assert t.reward == ref_episode_reward([-1.0], True) == -1.0
    assert t.end_reason == "error" and "broken step" in t.error and not t.won and t.turns == 1
    assert not t.dropped


def test_a_malformed_step_result_scores_minus_one(policy, pool):
    t = play(policy, pool, MALFORMED, scripted("\\boxed{7}"))
    assert t.reward == ref_episode_reward([-1.0], True) == -1.0
    assert t.end_reason == "error" and "contract violation" in t.error and not t.dropped


def test_a_reply_cut_at_max_new_tokens_is_not_stepped(policy, pool):
    """The cut reply would win (\\boxed{7}); the reference never steps it: reward 0, one turn,
    its tokens kept for training (loss mask on)."""
    t = play(policy, pool, GUESS, scripted("\\boxed{7}", finished=False))
    assert t.end_reason == "max_new_tokens" and t.turns == 1 and not t.dropped
    assert t.reward == ref_episode_reward([], False) == 0.0 and not t.won
    assert [m["role"] for m in t.messages] == ["user", "assistant"]
    assert t.loss_mask.sum() == len(policy.tokenizer.encode("\\boxed{7}"))


def test_a_finished_winning_reply_is_stepped(policy, pool):
    t = play(policy, pool, GUESS, scripted("\\boxed{7}"))
    assert t.end_reason == "terminated" and t.won and t.reward == ref_episode_reward([1.0], True) == 1.0


def test_a_step_timeout_drops_the_play(policy, pool):
    t = play(policy, pool, HANGS, scripted("\\boxed{7}"))
    assert t.end_reason == "timeout" and t.dropped and not t.won


def test_no_system_turn_and_the_reference_user_template_by_default(policy, pool, small_tokenizer):
    # orchestrator.py:256-266 (template "qwen3_game"): one user message wrapping the observation
    t = play(policy, pool, GUESS, scripted("\\boxed{7}"))
    wrapped = ("You are playing a language game. Make valid actions to win.\nObservation: Say seven.\n"
               "Please reason step by step, and put your final answer within \\boxed{}.")
    assert t.messages[0] == {"role": "user", "content": wrapped}
    assert all(m["role"] != "system" for m in t.messages)
    first = small_tokenizer.apply_chat_template([{"role": "user", "content": wrapped}])
    assert t.tokens[: len(first)].tolist() == first


NO_LOAD = GUESS.replace("class GuessEnv:", "raise RuntimeError('cannot load')\n\n\nclass GuessEnv:")


def test_a_play_whose_environment_fails_to_start_is_dropped(policy, pool):
    # the reference leaves a game that fails to load out of its plays
    t = play(policy, pool, NO_LOAD, scripted("\\boxed{7}"))
    assert t.end_reason == "error" and t.dropped


def test_hinted_plays_follow_the_reference_hint_phase(policy, pool):
    # orchestrator.py:1783-1917: a hinted play steps a cut reply and scores a timeout 0, kept
    def hinted(program, sample, cfg=AGENT):
        request = EpisodeRequest(0, program, seed=5, hinted=True, hint="Say the number.")
        return play_episodes(policy, pool, [request], cfg, sample=sample)[0]

    cut = hinted(GUESS, scripted("\\boxed{7}", finished=False))
    assert cut.end_reason == "terminated" and cut.reward == 1.0
    hung = hinted(HANGS, scripted("\\boxed{7}"))
    assert hung.end_reason == "timeout" and not hung.dropped and hung.reward == 0.0



def test_an_empty_hint_is_injected_as_an_empty_hint_line(policy, pool):
    """The reference's hint injection "{observation}\\n\\nHINT: {hint}" with the hint "" that a
    whitespace reply leaves (hint_generator.py:217-226): the hinted play runs, its first
    observation ending in an empty "HINT: "."""
    request = EpisodeRequest(0, GUESS, seed=5, hinted=True, hint="")
    t = play_episodes(policy, pool, [request], AGENT, sample=scripted("\\boxed{7}"))[0]
    assert "Observation: Say seven.\n\nHINT: \n" in t.messages[0]["content"]


NAN_REWARD = GUESS.replace("(1.0 if won else 0.0)", "float('nan')")


def test_a_nan_terminal_reward_is_a_broken_step_a_deliberate_difference(policy, pool):
    """The reference clips a NaN last reward to a win (`max(-1.0, min(1.0, nan))` is 1.0,
    rewards.py:47-50); spade_jax answers it as a step that broke the contract (-1), on purpose:
    a designer trained by RL would learn to return NaN and have every play count as won."""
    assert ref_episode_reward([float("nan")], True) == 1.0
    t = play(policy, pool, NAN_REWARD, scripted("\\boxed{7}"))
    assert t.reward == -1.0 and not t.won and t.end_reason == "error" and "nan" in t.error

# ---------------------------------------------------------------------------- evaluation's rule


def test_under_every_play_counts_no_play_is_dropped(policy, pool):
    """Evaluation's rule (`AgentConfig.every_play_counts`): a cut reply is stepped, a timed-out
    play scores `timeout_penalty` and one whose environment failed to start 0; none is dropped."""
    cfg = AgentConfig(max_turns=3, max_new_tokens=32, context_budget=1024, every_play_counts=True, timeout_penalty=-0.5)
    cut = play(policy, pool, GUESS, scripted("\\boxed{7}", finished=False), cfg)
    assert cut.end_reason == "terminated" and cut.reward == 1.0 and cut.won
    hung = play(policy, pool, HANGS, scripted("\\boxed{7}"), cfg)
    assert hung.end_reason == "timeout" and not hung.dropped and hung.reward == -0.5
    failed_start = play(policy, pool, NO_LOAD, scripted("\\boxed{7}"), cfg)
    assert not failed_start.dropped and failed_start.reward == 0.0
    assert play(policy, pool, RAISES, scripted("\\boxed{7}"), cfg).reward == -1.0


def test_prompts_other_than_the_references_are_options(policy, pool):
    system = play(policy, pool, GUESS, scripted("\\boxed{7}"), AgentConfig(
        max_turns=3, max_new_tokens=32, context_budget=1024, system_prompt="Play well."))
    assert system.messages[0] == {"role": "system", "content": "Play well."}
    raw = play(policy, pool, GUESS, scripted("\\boxed{7}"), AgentConfig(
        max_turns=3, max_new_tokens=32, context_budget=1024, user_template="{observation}"))
    assert raw.messages[0] == {"role": "user", "content": "Say seven."}
