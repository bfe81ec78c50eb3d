"""TextArena games (`textarena` suite): scripted solvers win and invalid players lose through the game
pool and the suite's score, against the random opponent and in self-play; the episodes are
deterministic; a tiny policy plays end to end through the runner."""

import functools
import itertools
import random
import re
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from spade_jax.agent import AgentConfig, EpisodeRequest, Trajectory
from spade_jax.envs.contract import is_success
from spade_jax.evals import runner
from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import Context, GenerationSettings, SuiteUnavailable
from spade_jax.evals.suites.textarena_games import (GAMES, RANDOM, SELF_PLAY, ArenaPool, TextArenaSuite,
                                                    evaluated_side, textarena_action)
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.sandbox.records import EpisodeSpec

HANOI = ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]


def _guess(e, observation):
    low, high = e.bounds
    hint = re.findall(r"The target number is (higher|lower)", observation)
    if hint and e.last is not None:
        low, high = (e.last + 1, high) if hint[-1] == "higher" else (low, e.last - 1)
    e.bounds, e.last = (low, high), (low + high) // 2
    return f"[{e.last}]"


def _mines(env):
    if env.first_move:
        return "[2 2]"
    return next(f"[{r} {c}]" for r in range(env.rows) for c in range(env.cols)
                if env.grid[r][c] != -1 and not env.revealed[r][c])


def _sudoku(env):
    board = env.state.game_state["board"]
    r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c] == 0)
    return f"[{r + 1} {c + 1} {env.full_grid[r][c]}]"


def _countdown_plan(numbers, target):
    """Index moves that reach ``target`` (the game removes both operands and appends the result)."""
    if target in numbers:
        return []
    for i, j in itertools.permutations(range(len(numbers)), 2):
        a, b = numbers[i], numbers[j]
        results = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b and a % b == 0 else None}
        for op, result in results.items():
            if result is not None:
                plan = _countdown_plan(tuple(n for k, n in enumerate(numbers) if k not in (i, j)) + (result,), target)
                if plan is not None:
                    return [f"[{i} {j} {op}]"] + plan
    return None


LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


@functools.lru_cache(maxsize=None)
def _tic_tac_toe_value(board: tuple, me: str, them: str) -> tuple[int, int | None]:
    """Minimax: (the value for ``me`` to move, the best cell)."""
    if any(all(board[i] == them for i in line) for line in LINES):
        return -1, None
    free = [i for i, cell in enumerate(board) if not cell]
    if not free:
        return 0, None
    return max(((-_tic_tac_toe_value(board[:cell] + (me,) + board[cell + 1:], them, me)[0], cell) for cell in free),
               key=lambda pair: pair[0])


def _tic_tac_toe(env, side):
    board = tuple(cell for row in env.state.game_state["board"] for cell in row)
    return f"[{_tic_tac_toe_value(board, *(('O', 'X') if side == 0 else ('X', 'O')))[1]}]"


def _connect_four(env, side):
    board = env.state.game_state["board"]
    me, them = ("X", "O") if side == 0 else ("O", "X")
    free = [c for c in range(7) if board[0][c] == "."]

    def wins(col, disc):
        row = max(r for r in range(6) if board[r][col] == ".")
        board[row][col] = disc
        won = env._check_win(row, col)
        board[row][col] = "."
        return won

    choice = next((c for c in free if wins(c, me)), None)
    choice = next((c for c in free if wins(c, them)), None) if choice is None else choice
    return f"[col {min(free, key=lambda c: abs(c - 3)) if choice is None else choice}]"


def _kuhn_poker(env, side):
    state = env.state.game_state
    legal = state["current_legal_action_tree"]
    mine, theirs = state["player_cards"][side], state["player_cards"][1 - side]
    order = ["bet", "call"] if mine > theirs else ["bet", "fold"]  # a bluff is the lower card's only chance
    return f"[{next(action for action in order if action in legal)}]"


def _nim(env, side):
    piles = env.state.game_state["piles"]
    total = 0
    for pile in piles:
        total ^= pile
    for index, pile in enumerate(piles):
        if pile ^ total < pile:
            return f"[{index} {pile - (pile ^ total)}]"
    index = max(range(len(piles)), key=lambda i: piles[i])
    return f"[{index} 1]"


def _best(game, e, observation):
    env, side = e.env, e.side
    if game == "GuessTheNumber-v0":
        return _guess(e, observation)
    if game == "Mastermind-v0":
        return "[" + " ".join(map(str, env.state.game_state["secret_code"])) + "]"
    if game == "Minesweeper-v0-small":
        return _mines(env)
    if game == "TowerOfHanoi-v0":
        return f"[{HANOI[e.turn]}]"
    if game == "Sudoku-v0-very-easy":
        return _sudoku(env)
    if game == "Countdown-v0":
        return _countdown_plan(tuple(env.numbers), env.target)[0]
    return {"TicTacToe-v0": _tic_tac_toe, "ConnectFour-v0": _connect_four, "KuhnPoker-v0": _kuhn_poker,
            "Nim-v0": _nim}[game](env, side)


def _invalid(game, e, observation):
    return "I pass."


def _trajectory(program, seed, result, turns):
    """What the agent's engine makes of an episode's last step."""
    end = "terminated" if result.terminated else "error" if result.error else "max_turns"
    reward = result.reward if result.terminated else 0.0
    return Trajectory(EpisodeRequest(0, program, seed), np.zeros(0, np.int32), np.zeros(0, bool),
                      np.zeros(0, np.float32), reward, result.terminated and is_success(result.reward), turns, end,
                      result.error, [])


def _play(program, seed, player, pool=None):
    game = program.partition("/")[0]
    pool = pool or ArenaPool(GenerationSettings())
    (result,) = pool.start([EpisodeSpec(program=program, seed=seed)])
    e = pool._episodes[result.episode_id]
    e.bounds, e.last = (1, 20), None
    for turn in range(GAMES[game].max_turns):
        if result.done:
            return _trajectory(program, seed, result, turn)
        action = player(game, e, result.observation)
        (result,) = pool.step([result.episode_id], [action])
    assert result.done, "the game did not end within its turn bound"
    return _trajectory(program, seed, result, GAMES[game].max_turns)


def _score(program, seed, trajectory):
    suite = make_suite("textarena", None, runner.EvalConfig())
    (item,) = [item for item in suite.items(None, seed) if item.program == program and item.seed == seed]
    return suite.score(item, trajectory, Context())


# Seeds (both sides) on which the scripted player beats the random opponent: perfect tic-tac-toe draws
# some games, and Kuhn poker is partly luck even for a player who sees both cards.
SOLVER_SEEDS = {"TicTacToe-v0": [0, 1, 2], "ConnectFour-v0": [0, 1, 2], "KuhnPoker-v0": [1, 3, 4], "Nim-v0": [0, 1, 2]}


@pytest.mark.parametrize("program,seed", [(g, s) for g in GAMES if GAMES[g].players == 1 for s in (0, 1, 2)]
                         + [(f"{g}/{RANDOM}", s) for g, seeds in SOLVER_SEEDS.items() for s in seeds])
def test_a_scripted_solver_scores_1_and_an_invalid_player_0(program, seed):
    won = _play(program, seed, _best)
    assert won.won and won.reward == 1.0 and won.end_reason == "terminated"
    assert _score(program, seed, won).value == 1.0 and _score(program, seed, won).solved
    lost = _play(program, seed, _invalid)
    assert lost.end_reason == "terminated" and not lost.won and lost.turns == 2
    score = _score(program, seed, lost)
    assert score.value == 0.0 and not score.solved
    if GAMES[program.partition("/")[0]].players == 2:
        assert lost.reward == -1.0 and score.details["side"] == seed % 2


def test_a_two_player_draw_scores_half():
    """Perfect play on both sides of tic-tac-toe is a draw."""
    pool = ArenaPool(GenerationSettings())
    (start,) = pool.start([EpisodeSpec(program="TicTacToe-v0/random", seed=0)])
    e = pool._episodes[start.episode_id]
    e.opponent_rng = SimpleNamespace(choice=lambda moves: _tic_tac_toe(e.env, 1 - e.side))
    for turn in range(1, 6):
        (result,) = pool.step([start.episode_id], [_tic_tac_toe(e.env, e.side)])
        if result.done:
            break
    assert result.terminated and result.reward == 0.0
    score = _score("TicTacToe-v0/random", 0, _trajectory("TicTacToe-v0/random", 0, result, turn))
    assert score.value == 0.5 and not score.solved


def test_a_boxed_reply_is_a_bracketed_move():
    assert textarena_action("\\boxed{4}") == "[4]"
    assert textarena_action("\\boxed{[col 3]}") == "[col 3]"
    assert textarena_action("A C") == "[A C]"
    assert textarena_action("I move [A C] now") == "I move [A C] now"
    assert textarena_action("x" * 600 + " so I move [A C]") == "x" * 600 + " so I move [A C]"
    assert textarena_action("Thinking... \\boxed{1} no, \\boxed{2}") == "[2]"


class _ScriptedOpponent:
    """`complete_chats` for self-play tests: every opponent reply is ``reply(pool)``; records the calls."""

    def __init__(self, reply):
        self.reply, self.calls, self.pool = reply, [], None

    def __call__(self, policy, chats, **kwargs):
        self.calls.append(([list(chat) for chat in chats], kwargs))
        return [SimpleNamespace(text=self.reply(self.pool)) for _ in chats]


def _self_play_pool(reply, max_position_embeddings=4096):
    tokenizer = SimpleNamespace(escape_special=lambda text: text,
                                apply_chat_template=lambda chat, **_: [0] * sum(len(m["content"]) for m in chat))
    config = SimpleNamespace(max_position_embeddings=max_position_embeddings)
    policy = SimpleNamespace(tokenizer=tokenizer, config=config)
    opponent = _ScriptedOpponent(reply)
    opponent.pool = ArenaPool(GenerationSettings(max_new_tokens=16), policy, seed=7, complete=opponent)
    return opponent.pool, opponent


def _first_legal_move(pool):
    (e,) = pool._episodes.values()
    return e.game.legal_moves(e.env.state)[0]


@pytest.mark.parametrize("game", [g for g in GAMES if GAMES[g].players == 2])
def test_in_self_play_the_policy_answers_for_the_opponent(game):
    program = f"{game}/{SELF_PLAY}"
    pool, opponent = _self_play_pool(lambda pool: "\\boxed{resign}")
    won = _play(program, 0, _best, pool)
    assert won.won and _score(program, 0, won).value == 1.0
    chats, kwargs = opponent.calls[0]
    assert chats[0][0]["role"] == "system" and "Player 1" in chats[0][1]["content"]
    assert kwargs["max_new_tokens"] == 16 and len(opponent.calls) == 2
    pool, _ = _self_play_pool(_first_legal_move)
    lost = _play(program, 0, _invalid, pool)
    assert not lost.won and _score(program, 0, lost).value == 0.0


def test_self_play_samples_all_opponents_of_a_step_in_one_batch():
    pool, opponent = _self_play_pool(lambda pool: "[0 1]")
    starts = pool.start([EpisodeSpec(program="Nim-v0/self-play", seed=s) for s in (0, 1, 2, 3)])
    assert len(opponent.calls) == 1 and len(opponent.calls[0][0]) == 2  # sides 1 of seeds 1 and 3 wait for them
    assert [evaluated_side(GAMES["Nim-v0"], s) for s in (0, 1, 2, 3)] == [0, 1, 0, 1]
    pool.step([s.episode_id for s in starts], ["[2 1]"] * 4)
    assert len(opponent.calls) == 2 and len(opponent.calls[1][0]) == 4
    assert opponent.calls[0][1]["seed"] != opponent.calls[1][1]["seed"]
    follow_up = opponent.calls[1][0][1]
    assert [m["role"] for m in follow_up] == ["system", "user", "assistant", "user"]


def test_an_episode_keeps_its_own_random_draws():
    """Kuhn poker deals every round from the global ``random``: an episode deals alike whatever that
    generator's state and whichever episodes run beside it, and leaves the generator as it was."""
    def observations(seeds):
        pool = ArenaPool(GenerationSettings())
        results = pool.start([EpisodeSpec(program="KuhnPoker-v0/random", seed=s) for s in seeds])
        seen = [[r.observation] for r in results]
        for _ in range(4):
            ids = [r.episode_id for r in results]
            results = pool.step(ids, [pool._episodes[i].game.legal_moves(pool._episodes[i].env.state)[0] for i in ids])
            for log, result in zip(seen, results):
                log.append(result.observation)
        return dict(zip(seeds, seen))

    random.seed(99)
    expected = random.random()
    random.seed(99)
    alone = observations([5])
    assert random.random() == expected
    together = observations([6, 5])
    assert together[5] == alone[5] and together[6] != together[5]
    assert sum("Starting round" in text for text in alone[5]) >= 2


def test_unknown_games_and_a_missing_package_are_one_line(monkeypatch):
    assert "textarena" in registered()
    with pytest.raises(SuiteUnavailable, match="unknown textarena game"):
        make_suite("textarena:Chess-v0", None, runner.EvalConfig())
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(SuiteUnavailable) as err:
        make_suite("textarena:Nim-v0", None, runner.EvalConfig())
    assert "pip install --no-deps textarena==0.7.4" in str(err.value) and "\n" not in str(err.value)


def test_items_name_each_game_and_mode():
    suite = make_suite("textarena:GuessTheNumber-v0,Nim-v0", None, runner.EvalConfig(plays_per_program=2))
    assert isinstance(suite, TextArenaSuite)
    items = suite.items(None, 10)
    assert [item.item_id for item in items] == [
        "GuessTheNumber-v0/seed10", "GuessTheNumber-v0/seed11", "Nim-v0/random/seed10", "Nim-v0/random/seed11",
        "Nim-v0/self-play/seed10", "Nim-v0/self-play/seed11"]
    assert {item.group for item in items} == {"GuessTheNumber-v0", "Nim-v0/random", "Nim-v0/self-play"}
    assert len(suite.items(3, 10)) == 3


def test_a_tiny_policy_plays_end_to_end(small_tokenizer, tmp_path):
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
    policy = random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    cfg = runner.EvalConfig(suites="textarena:GuessTheNumber-v0,TicTacToe-v0", plays_per_program=2, seed=5)
    agent = AgentConfig(context_budget=2048)
    generation = {"textarena": GenerationSettings(temperature=1.0, max_new_tokens=8)}
    first = runner.run_suites(policy, None, cfg, agent, tmp_path / "a", generation, progress=False)
    runner.run_suites(policy, None, cfg, agent, tmp_path / "b", generation, progress=False)
    summary = first[0].summary
    assert summary["items"] == 6
    assert set(summary["groups"]) == {"GuessTheNumber-v0", "TicTacToe-v0/random", "TicTacToe-v0/self-play"}
    assert 0.0 <= summary["score"] <= 1.0
    name = "textarena"
    assert (tmp_path / "a" / f"{name}.jsonl").read_text() == (tmp_path / "b" / f"{name}.jsonl").read_text()
    assert (tmp_path / "a" / f"{name}.md").exists() and (tmp_path / "a" / f"{name}.json").exists()


def test_a_self_play_opponent_whose_chat_outgrows_the_model_ends_the_episode():
    pool, opponent = _self_play_pool(lambda pool: "[0 1]", max_position_embeddings=200)
    (start,) = pool.start([EpisodeSpec(program="Nim-v0/self-play", seed=1)])
    assert start.truncated and "no longer fits" in start.error and not opponent.calls
