"""Gymnax environments as text games (`gymnax[:NAMES]`): Catch, DeepSea, MemoryChain and the
Bernoulli and Gaussian two-armed bandits.

Each item is one episode of a gymnax environment, played through the agent's own multi-turn
engine: every observation is written as text (the grid, the bits to remember and the
question, or each arm's pulls and payouts so far), every reply gives one action as
``\\boxed{name}``. Gymnax needs JAX, which the
sandbox's workers do not have, so these environments step in the trainer's process through
`HostGamePool`, which answers the sandbox pool's calls (`start`, `step`, `solution`,
`close`); they are gymnax's own code, not model-written, so they need no sandbox. An episode
is won when its gymnax return shows success (the ball caught, the treasure reached, the bit
recalled); the won episode reports reward 1, a lost one its return (at most 0).

Gymnax's bandits never end and pay 0/1 (Bernoulli: arms with probabilities 0.9 and 0.1,
which is which drawn per episode) or a Gaussian draw (arm 0 pays exactly 0, arm 1 about a mean
drawn per episode from N(-1, 1)). Here an episode is `BANDIT_PULLS` pulls, and it is won when
at least `BANDIT_WIN_SHARE` of them went to the arm with the higher expected payout: a few
pulls to explore, then exploitation. A lost bandit episode reports reward 0.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from spade_jax.envs.contract import extract_boxed
from spade_jax.evals.registry import register
from spade_jax.evals.suite import Context, GenerationSettings, InProcessPool, Item, Score, SuiteUnavailable, spread
from spade_jax.sandbox.records import StepResult


BANDIT_PULLS = 10
BANDIT_WIN_SHARE = 0.7


def _grid(rows, marks: dict[tuple[int, int], str]) -> str:
    return "\n".join("".join(marks.get((r, c), ".") for c in range(len(rows[0]))) for r in range(len(rows)))


def _catch(e: "_Episode") -> str:
    state = e.state
    obs = e.env.get_obs(state)
    return ("A ball falls one row per step; catch it with the paddle (=) on the bottom row.\n"
            + _grid(obs, {(int(state.ball_y), int(state.ball_x)): "o",
                          (int(state.paddle_y), int(state.paddle_x)): "="}))


def _deep_sea(e: "_Episode") -> str:
    state, size = e.state, e.env.size
    return (f"You descend one row per step through a {size}x{size} sea (@ is you). A treasure lies at the "
            "bottom right; which of the two actions moves you right differs from cell to cell.\n"
            + _grid([[0] * size] * size, {(int(state.row), int(state.column)): "@"}))


def _memory_chain(e: "_Episode") -> str:
    state = e.state
    time, length = int(state.time), int(e.params.memory_length)
    lines = [f"Step {time + 1} of {length + 1}."]
    if time == 0:
        lines.append("Remember these bits: " + " ".join(f"bit {i} = {int(b)}" for i, b in enumerate(state.context)))
    if time == length:
        lines.append(f"Question: what was bit {int(state.query)}? Answer with its value.")
    else:
        lines.append("Any action continues.")
    return "\n".join(lines)


def _bandit(e: "_Episode") -> str:
    lines = [f"Two slot machines, arm 0 and arm 1, each pays out at random; collect as much as you can. "
             f"Pull {e.turn + 1} of {BANDIT_PULLS}."]
    for arm in (0, 1):
        pulls = e.pulls[arm]
        paid = f", paid {sum(pulls):g} in total" if pulls else ""
        lines.append(f"arm {arm}: pulled {len(pulls)} times{paid}")
    return "\n".join(lines)


def _returned_success(e: "_Episode") -> bool:
    return e.episode_return > 0.5


def _best_arm_pulled(best_arm: Callable) -> Callable:
    def won(e: "_Episode") -> bool:
        return len(e.pulls[best_arm(e.state)]) >= BANDIT_WIN_SHARE * BANDIT_PULLS

    return won


@dataclasses.dataclass(frozen=True)
class Game:
    """How a gymnax environment is shown and judged: its action names, the text of a state,
    whether a finished episode is won, and a bound on its turns (`pulls`: the episode ends
    after that many steps, for environments that never end by themselves)."""

    env_id: str
    actions: tuple[str, ...]
    render: Callable
    won: Callable
    max_turns: int
    pulls: int | None = None


GAMES = {
    "Catch-bsuite": Game("Catch-bsuite", ("left", "stay", "right"), _catch, _returned_success, 12),
    "DeepSea-bsuite": Game("DeepSea-bsuite", ("a", "b"), _deep_sea, _returned_success, 10),
    "MemoryChain-bsuite": Game("MemoryChain-bsuite", ("0", "1"), _memory_chain, _returned_success, 8),
    "BernoulliBandit-misc": Game("BernoulliBandit-misc", ("0", "1"), _bandit,
                                 _best_arm_pulled(lambda state: int(state.reward_probs.argmax())),
                                 BANDIT_PULLS, pulls=BANDIT_PULLS),
    "GaussianBandit-misc": Game("GaussianBandit-misc", ("0", "1"), _bandit,
                                _best_arm_pulled(lambda state: int(state.mu > 0)), BANDIT_PULLS, pulls=BANDIT_PULLS),
}


@dataclasses.dataclass
class _Episode:
    game: Game
    env: object
    params: object
    state: object
    key: object
    episode_return: float = 0.0
    turn: int = 0
    pulls: tuple[list[float], ...] = dataclasses.field(default_factory=lambda: ([], []))


class HostGamePool(InProcessPool):
    """The sandbox pool's episode calls for gymnax games stepping in this process."""

    def start(self, specs):
        import gymnax
        import jax

        results = []
        for spec in specs:
            episode_id = self._new_id()
            game = GAMES[spec.program]
            env, params = gymnax.make(game.env_id)
            key, reset_key = jax.random.split(jax.random.PRNGKey(spec.seed or 0))
            _, state = env.reset_env(reset_key, params)
            self._episodes[episode_id] = _Episode(game, env, params, state, key)
            results.append(StepResult(episode_id, observation=self._observation(self._episodes[episode_id])))
        return results

    def step(self, episode_ids, actions):
        import jax

        results = []
        for episode_id, action in zip(episode_ids, actions):
            e = self._episodes[episode_id]
            choice = (extract_boxed(action) or action or "").strip().lower()
            if choice not in e.game.actions:
                results.append(StepResult(episode_id, truncated=True, turn=e.turn,
                                          error=f"invalid action {choice[:40]!r}: choose one of {list(e.game.actions)}"))
                continue
            e.key, step_key = jax.random.split(e.key)
            action = e.game.actions.index(choice)
            _, e.state, reward, done, *_ = e.env.step_env(step_key, e.state, action, e.params)
            e.episode_return += float(reward)
            if e.game.pulls:
                e.pulls[action].append(float(reward))
            e.turn += 1
            if bool(done) or e.turn == e.game.pulls:
                won = e.game.won(e)
                final = 1.0 if won else 0.0 if e.game.pulls else min(e.episode_return, 0.0)
                results.append(StepResult(episode_id, observation="The game is over.", reward=final, raw_reward=final,
                                          terminated=True, turn=e.turn))
            else:
                results.append(StepResult(episode_id, observation=self._observation(e), turn=e.turn))
        return results

    @staticmethod
    def _observation(e: _Episode) -> str:
        choices = ", ".join(e.game.actions)
        return f"{e.game.render(e)}\nReply with one action as \\boxed{{...}}: {choices}."


@dataclasses.dataclass
class GymnaxSuite:
    games: tuple[str, ...]
    settings: GenerationSettings
    plays_per_program: int
    name: str = "gymnax"

    def items(self, limit, seed):
        items = [Item(f"{game}/seed{seed + j}", group=game, program=game, seed=seed + j,
                      max_turns=GAMES[game].max_turns)
                 for game in self.games for j in range(self.plays_per_program)]
        return [items[i] for i in spread([item.group for item in items], limit, seed, "gymnax")]

    def episode_pool(self, context: Context):
        return HostGamePool()

    def score(self, item: Item, trajectory, context: Context) -> Score:
        return Score(1.0 if trajectory.won else 0.0, trajectory.won,
                     {"reward": trajectory.reward, "turns": trajectory.turns, "end": trajectory.end_reason,
                      "error": trajectory.error})


@register("gymnax", GenerationSettings(temperature=0.0, max_new_tokens=32))
def make(argument: str, settings: GenerationSettings, eval_config) -> GymnaxSuite:
    """Gymnax Catch, DeepSea, MemoryChain and two bandits as multi-turn text games."""
    games = tuple(name for name in argument.split(",") if name) or tuple(GAMES)
    unknown = [name for name in games if name not in GAMES]
    if unknown:
        raise SuiteUnavailable(f"unknown gymnax game(s) {unknown}; choose from {list(GAMES)}")
    return GymnaxSuite(games, settings, eval_config.plays_per_program)
