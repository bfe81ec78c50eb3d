"""Batched multi-turn agent episodes on the rollout engine.

Episodes run on a `RowEngine` (`spade_jax.sampling.engine`): up to `AgentConfig.rows` at
once, one per row, each row's KV cache kept across turns, so a turn computes only its new
tokens (the observation and the next assistant header). A row whose reply ends is stepped
in the sandbox and goes on with its next turn without waiting for the other rows; a row
whose episode ends takes the next waiting episode (continuous batching). With
`overlap_sandbox` the sandbox steps finished replies while the next decode chunk runs.
`play_episodes(sample=...)` plays lock-step turns instead: one sampler call per turn for every
live episode (tests with canned samplers, external agents, the benchmark's baseline).

An episode ends when its environment terminates or truncates, a sandbox call fails or times
out, a reply is cut at `max_new_tokens`, it reaches `max_turns`, or its next turn would not fit
the context budget. Its reward follows the reference (spade-rl/spade `core/orchestrator.py`
`play_game_async`, `core/envs/synthetic_game_env.py` `step`, `core/utils/rewards.py`
`episode_reward`):

* a terminated episode scores its last reward clipped to [-1, 1]; one truncated, out of turns
  or out of context 0;
* a step() that raises, breaks the contract (a malformed result, a non-finite reward) or gets
  its worker killed (memory, output, a forbidden call: `failed_call` "step") scores -1 (the
  reference's wrapper answers a raising or malformed step with reward -1, terminated;
  synthetic_game_env.py:402-434, rewards.py:47-50); a sandbox-side refusal scores 0; a play
  whose environment failed to start is dropped, as the reference drops a game that fails to
  load;
* a reply cut at `max_new_tokens` (no stop token) is not stepped: the episode ends there
  ("max_new_tokens") and scores 0 (orchestrator.py:474-489);
* a timed-out play (any sandbox call past its deadline) is dropped (`Trajectory.dropped`):
  the reference returns a FAILED trajectory that never reaches training or the play
  statistics (orchestrator.py:490-510, 1523-1547, 1614-1624);
* hinted plays follow the reference's hint phase: a cut reply is stepped, a timeout or failed
  start scores 0 and is kept.

Evaluation plays under `AgentConfig.every_play_counts`: a benchmark drops nothing, so a cut
reply is stepped, a timed-out play scores `timeout_penalty` and one that failed to start 0.

Plain and hinted plays of an environment share seeds, so regret compares matched instances.
Sampled replies depend on the seed, the episode's index and the turn, not on rows or timing.

Everything an environment says is data: observations (and the hint appended to the first
one) enter the prompt through `Conversation`, which cleans them and escapes the
tokenizer's special-token strings (`conversation.prompt_text`); hints taken from
`solution()` are cleaned and bounded by `solution_hint`; error texts arrive cleaned and
bounded from the sandbox host.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import time
from typing import Callable, Sequence

import numpy as np

from spade_jax.agent.actions import parse_action
from spade_jax.agent.conversation import Conversation
from spade_jax.envs.contract import DEFAULT_TIMEOUT_PENALTY, episode_reward, is_success
from spade_jax.sampling import Generation
from spade_jax.sampling.engine import EngineStats, RowEngine
from spade_jax.sandbox import EpisodeSpec
from spade_jax.text import clean_text

# A system turn for the agent; not the default (`AgentConfig.system_prompt` is "", as in the
# reference), but presets and the bootstrap that trains with it set it explicitly.
AGENT_SYSTEM_PROMPT = (
    "You are playing an interactive environment. Read each observation and reply with exactly one action. "
    "Games take the action as \\boxed{...}. Tool environments take "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>, and <answer>...</answer> to finish.'
)
# The reference's actor template for the first turn (spade-rl/spade core/orchestrator.py:256-266,
# template "qwen3_game", used by its games and tool-use recipes alike; MIT): the first observation,
# hint and guidance included, goes where `{observation}` is.
REFERENCE_USER_TEMPLATE = (
    "You are playing a language game. Make valid actions to win.\n"
    "Observation: {observation}\n"
    "Please reason step by step, and put your final answer within \\boxed{}."
)
HINT_SEPARATOR = "\n\nHINT: "
GUIDANCE_SEPARATOR = "\n\nWHAT WORKED BEFORE: "
MAX_SOLUTION_HINT_CHARS = 1000
SOLUTION_HINT_PREFIX = "Winning actions, one per turn: "


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """How episodes are played. `context_budget` bounds prompt + all turns, in tokens.

    `system_prompt` "" (the default) opens the conversation with the first user turn alone,
    as the reference does (its actor template is one user message, orchestrator.py:256-266);
    set it (e.g. to `AGENT_SYSTEM_PROMPT`) for a system turn first. `user_template` wraps the
    first observation (with its hint and guidance) in that user turn: the reference's
    (`REFERENCE_USER_TEMPLATE`) by default, "{observation}" for the observation alone.

    Outcome rules (see the module docstring): the reference's, or with `every_play_counts`
    (evaluation's) every play a sample: a cut reply is stepped, a timed-out play scores
    `timeout_penalty` and one whose environment failed to start 0, none dropped.
    """

    max_turns: int = 8
    max_new_tokens: int = 512
    context_budget: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    timeout_penalty: float = DEFAULT_TIMEOUT_PENALTY  # read only with every_play_counts
    system_prompt: str = ""
    user_template: str = REFERENCE_USER_TEMPLATE
    every_play_counts: bool = False
    rows: int = 32  # episodes decoded at once by the rollout engine (rounded up to a power of two)
    refill_fraction: float = 0.125  # a decode chunk ends once this share of the rows finished a reply
    kv_cache: str = "contiguous"  # the engine's KV cache: "contiguous" rows or "paged" (see sampling/paged_cache.py)
    page_size: int = 64  # slots per page of the paged cache
    # Step finished replies in the sandbox while the next chunk decodes (they rejoin a chunk
    # later): worth it for slow environments; the library's steps take under a millisecond.
    overlap_sandbox: bool = False

    def __post_init__(self):
        if "{observation}" not in self.user_template:
            raise ValueError(f"user_template must contain '{{observation}}', got {self.user_template!r}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_new_tokens >= self.context_budget:
            raise ValueError(f"context_budget ({self.context_budget}) must exceed max_new_tokens ({self.max_new_tokens})")
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1 (episodes decoded at once), got {self.rows}")
        if not 0 < self.refill_fraction <= 1:
            raise ValueError(f"refill_fraction must be in (0, 1], got {self.refill_fraction}")
        if self.kv_cache not in ("contiguous", "paged"):
            raise ValueError(f"kv_cache must be 'contiguous' or 'paged', got {self.kv_cache!r}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")


@dataclasses.dataclass(frozen=True)
class EpisodeRequest:
    """One episode: which environment (an index the caller understands), its program and seed.

    A hinted episode gets `hint` appended to its first observation, or with
    `hint_from_solution` the first line of the environment's own `solution()` for this
    seed. It stays a hinted play when no hint text could be had (an empty self-written
    hint), so the matched plain/hinted sets keep their sizes. A `placebo` solution hint is
    replaced by `placebo_hint` of its length.

    `env_kwargs` go to the environment's constructor (the `difficulty` level chosen by
    calibration). `observation`, when set, is shown instead of the environment's own first
    observation (the environment is still reset with `seed`: a synthesized query over its
    tools). `guidance` (procedure memory's preplay) follows the first observation, before any
    hint, in plain and hinted plays alike.
    """

    env_key: int
    program: str
    seed: int
    hinted: bool = False
    hint: str | None = None
    hint_from_solution: bool = False
    placebo: bool = False
    env_kwargs: dict = dataclasses.field(default_factory=dict)
    observation: str | None = None
    guidance: str | None = None


@dataclasses.dataclass
class Trajectory:
    """A finished episode: its tokens for training and its outcome.

    `dropped`: the play timed out (`end_reason` "timeout") under the reference's rule
    (`AgentConfig.every_play_counts` off). A dropped play is no sample: its `reward` (0.0) means
    nothing, and it must be left out of training and of every reward statistic (solve rates,
    regret); the designer's penalty for the timeout is scoring's business.
    """

    request: EpisodeRequest
    tokens: np.ndarray
    loss_mask: np.ndarray
    sampler_logprobs: np.ndarray
    reward: float
    won: bool
    turns: int
    end_reason: str  # terminated | truncated | max_turns | max_new_tokens | context | timeout | error
    error: str | None
    messages: list[dict]
    dropped: bool = False

    @property
    def hinted(self) -> bool:
        return self.request.hinted


PLACEBO_TEXT = "Read the task again, take one step at a time, and answer in the format it asks for. "


def placebo_hint(length: int) -> str:
    """Neutral advice of ``length`` characters (`PLACEBO_TEXT` repeated), the same for every environment."""
    return (PLACEBO_TEXT * (length // len(PLACEBO_TEXT) + 1))[:length]


def solution_hint(solution: str | None) -> str | None:
    """The `solution` hint mode: the whole plan of the environment's own `solution()` for the
    seed, its actions numbered one per turn (tests and the tiny preset only).

    The plan is what the solution knows: an agent that copies action k at turn k wins, so
    hinted plays can beat plain ones by as much as the plan is worth. `solution` is
    environment text: cleaned (`clean_text`) and cut to `MAX_SOLUTION_HINT_CHARS`;
    special-token strings are escaped where it enters the prompt.
    """
    actions = [line.strip() for line in (solution or "").splitlines() if line.strip()]
    if not actions:
        return None
    plan = " ".join(f"{turn}) {action}" for turn, action in enumerate(actions, 1))
    return SOLUTION_HINT_PREFIX + clean_text(plan, MAX_SOLUTION_HINT_CHARS)


@dataclasses.dataclass
class RolloutStats:
    """Where the time of `play_episodes` calls went (seconds), summed over the calls it was passed to."""

    wall_s: float = 0.0
    sandbox_wait_s: float = 0.0  # the host waited on the sandbox with the device idle
    engine: EngineStats = dataclasses.field(default_factory=EngineStats)

    @property
    def device_busy_fraction(self) -> float:
        """Share of the wall time, compilation left out, the host spent waiting on engine programs."""
        run_s = self.wall_s - self.engine.compile_s
        return self.engine.device_s / run_s if run_s > 0 else 0.0


@dataclasses.dataclass
class _Live:
    request: EpisodeRequest
    episode_id: int
    stream: int
    conversation: Conversation | None = None
    turns: int = 0
    final_reward: float = 0.0
    terminated: bool = False
    timed_out: bool = False
    failed_call: str | None = None
    end_reason: str = ""
    error: str | None = None


def play_episodes(
    policy,
    pool,
    requests: Sequence[EpisodeRequest],
    cfg: AgentConfig = AgentConfig(),
    *,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    sample: Callable[..., Generation] | None = None,
    read_action: Callable[[str], str] = parse_action,
    stats: RolloutStats | None = None,
) -> list[Trajectory]:
    """Plays every request to the end; trajectories come back in request order.

    By default episodes run on the `RowEngine` (`_play_on_engine`): up to `cfg.rows` at
    once, each row's KV cache kept across turns, finished replies stepped in the sandbox
    while the other rows decode, and free rows refilled with waiting episodes. With
    `sample` (the signature of `spade_jax.sampling.generate_on_rows`; tests and external agents
    pass their own) episodes play in lock-step turns instead (`_play_lockstep`): one
    `sample` call per turn for every live episode, each conversation sent whole. `read_action` turns a decoded reply into what the pool's ``step``
    receives (benchmark pools that parse replies their own way take them whole).
    `progress(n)` is told of every `n` episodes that ended, however they ended (a failed
    start included), so its counts add up to `len(requests)`. `stats` accumulates timings.
    """
    if not requests:
        return []
    started = time.perf_counter()
    stats = stats if stats is not None else RolloutStats()
    tokenizer = policy.tokenizer
    starts = pool.start(
        [EpisodeSpec(program=r.program, seed=r.seed, max_turns=cfg.max_turns, env_kwargs=dict(r.env_kwargs))
         for r in requests]
    )
    episodes = [_Live(r, s.episode_id, i) for i, (r, s) in enumerate(zip(requests, starts))]
    need_solution = [e for e, s in zip(episodes, starts) if s.ok and e.request.hinted and e.request.hint_from_solution]
    solutions = dict(
        zip((e.episode_id for e in need_solution), pool.solution([e.episode_id for e in need_solution]))
    ) if need_solution else {}

    for episode, start in zip(episodes, starts):
        if not start.ok:
            _end(episode, start, "timeout" if start.timed_out else "error")
            continue
        hint = episode.request.hint if episode.request.hinted else None
        if episode.request.hinted and episode.request.hint_from_solution:
            hint = solution_hint(solutions[episode.episode_id])
            if hint and episode.request.placebo:
                hint = placebo_hint(len(hint))
        observation = episode.request.observation if episode.request.observation is not None else start.observation
        if episode.request.guidance:
            observation += GUIDANCE_SEPARATOR + episode.request.guidance
        observation += HINT_SEPARATOR + hint if hint is not None else ""
        first_turn = cfg.user_template.replace("{observation}", observation)
        episode.conversation = Conversation.start(tokenizer, cfg.system_prompt, first_turn)

    reported = 0

    def report_ended() -> None:
        nonlocal reported
        ended = sum(1 for e in episodes if e.end_reason)
        if progress and ended > reported:
            progress(ended - reported)
        reported = ended

    if sample is None:
        _play_on_engine(policy, pool, episodes, cfg, seed, read_action, report_ended, stats)
    else:
        _play_lockstep(policy, pool, episodes, cfg, seed, read_action, report_ended, sample)

    pool.close([e.episode_id for e in episodes])
    stats.wall_s += time.perf_counter() - started
    out = []
    for e in episodes:
        reward, dropped = _outcome(e, cfg)
        conv = e.conversation
        tokens, mask, logprobs = conv.arrays() if conv else (np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, np.float32))
        out.append(
            Trajectory(
                request=e.request,
                tokens=tokens,
                loss_mask=mask,
                sampler_logprobs=logprobs,
                reward=float(reward),
                won=bool(e.terminated and is_success(e.final_reward)),
                turns=e.turns,
                end_reason=e.end_reason,
                error=e.error,
                messages=conv.messages if conv else [],
                dropped=dropped,
            )
        )
    return out


STEP_ERROR_REWARD = -1.0  # the reference's reward of a step that raised or broke the contract


def _outcome(e: _Live, cfg: AgentConfig) -> tuple[float, bool]:
    """The episode's reward and whether it is dropped (the rules of the module docstring)."""
    if e.timed_out:
        if cfg.every_play_counts:
            return float(cfg.timeout_penalty), False
        return 0.0, not e.request.hinted
    if e.end_reason == "error" and e.failed_call == "step":
        return STEP_ERROR_REWARD, False
    if e.end_reason == "error" and e.conversation is None:  # the environment failed to start
        return 0.0, not (cfg.every_play_counts or e.request.hinted)
    return episode_reward(e.final_reward, e.terminated), False


def _cut(e: _Live, cfg: AgentConfig, finished: bool) -> bool:
    """Ends the episode (reason "max_new_tokens", unstepped) when its reply hit the token limit
    without a stop token, unless every play counts or it is a hinted play; True when it ended."""
    if finished or cfg.every_play_counts or e.request.hinted:
        return False
    e.turns += 1
    e.end_reason = "max_new_tokens"
    return True


def _out_of_context(e: _Live, cfg: AgentConfig) -> bool:
    """Ends the episode (reason "context") when its next turn would not fit the context budget."""
    if len(e.conversation) + cfg.max_new_tokens > cfg.context_budget:
        e.end_reason = "context"
    return bool(e.end_reason)


def _settle(e: _Live, result, cfg: AgentConfig, tokenizer, reply_finished: bool) -> bool:
    """Applies a sandbox step result; True when the episode goes on (its next observation added)."""
    e.turns += 1
    if not result.ok:
        _end(e, result, "timeout" if result.timed_out else "error")
    elif result.terminated:
        e.final_reward, e.terminated = result.reward, True
        e.end_reason = "terminated"
    elif result.truncated:
        e.end_reason = "truncated"
    elif e.turns >= cfg.max_turns:
        e.end_reason = "max_turns"
    else:
        e.conversation.add_observation(tokenizer, result.observation, reply_finished)
        return True
    return False


def _play_lockstep(policy, pool, episodes, cfg, seed, read_action, report_ended, sample) -> None:
    """Every live episode advances together: one `sample` call per turn, then one sandbox step call."""
    tokenizer = policy.tokenizer
    turn = 0
    while True:
        live = [e for e in episodes if not e.end_reason and not _out_of_context(e, cfg)]
        report_ended()
        if not live:
            break
        generation = sample(
            policy,
            [e.conversation.tokens for e in live],
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            seed=int(np.random.SeedSequence([seed, turn]).generate_state(1)[0]),
        )
        stepped, actions = [], []
        for row, e in enumerate(live):
            n = int(generation.lengths[row])
            ids = generation.tokens[row, :n]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            e.conversation.add_response(ids, generation.logprobs[row, :n], text)
            finished = bool(generation.finished[row])
            if not _cut(e, cfg, finished):
                stepped.append((e, finished))
                actions.append(read_action(text))
        results = pool.step([e.episode_id for e, _ in stepped], actions) if stepped else []
        for (e, finished), result in zip(stepped, results):
            _settle(e, result, cfg, tokenizer, finished)
        report_ended()
        turn += 1


def _play_on_engine(policy, pool, episodes, cfg, seed, read_action, report_ended, stats: RolloutStats) -> None:
    """Continuous batching over `RowEngine` rows.

    Each `engine.step` decodes until a share (`cfg.refill_fraction`) of the rows finished
    their reply. Their actions go to the sandbox; with `cfg.overlap_sandbox` the step runs
    in a thread while the engine decodes the next chunk, and its results are applied after
    that chunk (the observation appended, or the episode ended and its row refilled).
    """
    tokenizer = policy.tokenizer
    waiting = collections.deque(e for e in episodes if not e.end_reason)
    if not waiting:
        return
    engine = RowEngine(policy, min(cfg.rows, len(waiting)), max_new_tokens=cfg.max_new_tokens,
                       temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, seed=seed, stats=stats.engine,
                       kv_cache=cfg.kv_cache, page_size=cfg.page_size)
    exit_after = max(1, math.ceil(cfg.refill_fraction * engine.rows))
    by_row: dict[int, _Live] = {}

    def begin_turn(e: _Live, row: int) -> bool:
        """Starts the episode's next reply on `row`; False (the row released) when it does not fit."""
        if _out_of_context(e, cfg):
            engine.release(row)
            return False
        by_row[row] = e
        engine.submit(row, e.conversation.tokens, stream=e.stream, turn=e.turns)
        return True

    def apply(stepped, results) -> None:
        for (row, finished), result in zip(stepped, results):
            e = by_row[row]
            if not _settle(e, result, cfg, tokenizer, finished):
                engine.release(row)
            else:
                begin_turn(e, row)
        report_ended()

    def sandbox_step(stepped, episode_ids, actions):
        return stepped, pool.step(episode_ids, actions)

    executor = concurrent.futures.ThreadPoolExecutor(1) if cfg.overlap_sandbox else None
    in_flight = None
    try:
        while True:
            for row in engine.free_rows():
                while waiting and not begin_turn(waiting.popleft(), row):
                    report_ended()
            if not engine.num_active and in_flight is None and not waiting:
                break
            replies = engine.step(exit_after)
            if in_flight is not None:
                waited = time.perf_counter()
                apply(*in_flight.result())
                stats.sandbox_wait_s += time.perf_counter() - waited
                in_flight = None
            if not replies:
                continue
            stepped, actions = [], []
            for reply in replies:
                text = tokenizer.decode(reply.tokens, skip_special_tokens=True)
                e = by_row[reply.row]
                e.conversation.add_response(reply.tokens, reply.logprobs, text)
                if _cut(e, cfg, reply.stopped):
                    engine.release(reply.row)
                    continue
                actions.append(read_action(text))
                stepped.append((reply.row, reply.stopped))
            report_ended()
            if not stepped:
                continue
            episode_ids = [by_row[row].episode_id for row, _ in stepped]
            if executor is not None:
                in_flight = executor.submit(sandbox_step, stepped, episode_ids, actions)
            else:
                waited = time.perf_counter()
                apply(*sandbox_step(stepped, episode_ids, actions))
                stats.sandbox_wait_s += time.perf_counter() - waited
    finally:
        if executor is not None:
            executor.shutdown(wait=True)
        engine.close()


def _end(episode: _Live, result, reason: str) -> None:
    episode.end_reason = reason
    episode.timed_out = bool(result.timed_out)
    episode.failed_call = result.failed_call
    episode.error = result.error
