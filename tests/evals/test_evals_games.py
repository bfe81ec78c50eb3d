"""Gymnax games as text (`gymnax` suite): scripted play wins and loses through the game pool,
and a tiny policy plays them end to end through the runner."""

import jax
import pytest

from spade_jax.agent import AgentConfig
from spade_jax.envs.contract import is_success
from spade_jax.evals import runner
from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import SuiteUnavailable
from spade_jax.evals.suites.gymnax_text import GAMES, HostGamePool
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.sandbox.records import EpisodeSpec


def _best(game, e):
    s = e.state
    if game == "Catch-bsuite":
        return "left" if s.paddle_x > s.ball_x else "right" if s.paddle_x < s.ball_x else "stay"
    if game == "MemoryChain-bsuite":
        return str(int(s.context[s.query]))
    if game == "BernoulliBandit-misc":
        return str(int(s.reward_probs.argmax()))
    if game == "GaussianBandit-misc":
        return str(int(s.mu > 0))
    return "a" if not bool(e.env.action_mapping[s.row, s.column]) else "b"


def _worst(game, e):
    best = _best(game, e)
    return {"left": "right", "right": "left", "stay": "left", "0": "1", "1": "0", "a": "b", "b": "a"}[best]


def _play(game, seed, policy):
    pool = HostGamePool()
    (start,) = pool.start([EpisodeSpec(program=game, seed=seed)])
    for _ in range(GAMES[game].max_turns):
        (result,) = pool.step([start.episode_id], [f"I pick \\boxed{{{policy(game, pool._episodes[start.episode_id])}}}"])
        if result.done:
            return result
    raise AssertionError("the game did not end within its turn bound")


@pytest.mark.parametrize("game", list(GAMES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_scripted_winner_wins_and_a_contrarian_loses(game, seed):
    won = _play(game, seed, _best)
    assert won.terminated and won.reward == 1.0 and is_success(won.reward)
    lost = _play(game, seed, _worst)
    assert lost.terminated and lost.reward <= 0.0 and not is_success(lost.reward)


def test_a_bandit_player_that_explores_then_exploits_wins_and_one_that_splits_its_pulls_loses():
    for seed in range(4):
        for game in ("BernoulliBandit-misc", "GaussianBandit-misc"):
            pool = HostGamePool()
            (start,) = pool.start([EpisodeSpec(program=game, seed=seed)])
            e = pool._episodes[start.episode_id]
            assert "Pull 1 of 10" in start.observation and "arm 1: pulled 0 times" in start.observation
            explore = ["0", "1", _best(game, e)] + [_best(game, e)] * 7
            results = [pool.step([start.episode_id], [f"\\boxed{{{a}}}"])[0] for a in explore]
            assert [r.terminated for r in results] == [False] * 9 + [True] and results[-1].reward == 1.0
            assert "arm 0: pulled 1 times" in results[1].observation
            (start,) = pool.start([EpisodeSpec(program=game, seed=seed)])
            split = [pool.step([start.episode_id], [f"\\boxed{{{turn % 2}}}"])[0] for turn in range(10)]
            assert split[-1].terminated and split[-1].reward == 0.0


def test_an_invalid_action_ends_the_episode_with_a_reason():
    pool = HostGamePool()
    (start,) = pool.start([EpisodeSpec(program="Catch-bsuite", seed=0)])
    assert "\\boxed{...}: left, stay, right" in start.observation
    (result,) = pool.step([start.episode_id], ["\\boxed{jump}"])
    assert result.truncated and not result.ok and "invalid action 'jump'" in result.error


def test_unknown_games_are_refused_and_the_suite_is_registered():
    assert "gymnax" in registered()
    with pytest.raises(SuiteUnavailable, match="unknown gymnax game"):
        make_suite("gymnax:Pong-misc", None, runner.EvalConfig())


def test_a_tiny_policy_plays_every_game_end_to_end(small_tokenizer, tmp_path):
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
    policy = random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    cfg = runner.EvalConfig(suites="gymnax", plays_per_program=2, seed=5)
    agent = AgentConfig(max_new_tokens=8, context_budget=1024)
    first = runner.run_suites(policy, None, cfg, agent, tmp_path / "a", progress=False)
    runner.run_suites(policy, None, cfg, agent, tmp_path / "b", progress=False)
    summary = first[0].summary
    assert summary["items"] == 2 * len(GAMES) and set(summary["groups"]) == set(GAMES)
    assert 0.0 <= summary["score"] <= 1.0
    assert (tmp_path / "a" / "gymnax.jsonl").read_text() == (tmp_path / "b" / "gymnax.jsonl").read_text()
    assert (tmp_path / "a" / "gymnax.md").exists()
