"""TextArena games (`textarena[:ENV_IDS]`): single- and two-player text games played offline.

TextArena (LeonGuertler/TextArena, MIT; ``textarena==0.7.4``) writes each game's prompt and
board as text and reads moves written in square brackets (``[4]``, ``[A C]``, ``[col 3]``).
ENV_IDS is a choice of the games below (TextArena's own ids) separated by ``,``; without it,
all of them. Each item is one
episode of a game from seed ``seed + j`` (``plays_per_program`` of them), played through the
agent's own multi-turn engine; TextArena's games are Python objects stepping in this process
(`ArenaPool`), not model-written programs, so they need no sandbox. The games here need
nothing downloaded (TextArena's word games need NLTK corpora).

* single-player: GuessTheNumber-v0, Mastermind-v0, Minesweeper-v0-small, TowerOfHanoi-v0,
  Sudoku-v0-very-easy, Countdown-v0 (TextArena fixes its numbers and target, so every seed
  plays the same puzzle). Group: the env id.
* two-player: TicTacToe-v0, ConnectFour-v0, KuhnPoker-v0, Nim-v0, each in two groups:
  ``<id>/random`` against a uniformly random legal move (the opponent's own ``random.Random``
  seeded from the episode's seed) and ``<id>/self-play`` against the policy under evaluation
  (every opponent reply of a step sampled in one batch with the suite's generation settings
  and the agent's system prompt). The evaluated side alternates with the seed (player
  ``seed % 2``); the result is that side's. An opponent that loses before the evaluated side
  has moved (two invalid moves) ends the episode at its first step.

Observations are the evaluated player's TextArena messages since its last move, written as
TextArena's ``LLMObservationWrapper`` writes them (``[GAME] ...``, ``[Player 1] ...``). A reply
goes to the game as TextArena's ``ActionFormattingWrapper`` passes it (brackets added when it
has none); a ``\\boxed{X}`` reply (what the agent's system prompt asks for) is read as ``[X]``.
An invalid move is TextArena's to judge: the player is told why and may try once more; a
second invalid move in a row loses (a single-player game then ends with its progress reward).

Scores: a win 1 (single-player: TextArena's reward 1, the puzzle solved; two-player: the
evaluated side's reward 1), a two-player draw 0.5, anything else 0 (a loss, or an episode cut
by its turn bound, the context budget or an error). The episode's reward is TextArena's reward
for the evaluated player clipped to [-1, 1]: two-player 1/0/-1, single-player 1 when solved,
else TextArena's progress share in [0, 1) (closeness of the last guess, share of disks on the
goal tower, ...), which the summary's ``mean_reward`` averages; a reward that is not a number
counts 0 (0.7.4's Countdown passes its invalid-move reason and reward swapped). Turn bounds
are the most turns a game can last under its rules when every valid move follows an invalid one.

Determinism: TextArena draws from Python's global ``random`` (seeded at reset); each episode
keeps its own copy of that generator's state and swaps it in around every call into its game,
so interleaved episodes neither see nor disturb each other's draws.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
from typing import Callable

from spade_jax.agent.conversation import prompt_text
from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT
from spade_jax.envs.contract import extract_boxed
from spade_jax.evals.registry import register
from spade_jax.evals.suite import Context, GenerationSettings, InProcessPool, Item, Score, SuiteUnavailable, spread
from spade_jax.sampling.chat import complete_chats
from spade_jax.sandbox.records import StepResult
from spade_jax.seeds import derive_seed

INSTALL = "pip install --no-deps textarena==0.7.4 && pip install nltk websockets"
RANDOM, SELF_PLAY = "random", "self-play"


def _tic_tac_toe_moves(state) -> list[str]:
    board = state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _connect_four_moves(state) -> list[str]:
    top = state.game_state["board"][0]
    return [f"[col {c}]" for c in range(len(top)) if top[c] == "."]


def _kuhn_poker_moves(state) -> list[str]:
    return [f"[{action}]" for action in state.game_state["current_legal_action_tree"]]


def _nim_moves(state) -> list[str]:
    return [f"[{pile} {take}]" for pile, size in enumerate(state.game_state["piles"]) for take in range(1, size + 1)]


@dataclasses.dataclass(frozen=True)
class Game:
    """A TextArena game: its id, the evaluated player's turn bound, and for two-player games
    the legal moves of the player to move (what the random opponent chooses from)."""

    env_id: str
    max_turns: int
    legal_moves: Callable | None = None

    @property
    def players(self) -> int:
        return 1 if self.legal_moves is None else 2


GAMES = {game.env_id: game for game in (
    Game("GuessTheNumber-v0", 20),
    Game("Mastermind-v0", 40),
    Game("Minesweeper-v0-small", 40),
    Game("TowerOfHanoi-v0", 28),
    Game("Sudoku-v0-very-easy", 12),
    Game("Countdown-v0", 10),
    Game("TicTacToe-v0", 10, _tic_tac_toe_moves),
    Game("ConnectFour-v0", 42, _connect_four_moves),
    Game("KuhnPoker-v0", 12, _kuhn_poker_moves),
    Game("Nim-v0", 12, _nim_moves),
)}


def programs(games) -> list[str]:
    """The programs (and groups) of ``games``: the env id, or ``<id>/random`` and ``<id>/self-play``."""
    return [name for game in games
            for name in ([game] if GAMES[game].players == 1 else [f"{game}/{RANDOM}", f"{game}/{SELF_PLAY}"])]


def evaluated_side(game: Game, seed: int) -> int:
    """The player the policy plays: 0 in single-player games, else alternating with the seed."""
    return seed % game.players


def textarena_action(reply: str) -> str:
    """A whole reply as the game reads it: its last ``\\boxed{X}`` is ``[X]``; otherwise the reply,
    however long (TextArena finds the bracketed move in it), with brackets added where it has
    none (TextArena's ``ActionFormattingWrapper``)."""
    boxed = extract_boxed(reply)
    action = boxed.strip() if boxed is not None else reply
    return action if "[" in action or "]" in action else f"[{action}]"


def observation_text(state, messages) -> str:
    """New TextArena messages as its ``LLMObservationWrapper`` writes them."""
    from textarena import GAME_ID

    return "\n".join(f"[{'GAME' if sender == GAME_ID else state.role_mapping.get(sender, f'Player {sender}')}] {text}"
                     for sender, text, _ in messages).strip()


@dataclasses.dataclass
class _Episode:
    game: Game
    mode: str
    env: object
    side: int
    random_state: tuple
    opponent_rng: random.Random
    opponent_chat: list[dict] = dataclasses.field(default_factory=list)
    turn: int = 0
    final: StepResult | None = None


class ArenaPool(InProcessPool):
    """The sandbox pool's episode calls for TextArena games stepping in this process.

    ``policy`` plays the opponent in self-play (through ``complete``, `complete_chats` unless a
    test gives its own), sampled with ``settings``; ``seed`` seeds those samples."""

    def __init__(self, settings: GenerationSettings, policy=None, seed: int = 0, complete: Callable = complete_chats):
        self.settings = settings
        self.policy = policy
        self.seed = seed
        self.complete = complete
        super().__init__()
        self._samples = itertools.count()

    def start(self, specs) -> list[StepResult]:
        import textarena
        from textarena.wrappers import ActionFormattingWrapper

        ids = []
        for spec in specs:
            env_id, _, mode = spec.program.partition("/")
            game, seed = GAMES[env_id], spec.seed or 0
            env = ActionFormattingWrapper(textarena.make(f"{env_id}-raw"))
            episode = _Episode(game, mode, env, evaluated_side(game, seed), random.Random(seed).getstate(),
                               random.Random(derive_seed(seed, env_id, "opponent")))
            with self._own_random(episode):
                env.reset(num_players=game.players, seed=seed)
            episode_id = self._new_id()
            self._episodes[episode_id] = episode
            ids.append(episode_id)
        self._play_opponents(ids)
        return [self._result(episode_id) for episode_id in ids]

    def step(self, episode_ids, actions) -> list[StepResult]:
        for episode_id, action in zip(episode_ids, actions):
            e = self._episodes[episode_id]
            if e.final is None:
                e.turn += 1
                self._move(episode_id, textarena_action(action))
        self._play_opponents(episode_ids)
        return [self._result(episode_id) for episode_id in episode_ids]

    def _move(self, episode_id: int, action: str) -> None:
        e = self._episodes[episode_id]
        try:
            with self._own_random(e):
                e.env.step(action=action)
        except Exception as err:  # the game's own code failed on this move: the episode ends with why
            e.final = StepResult(episode_id, truncated=True, turn=e.turn,
                                 error=f"{e.game.env_id} failed: {err!r}"[:500])

    def _play_opponents(self, episode_ids) -> None:
        """Moves every opponent until each episode is over or waits for the evaluated player."""
        while True:
            waiting = [i for i in episode_ids if self._opponent_to_move(self._episodes[i])]
            if not waiting:
                return
            sampled = [i for i in waiting if self._episodes[i].mode == SELF_PLAY]
            for i in waiting:
                if i not in sampled:
                    e = self._episodes[i]
                    e.env.get_observation()  # the random opponent reads nothing; its messages are dropped
                    self._move(i, e.opponent_rng.choice(e.game.legal_moves(e.env.state)))
            for i, reply in zip(sampled, self._sample_opponents(sampled) if sampled else []):
                if reply is not None:
                    self._move(i, textarena_action(reply))

    def _sample_opponents(self, episode_ids) -> list[str | None]:
        """The policy's replies for the opponents of ``episode_ids`` in one batch (None where an
        opponent's chat no longer fits the model; that episode ends with the reason)."""
        tokenizer = self.policy.tokenizer
        fits = []
        for i in episode_ids:
            e = self._episodes[i]
            _, messages = e.env.get_observation()
            if not e.opponent_chat:
                e.opponent_chat.append({"role": "system", "content": AGENT_SYSTEM_PROMPT})
            observation = prompt_text(tokenizer, observation_text(e.env.state, messages))
            e.opponent_chat.append({"role": "user", "content": observation})
            length = len(tokenizer.apply_chat_template(e.opponent_chat, add_generation_prompt=True))
            if length + self.settings.max_new_tokens > self.policy.config.max_position_embeddings:
                e.final = StepResult(i, truncated=True, turn=e.turn,
                                     error="the self-play opponent's chat no longer fits the model")
            else:
                fits.append(i)
        completions = self.complete(self.policy, [self._episodes[i].opponent_chat for i in fits],
                                    max_new_tokens=self.settings.max_new_tokens, temperature=self.settings.temperature,
                                    top_p=self.settings.top_p,
                                    seed=derive_seed(self.seed, "textarena", next(self._samples))) if fits else []
        replies = dict(zip(fits, (completion.text for completion in completions)))
        for i, reply in replies.items():
            self._episodes[i].opponent_chat.append({"role": "assistant", "content": prompt_text(tokenizer, reply)})
        return [replies.get(i) for i in episode_ids]

    def _opponent_to_move(self, e: _Episode) -> bool:
        return e.final is None and not e.env.state.done and e.env.state.current_player_id != e.side

    def _result(self, episode_id: int) -> StepResult:
        e = self._episodes[episode_id]
        if e.final is None and e.env.state.done:
            with self._own_random(e):
                rewards, game_info = e.env.close()
            raw = (rewards or {}).get(e.side, 0.0)
            raw = float(raw) if isinstance(raw, (int, float)) else 0.0
            reason = game_info.get(e.side, {}).get("reason", "")
            e.final = StepResult(episode_id, observation=f"The game is over. {reason}".strip(),
                                 reward=max(-1.0, min(1.0, raw)), raw_reward=raw, terminated=True, turn=e.turn)
        if e.final is not None:
            return e.final
        _, messages = e.env.get_observation()
        return StepResult(episode_id, observation=observation_text(e.env.state, messages), turn=e.turn)

    @staticmethod
    @contextlib.contextmanager
    def _own_random(e: _Episode):
        """Python's global ``random`` holds the episode's own state while its game runs."""
        outer = random.getstate()
        random.setstate(e.random_state)
        try:
            yield
        finally:
            e.random_state = random.getstate()
            random.setstate(outer)


@dataclasses.dataclass
class TextArenaSuite:
    games: tuple[str, ...]
    settings: GenerationSettings
    plays_per_program: int
    name: str = "textarena"

    @staticmethod
    def read_action(reply: str) -> str:
        """The pool gets whole replies (`textarena_action` reads the move out of them)."""
        return reply

    def items(self, limit, seed):
        items = [Item(f"{program}/seed{seed + j}", group=program, program=program, seed=seed + j,
                      max_turns=GAMES[program.partition("/")[0]].max_turns)
                 for program in programs(self.games) for j in range(self.plays_per_program)]
        return [items[i] for i in spread([item.group for item in items], limit, seed, self.name)]

    def episode_pool(self, context: Context) -> ArenaPool:
        return ArenaPool(self.settings, context.policy, context.seed)

    def score(self, item: Item, trajectory, context: Context) -> Score:
        game = GAMES[item.program.partition("/")[0]]
        draw = game.players == 2 and trajectory.end_reason == "terminated" and trajectory.reward == 0.0
        value = 1.0 if trajectory.won else 0.5 if draw else 0.0
        return Score(value, trajectory.won,
                     {"reward": trajectory.reward, "side": evaluated_side(game, item.seed), "turns": trajectory.turns,
                      "end": trajectory.end_reason, "error": trajectory.error})


@register("textarena", GenerationSettings(temperature=0.0, max_new_tokens=256))
def make(argument: str, settings: GenerationSettings, eval_config) -> TextArenaSuite:
    """TextArena's offline single- and two-player games as multi-turn episodes."""
    games = tuple(name.strip() for name in argument.split(",") if name.strip()) or tuple(GAMES)
    unknown = [name for name in games if name not in GAMES]
    if unknown:
        raise SuiteUnavailable(f"unknown textarena game(s) {unknown}; choose from {list(GAMES)}")
    try:
        import textarena  # noqa: F401
    except ImportError as err:
        raise SuiteUnavailable(f"textarena cannot be imported ({err}): {INSTALL}") from None
    return TextArenaSuite(games, settings, eval_config.plays_per_program)
