"""Staged admission of environment programs written by the designer.

Seven named stages, stopping at the first failure, each failure with a reason:

1. parse        extract the program from the model's text, parse it, apply the import policy
                (trusted side, never executed here);
2. load         run the module in a sandbox worker; exactly one ``*Env`` class; instantiate it;
3. contract     ``num_seeds`` plays of random actions: ``reset`` returns (str, dict); every step
                gets a well-typed 5-tuple with a finite reward in ``reward_range``; the episode
                ends within the turn bound (max_turns). A program that declares
                ``DIFFICULTY_LEVELS`` (``policy.difficulty_levels``) also gets one such play
                per level, constructed with ``difficulty=<level>``; a malformed declaration fails here;
4. determinism  replaying the contract plays (same seeds, same actions; the first
                ``determinism_seeds`` and every level's) gives the same observations,
                rewards and flags, also when the replay pauses ``pause_s`` before the
                first step or before a random later one;
5. not_trivial  no no-op first action wins (at the default and at every declared level),
                and at most ``max_random_win_rate`` of
                ``random_plays`` random multi-step plays win;
6. feasibility  replaying ``solution()`` (one action per line) from a fresh reset reaches
                SUCCESS_REWARD, for every contract seed;
7. novelty      not a near-duplicate (``similarity.py``) of a program in the archive: by
                shape with its numbers (``novelty="constants"``, the default: a known game
                with several new settings is new, one changed number is not), by shape alone (``"structure"``), or
                not checked (``"off"``; the reference has no such stage).

What is random, and why: the designer is rewarded for what happens in training, so any
way for a program to tell admission probes from real play is a hole it will learn. So the
probes look like play. Reset seeds are drawn uniformly from ``EPISODE_SEED_SPACE`` (the
space training draws from), fresh for every admission: ``seed=None`` takes them from OS
entropy, an int makes the whole admission reproducible (the loop derives one per iteration).
Actions come from ``random_actions``: plays of several lengths mixing plausible actions in the
program's own format (``\\boxed{..}`` guesses, sometimes inside model-like text; tool calls
to the tools the env declares, malformed calls and ``<answer>``s for ``ToolUseEnv``s),
no-ops and garbage (random printable text, empty, ~4000 characters, unicode); some plays are
plausible actions only. Determinism replays those random plays as they were, and with a
pause inserted before a step, so behaviour keyed on the wall clock or on call gaps (an agent
in training takes seconds per turn) shows. The probe seeds and the admission seed are
recorded in ``report.details``.

Every candidate has ``time_budget_s`` of sandbox call time (the sum of its episodes' start
and step times); once spent, its episodes are closed and it is rejected at the current
stage. When the sandbox host dies under a batch (the pool answers the calls in flight with
``failed_call == "host"``), the candidates caught in it are re-run one at a time: one that
loses the host again alone is rejected ("crashed the sandbox host"), the others are judged
on their solo runs.

``admit_batch`` runs each stage for all surviving candidates at once, so their episodes run
concurrently over the pool. Type and range checks are the sandbox's (``validate.py``).

    report = admit(model_text, AdmissionConfig(num_seeds=3), archive=[src, ...], seed=None)
    report.admitted, report.stage, report.reason, report.timings, report.to_dict()
"""

from __future__ import annotations

import ast
import dataclasses
import random
import string
import time
from collections.abc import Sequence

from spade_jax.envs.contract import EPISODE_SEED_SPACE, SUCCESS_REWARD, is_success
from spade_jax.envs.tool_use import tool_call_action
from spade_jax.sandbox.policy import PolicyError, check_program, difficulty_levels, extract_code
from spade_jax.sandbox.pool import SandboxPool
from spade_jax.sandbox.records import EpisodeSpec, SandboxConfig, SolutionResult, StepResult
from spade_jax.sandbox.similarity import SHINGLE_TOKENS, code_similarity, fingerprint, jaccard

STAGES = ("parse", "load", "contract", "determinism", "not_trivial", "feasibility", "novelty")
NOVELTY_MODES = ("constants", "structure", "off")
NOOP_ACTIONS = ("", "\\boxed{}", "pass", "<answer></answer>", "<tool_call></tool_call>")
_CHUNK = 256  # episodes admission keeps live at once

__all__ = ["AdmissionConfig", "AdmissionReport", "NOOP_ACTIONS", "NOVELTY_MODES", "STAGES", "admit", "admit_batch",
           "code_similarity", "random_actions"]


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    """Knobs of the admission stages.

    num_seeds: random seeds (from EPISODE_SEED_SPACE, fresh per admission) played by the
      contract stage and replayed by feasibility; determinism replays the first
      ``determinism_seeds`` of them.
    random_plays: random multi-step plays (fresh seeds) of the not_trivial stage; more than
      ``max_random_win_rate`` of them winning rejects the program.
    pause_s: the determinism stage also replays each play with a pause of this many seconds
      before a random step (0 disables); costs about one pause per batch.
    time_budget_s: sandbox call time (start and step calls, summed over all its episodes)
      each candidate may use over the whole admission.
    max_turns: passed to the constructor; None keeps the class's own default. The
      contract stage requires episodes to end within it (when None: within the env's
      ``self.max_turns``, or 100 steps if the env keeps no such attribute).
    reward_range: allowed raw rewards (the sandbox clips to [-1, 1] anyway).
    novelty: how the novelty stage compares programs, one of NOVELTY_MODES (see stage 7).
    novelty_threshold: similarity at or above which a program duplicates an archive entry
      or, with ``batch_novelty``, a program admitted earlier in the same batch.
    sandbox: the pool config used when admit/admit_batch create their own pool.
    """

    num_seeds: int = 3
    determinism_seeds: int = 2
    random_plays: int = 8
    max_random_win_rate: float = 0.5
    pause_s: float = 1.0
    time_budget_s: float = 30.0
    max_turns: int | None = None
    reward_range: tuple[float, float] = (-1.0, 1.0)
    novelty: str = "constants"
    novelty_threshold: float = 0.85
    batch_novelty: bool = True
    shingle_tokens: int = SHINGLE_TOKENS
    max_code_chars: int = 100_000
    sandbox: SandboxConfig = dataclasses.field(
        default_factory=lambda: SandboxConfig(load_timeout_s=10.0, call_timeout_s=5.0))

    def __post_init__(self):
        if self.num_seeds < 1 or not 1 <= self.determinism_seeds <= self.num_seeds:
            raise ValueError("AdmissionConfig needs num_seeds >= 1 and 1 <= determinism_seeds <= num_seeds")
        if self.random_plays < 0:
            raise ValueError(f"AdmissionConfig.random_plays must be >= 0, got {self.random_plays}")
        if not 0.0 <= self.max_random_win_rate <= 1.0:
            raise ValueError(f"AdmissionConfig.max_random_win_rate must be in [0, 1], got {self.max_random_win_rate}")
        if not self.pause_s >= 0.0:
            raise ValueError(f"AdmissionConfig.pause_s must be >= 0, got {self.pause_s}")
        if not self.time_budget_s > 0.0:
            raise ValueError(f"AdmissionConfig.time_budget_s must be > 0, got {self.time_budget_s}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"AdmissionConfig.max_turns must be positive or None, got {self.max_turns}")
        low, high = self.reward_range
        if not low <= SUCCESS_REWARD <= high:
            raise ValueError(f"AdmissionConfig.reward_range {self.reward_range} must contain SUCCESS_REWARD")
        if self.novelty not in NOVELTY_MODES:
            raise ValueError(f"AdmissionConfig.novelty {self.novelty!r} is unknown; choose one of {NOVELTY_MODES}")
        if not 0.0 < self.novelty_threshold <= 1.0:
            raise ValueError(f"AdmissionConfig.novelty_threshold must be in (0, 1], got {self.novelty_threshold}")


@dataclasses.dataclass
class AdmissionReport:
    """The verdict on one program: the stage it stopped at (the last stage when admitted) and why."""

    admitted: bool
    stage: str
    reason: str
    code: str | None = None
    class_name: str | None = None
    timings: dict = dataclasses.field(default_factory=dict)
    isolation: dict = dataclasses.field(default_factory=dict)
    details: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- random probe actions ------------------------------------------------------------------

_WORDS = ("yes", "no", "left", "right", "up", "down", "north", "south", "east", "west", "red", "blue",
          "green", "apple", "stone", "river", "alpha", "beta", "true", "false", "none", "start", "stop",
          "open", "close", "swap", "wait", "skip", "submit", "A", "B", "C", "D", "x", "y", "z", "AB", "BA")
_KEYS = ("item", "name", "city", "person", "a", "b", "x", "n", "query", "id", "index", "from", "to",
         "factor", "value", "level", "amount")
_TEMPLATES = ("I think the answer is {}.", "Let me try {}", "My move: {}", "Answer: {}",
              "After thinking it through, {} is my choice.", "Okay.\n\n{}",
              "Step 1: look at the options.\nStep 2: pick the best one.\nSo: {}")
_UNICODE = ((0xA1, 0xFF), (0x300, 0x36F), (0x391, 0x3C9), (0x410, 0x44F), (0x627, 0x64A),
            (0x2000, 0x206F), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F))
_MALFORMED_CALLS = ("<tool_call>not json</tool_call>", '<tool_call>{"name": </tool_call>',
                    '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
                    '<tool_call>{"name": "%s", "arguments": [1, 2]}</tool_call>', "<tool_call>[]</tool_call>",
                    '<tool_call>{"name": "%s", "arguments": {', "<tool_call>null</tool_call>")


def random_actions(rng: random.Random, n: int, *, tool_use: bool, tools: Sequence[str] = (),
                   plausible_only: bool = False) -> list[str]:
    """``n`` random actions for a program of the given kind (``tools``: the names it declares).

    Mixes plausible actions in the program's own format (``\\boxed{..}`` with a small int, a
    word or a comma list, sometimes inside model-like text; for tool-use programs tool calls
    to its tools with random arguments, malformed calls and ``<answer>``s), no-ops and
    garbage (random printable text, empty, ~4000 characters, unicode, the other kind's
    format). ``plausible_only`` leaves out the garbage and no-ops.
    """
    return [_random_action(rng, tool_use, list(tools), plausible_only) for _ in range(n)]


def _random_action(rng: random.Random, tool_use: bool, tools: list[str], plausible_only: bool) -> str:
    roll = 0.0 if plausible_only else rng.random()
    if roll < 0.6:
        action = _tool_action(rng, tools) if tool_use else "\\boxed{%s}" % _value(rng)
        return rng.choice(_TEMPLATES).format(action) if rng.random() < 0.35 else action
    if roll < 0.72:
        return rng.choice(NOOP_ACTIONS)
    if roll < 0.82:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 80)))
    if roll < 0.87:
        return _long_text(rng)
    if roll < 0.94:
        text = _unicode_text(rng, rng.randint(1, 40))
        return "\\boxed{%s}" % text if rng.random() < 0.5 else text
    return "\\boxed{%s}" % _value(rng) if tool_use else _tool_action(rng, tools)


def _value(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return str(_int(rng))
    if roll < 0.85:
        return rng.choice(_WORDS)
    parts = [str(_int(rng)) if rng.random() < 0.6 else rng.choice(_WORDS) for _ in range(rng.randint(2, 5))]
    return rng.choice((",", ", ", " ")).join(parts)


def _int(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.25:
        return rng.randint(0, 9)
    if roll < 0.6:
        return rng.randint(10, 99)
    if roll < 0.85:
        return rng.randint(100, 9999)
    return -rng.randint(1, 99)


def _tool_action(rng: random.Random, tools: list[str]) -> str:
    roll = rng.random()
    name = rng.choice(tools) if tools else rng.choice(_WORDS)
    if roll < 0.55:
        if rng.random() < 0.1:
            name = rng.choice(_WORDS)  # a tool the env does not declare
        arguments = {rng.choice(_KEYS): _argument(rng) for _ in range(rng.randint(0, 3))}
        return tool_call_action(name, arguments)
    if roll < 0.7:
        malformed = rng.choice(_MALFORMED_CALLS)
        return malformed % name if "%s" in malformed else malformed
    return "<answer>%s</answer>" % _value(rng)


def _argument(rng: random.Random):
    roll = rng.random()
    if roll < 0.4:
        return _int(rng)
    if roll < 0.75:
        return rng.choice(_WORDS)
    if roll < 0.85:
        return round(rng.uniform(-100, 100), 2)
    if roll < 0.9:
        return rng.random() < 0.5
    return [_int(rng) for _ in range(rng.randint(0, 3))]


def _long_text(rng: random.Random) -> str:
    size = rng.randint(3500, 4500)
    kind = rng.randrange(3)
    if kind == 0:  # at most 4000 digits: Python's int() refuses more than 4300
        return "\\boxed{" + "".join(rng.choice(string.digits) for _ in range(size - 500)) + "}"
    if kind == 1:
        return "".join(rng.choice(string.ascii_letters + " ") for _ in range(size))
    return "".join(rng.choice(string.printable) for _ in range(size))


def _unicode_text(rng: random.Random, size: int) -> str:
    chars = []
    for _ in range(size):
        low, high = rng.choice(_UNICODE)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars)


# --- the admission ---------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Candidate:
    index: int  # position in the batch
    text: object
    report: AdmissionReport
    rng: random.Random
    seeds: list[int]  # contract (load: the first; determinism: the first few; feasibility: all)
    play_seeds: list[int]  # not_trivial: random_plays plays, then one per no-op
    tool_use: bool = False
    tools: list = dataclasses.field(default_factory=list)
    turn_bound: int = 0
    levels: tuple = ()  # the declared DIFFICULTY_LEVELS
    levels_error: str | None = None  # why the declaration is malformed (a contract failure)
    contract: list = dataclasses.field(default_factory=list)  # (script, trace) per contract seed, then per level
    spent_s: float = 0.0  # sandbox call time used so far
    fatal: str | None = None  # a rejection found while playing (time budget, host crash)

    @property
    def code(self) -> str:
        return self.report.code


@dataclasses.dataclass(eq=False)
class _Script:
    owner: _Candidate
    seed: int
    actions: Sequence[str] = ()
    want_solution: bool = False
    turn_limit: int | None = None
    pause_before: int | None = None  # 1-based step preceded by a pause of pause_s
    env_kwargs: dict = dataclasses.field(default_factory=dict)  # to the constructor (a difficulty level)


@dataclasses.dataclass
class _Trace:
    start: StepResult
    steps: list[StepResult] = dataclasses.field(default_factory=list)
    solution: SolutionResult | None = None

    def first_error(self) -> str | None:
        if self.start.error:
            return self.start.error
        for step in self.steps:
            if step.error:
                return step.error
        return None

    def host_error(self) -> str | None:
        """The error of a call that the sandbox host's death answered, if any."""
        for result in (self.start, *self.steps, *([self.solution] if self.solution else [])):
            if result.error and result.failed_call == "host":
                return result.error
        return None


def admit(text: str, config: AdmissionConfig | None = None, archive: Sequence[str] = (),
          pool: SandboxPool | None = None, seed: int | None = None) -> AdmissionReport:
    """Runs the seven stages on one program (``pool=None``: a temporary pool; ``seed``: see admit_batch)."""
    return admit_batch([text], config, archive, pool, seed=seed)[0]


def admit_batch(texts: Sequence[str], config: AdmissionConfig | None = None, archive: Sequence[str] = (),
                pool: SandboxPool | None = None, seed: int | None = None) -> list[AdmissionReport]:
    """Runs the stages on many programs, concurrently over the pool; reports in input order.

    ``seed`` draws every probe (seeds and actions): None takes it from OS entropy, an int
    makes the admission reproducible. It is recorded in each report's details.
    """
    config = config or AdmissionConfig()
    if seed is None:
        seed = random.SystemRandom().getrandbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"admit_batch seed must be an int or None, got {seed!r}")
    own_pool = pool is None
    if own_pool:
        pool = SandboxPool(config.sandbox)
    try:
        return _Admission(pool, config, archive, seed).run(list(texts))
    finally:
        if own_pool:
            pool.close_all()


class _Admission:
    def __init__(self, pool: SandboxPool, config: AdmissionConfig, archive: Sequence[str], seed: int):
        self.pool = pool
        self.cfg = config
        self.archive = [self._fingerprint(src) for src in archive] if config.novelty != "off" else []
        self.seed = seed

    def run(self, texts: list[str]) -> list[AdmissionReport]:
        isolation = self.pool.isolation.to_dict()
        master = random.Random(self.seed)
        plays = self.cfg.random_plays + len(NOOP_ACTIONS)
        candidates = []
        for index, text in enumerate(texts):
            rng = random.Random(master.getrandbits(64))
            seeds = rng.sample(range(EPISODE_SEED_SPACE), self.cfg.num_seeds + plays)
            report = AdmissionReport(False, "parse", "", isolation=isolation)
            c = _Candidate(index, text, report, rng, seeds[:self.cfg.num_seeds], seeds[self.cfg.num_seeds:])
            report.details.update(admission_seed=self.seed,
                                  probe_seeds={"contract": c.seeds, "not_trivial": c.play_seeds})
            candidates.append(c)
        alive = candidates
        for stage in STAGES:
            started = time.perf_counter()
            for c in alive:
                c.report.stage = stage
            failures = [c.fatal or reason for c, reason in zip(alive, getattr(self, f"_{stage}")(alive))]
            elapsed = time.perf_counter() - started
            for c in alive:
                c.report.timings[stage] = elapsed
            for c, reason in zip(alive, failures):
                if reason:
                    c.report.reason = reason
            alive = [c for c, reason in zip(alive, failures) if not reason]
        for c in alive:
            c.report.admitted, c.report.reason = True, "passed all stages"
        for c in candidates:
            c.report.details["sandbox_time_s"] = round(c.spent_s, 3)
        return [c.report for c in candidates]

    # --- stages (each returns one failure reason or None per candidate) ----------------------

    def _parse(self, cands):
        failures = []
        for c in cands:
            text = c.text
            if not isinstance(text, str):
                failures.append(f"expected program text (str), got {type(text).__name__}")
                continue
            code = extract_code(text)
            c.report.code = code
            try:
                tree = check_program(code, self.cfg.max_code_chars)
            except PolicyError as err:
                failures.append(str(err))
                continue
            c.tool_use = _subclasses_tool_use(tree)
            try:
                c.levels = difficulty_levels(tree)
            except PolicyError as err:
                c.levels_error = str(err)
            failures.append(None)
        return failures

    def _load(self, cands):
        traces = self._play([_Script(c, c.seeds[0]) for c in cands])
        failures = []
        for c, trace in zip(cands, traces):
            start = trace.start
            if start.failed_call in ("load", "limit"):
                failures.append(start.error)
                continue
            c.report.class_name = start.env_class
            c.tools = [t for t in start.tools if isinstance(t, str)]
            c.turn_bound = self.cfg.max_turns or start.turn_limit or 100
            c.report.details["max_turns"] = c.turn_bound
            failures.append(None)
        return failures

    def _contract(self, cands):
        scripts = []
        for c in cands:
            for j, seed in enumerate(c.seeds):
                # the first play is plausible actions only: a program that behaves only when it
                # sees garbage must not pass determinism on the garbage plays alone
                actions = random_actions(c.rng, c.turn_bound, tool_use=c.tool_use, tools=c.tools,
                                         plausible_only=j == 0)
                scripts.append(_Script(c, seed, actions, turn_limit=c.turn_bound + 1))
            if c.levels:
                c.report.details["difficulty_levels"] = list(c.levels)
            for j, level in enumerate(c.levels):  # after the seeds' plays: determinism replays the first few
                actions = random_actions(c.rng, c.turn_bound, tool_use=c.tool_use, tools=c.tools)
                scripts.append(_Script(c, c.seeds[j % len(c.seeds)], actions, turn_limit=c.turn_bound + 1,
                                       env_kwargs={"difficulty": level}))
        traces = self._play(scripts)
        for c in cands:
            c.contract = []
        for script, trace in zip(scripts, traces):
            script.owner.contract.append((script, trace))
        judged = [next(filter(None, (self._judge_play(s, t, c.turn_bound) for s, t in c.contract)), None)
                  for c in cands]
        return [c.levels_error or reason for c, reason in zip(cands, judged)]

    def _judge_play(self, script: _Script, trace: _Trace, must_end_within: int | None) -> str | None:
        """Errors and out-of-range rewards; with ``must_end_within``, also an episode that does not end."""
        seed, start = _seed_label(script), trace.start
        if start.error:
            return f"reset({seed}) failed: {start.error}"
        if not start.observation.strip():
            return f"reset({seed}) returned an empty observation"
        low, high = self.cfg.reward_range
        for n, step in enumerate(trace.steps, 1):
            action = script.actions[n - 1]
            if step.error:
                return f"seed {seed}, step {n} with action {_show(action)}: {step.error}"
            if not low <= step.raw_reward <= high:
                return (f"seed {seed}, step {n}: reward {step.raw_reward} is outside the allowed range "
                        f"[{low}, {high}]")
            if step.done and must_end_within is not None and n <= must_end_within:
                return None
        if must_end_within is None:
            return None
        return (f"seed {seed}: the episode did not end within max_turns={must_end_within} "
                f"(neither terminated nor truncated after {must_end_within} steps)")

    def _determinism(self, cands):
        plain, paused = [], []
        for c in cands:
            # the first contract plays, and every level's play: a level must be as deterministic
            # as the default, since calibration may choose it for training
            replayed = c.contract[:self.cfg.determinism_seeds] + [p for p in c.contract if p[0].env_kwargs]
            for script, trace in replayed:
                plain.append((dataclasses.replace(script), trace))
                if self.cfg.pause_s > 0 and trace.steps:
                    # one pause between reset and the first step, one before a random later step
                    later = [c.rng.randint(2, len(trace.steps))] if len(trace.steps) > 1 else []
                    paused += [(dataclasses.replace(script, pause_before=k), trace) for k in (1, *later)]
        pairs = plain + paused  # paused replays last: when chunked, fewer chunks wait for a pause
        failures: dict[int, str] = {}
        for (script, first), second in zip(pairs, self._play([s for s, _ in pairs])):
            c = script.owner
            reason = None if id(c) in failures else _compare(_seed_label(script), first, second)
            if reason:
                if script.pause_before is not None:
                    reason += f" (the replay paused {self.cfg.pause_s:g} s before step {script.pause_before})"
                failures[id(c)] = reason
        return [failures.get(id(c)) for c in cands]

    def _not_trivial(self, cands):
        scripts, noops = [], []
        for c in cands:
            plays = self.cfg.random_plays
            for i in range(plays):
                # a quarter of the plays use the whole turn bound, the others a random length
                length = c.turn_bound if i % 4 == 0 else c.rng.randint(1, c.turn_bound)
                actions = random_actions(c.rng, length, tool_use=c.tool_use, tools=c.tools,
                                         plausible_only=c.rng.random() < 0.5)
                if c.rng.random() < 0.25:
                    actions[0] = c.rng.choice(NOOP_ACTIONS)
                scripts.append(_Script(c, c.play_seeds[i], actions, turn_limit=c.turn_bound))
            for level in (None, *c.levels):  # no level may be won by doing nothing
                kwargs = {} if level is None else {"difficulty": level}
                for noop, seed in zip(NOOP_ACTIONS, c.play_seeds[plays:]):
                    noops.append(_Script(c, seed, [noop], turn_limit=c.turn_bound, env_kwargs=kwargs))
        traces = self._play(scripts + noops)
        reasons: dict[int, str] = {}
        wins: dict[int, int] = {}
        for script, trace in zip(scripts, traces):
            c = script.owner
            problem = self._judge_play(script, trace, None)
            if problem:
                reasons.setdefault(id(c), problem)
            last = trace.steps[-1] if trace.steps else None
            wins[id(c)] = wins.get(id(c), 0) + _won(last)
        plays, limit = self.cfg.random_plays, self.cfg.max_random_win_rate
        for c in cands:
            won = wins.get(id(c), 0)
            c.report.details["random_play_wins"] = won
            if plays and won / plays > limit:
                reasons.setdefault(id(c), f"random play wins {won} of {plays} plays (limit {limit:g})")
        for script, trace in zip(noops, traces[len(scripts):]):
            c = script.owner
            error = trace.first_error()
            if error:
                reasons.setdefault(id(c), f"seed {script.seed}, no-op action {_show(script.actions[0])}: {error}")
            elif trace.steps and is_success(trace.steps[0].raw_reward):
                level = f" at difficulty {script.env_kwargs['difficulty']!r}" if script.env_kwargs else ""
                reasons.setdefault(id(c), f"the no-op action {_show(script.actions[0])} already wins "
                                          f"(reward {trace.steps[0].raw_reward}) on seed {script.seed}{level}")
        return [reasons.get(id(c)) for c in cands]

    def _feasibility(self, cands):
        firsts = [_Script(c, seed, want_solution=True) for c in cands for seed in c.seeds]
        replays, failures = [], {}
        for script, trace in zip(firsts, self._play(firsts)):
            c = script.owner
            reason = _solution_problem(script.seed, trace)
            if reason:
                failures.setdefault(id(c), reason)
                continue
            lines = [line for line in trace.solution.solution.splitlines() if line.strip()]
            replays.append(_Script(c, script.seed, lines, turn_limit=c.turn_bound))
        for script, trace in zip(replays, self._play(replays)):
            c = script.owner
            if id(c) in failures:
                continue
            reason = _replay_problem(script, trace)
            if reason:
                failures[id(c)] = reason
            else:
                c.report.details.setdefault("solution_steps", []).append(len(trace.steps))
        return [failures.get(id(c)) for c in cands]

    def _fingerprint(self, code: str) -> frozenset:
        return fingerprint(code, self.cfg.shingle_tokens, keep_constants=self.cfg.novelty == "constants")

    def _novelty(self, cands):
        """Similarity to the archive, then (``batch_novelty``) to the programs of this batch that
        passed before it: the batch's candidates reach this last stage in input order."""
        if self.cfg.novelty == "off":
            return [None for _ in cands]
        failures = []
        admitted: list[tuple[int, frozenset]] = []
        for c in cands:
            mine = self._fingerprint(c.code)
            scores = [jaccard(mine, other) for other in self.archive]
            best = max(range(len(scores)), key=scores.__getitem__, default=None)
            if best is not None:
                c.report.details["max_similarity"] = round(scores[best], 4)
                c.report.details["most_similar_index"] = best
            twin = next((i for i, other in admitted if jaccard(mine, other) >= self.cfg.novelty_threshold), None)
            if best is not None and scores[best] >= self.cfg.novelty_threshold:
                failures.append(f"near-duplicate of archive program #{best} (similarity {scores[best]:.2f} "
                                f">= threshold {self.cfg.novelty_threshold})")
            elif self.cfg.batch_novelty and twin is not None:
                failures.append(f"near-duplicate of program {twin} of the same batch")
            else:
                admitted.append((c.index, mine))
                failures.append(None)
        return failures

    # --- running scripted episodes -----------------------------------------------------------

    def _play(self, scripts: list[_Script]) -> list[_Trace]:
        """Plays scripts in chunks, so admission never holds more than _CHUNK live episodes
        (nor more than the pool allows). When the sandbox host is lost under a chunk, the
        candidates caught in it are re-run alone; one that loses the host again is rejected."""
        chunk = min(_CHUNK, self.pool.config.max_live_episodes)
        traces = []
        for first in range(0, len(scripts), chunk):
            part = scripts[first:first + chunk]
            owners = list({id(s.owner): s.owner for s in part}.values())
            before = {id(c): (c.spent_s, c.fatal) for c in owners}
            part_traces, lost = self._play_chunk(part)
            for c in owners:
                mine = [i for i, s in enumerate(part) if s.owner is c]
                if not any(lost[i] for i in mine):
                    continue
                c.spent_s, c.fatal = before[id(c)]  # a bystander is not charged for the lost run
                solo, solo_lost = self._play_chunk([part[i] for i in mine])
                for i, trace in zip(mine, solo):
                    part_traces[i] = trace
                if any(solo_lost) and not c.fatal:
                    error = next(filter(None, (t.host_error() for t in solo)), "the sandbox host was lost")
                    c.fatal = f"crashed the sandbox host: {error}"
            traces += part_traces
        return traces

    def _play_chunk(self, scripts: list[_Script]) -> tuple[list[_Trace], list[bool]]:
        """Starts every script's episode, optionally fetches solution(), steps the actions
        until each ends, closes all. All ready episodes step in one batch per round; a script
        with ``pause_before`` sits out rounds until pause_s has passed since its last call (the
        others go on, so a batch pays about one pause). Charges each call's time to the
        script's owner and closes the episodes of an owner over its budget. Returns the traces
        and, per script, whether the sandbox host was lost before it finished."""
        n = len(scripts)
        traces = [_Trace(StepResult(-1, error=s.owner.fatal, truncated=True, failed_call="limit"))
                  for s in scripts]
        lost = [False] * n
        todo = [i for i, s in enumerate(scripts) if not s.owner.fatal]
        if not todo:
            return traces, lost
        starts = self.pool.start([EpisodeSpec(scripts[i].owner.code, seed=scripts[i].seed,
                                              max_turns=self.cfg.max_turns, turn_limit=scripts[i].turn_limit,
                                              env_kwargs=scripts[i].env_kwargs)
                                  for i in todo])
        open_ids = {i: r.episode_id for i, r in zip(todo, starts)}
        for i, result in zip(todo, starts):
            traces[i] = _Trace(result)
        pos = dict.fromkeys(todo, 0)
        ready_at = dict.fromkeys(todo, 0.0)
        paused: set[int] = set()
        try:
            host_lost = self._charge([(scripts[i], r) for i, r in zip(todo, starts)], scripts, open_ids)
            wants = [i for i in todo if scripts[i].want_solution and traces[i].start.ok
                     and not scripts[i].owner.fatal and not host_lost]
            for i, result in zip(wants, self.pool.solution_results([open_ids[i] for i in wants])):
                traces[i].solution = result
                host_lost = host_lost or traces[i].host_error() is not None
            while not host_lost:
                now = time.monotonic()
                ready, waiting = [], []
                for i in todo:
                    s = scripts[i]
                    if s.owner.fatal or pos[i] >= len(s.actions) or not _running(traces[i]):
                        continue
                    if s.pause_before == pos[i] + 1 and i not in paused:
                        paused.add(i)
                        ready_at[i] = now + self.cfg.pause_s
                    (ready if ready_at[i] <= now else waiting).append(i)
                if not ready:
                    if not waiting:
                        break
                    time.sleep(max(0.0, min(ready_at[i] for i in waiting) - time.monotonic()))
                    continue
                results = self.pool.step([open_ids[i] for i in ready], [scripts[i].actions[pos[i]] for i in ready])
                for i, result in zip(ready, results):
                    traces[i].steps.append(result)
                    pos[i] += 1
                host_lost = self._charge([(scripts[i], r) for i, r in zip(ready, results)], scripts, open_ids)
            if host_lost:
                for i in todo:
                    s = scripts[i]
                    unfinished = (_running(traces[i]) and not s.owner.fatal
                                  and (pos[i] < len(s.actions) or (s.want_solution and traces[i].solution is None)))
                    lost[i] = unfinished or traces[i].host_error() is not None
        finally:
            self.pool.close(list(open_ids.values()))
        return traces, lost

    def _charge(self, played: list[tuple[_Script, StepResult]], scripts: list[_Script], open_ids: dict) -> bool:
        """Adds call times to their owners; closes the episodes of owners now over budget.
        Returns whether any result says the sandbox host was lost."""
        budget = self.cfg.time_budget_s
        over = []
        for script, result in played:
            c = script.owner
            c.spent_s += max(0.0, float(result.elapsed_s or 0.0))
            if c.spent_s > budget and not c.fatal:
                c.fatal = (f"used up its admission time budget: {c.spent_s:.1f} s of sandbox calls > "
                           f"time_budget_s={budget:g} s")
                over.append(c)
        if over:
            ids = [open_ids.pop(i) for i, s in enumerate(scripts) if s.owner in over and i in open_ids]
            self.pool.close(ids)
        return any(result.error and result.failed_call == "host" for _, result in played)


def _running(trace: _Trace) -> bool:
    last = trace.steps[-1] if trace.steps else trace.start
    return last.ok and not last.done and (trace.solution is None or trace.solution.error is None)


def _subclasses_tool_use(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Env"):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name == "ToolUseEnv":
                    return True
    return False


def _seed_label(script: _Script) -> str:
    """The script's seed as reasons name it, with its difficulty level when it has one."""
    level = script.env_kwargs.get("difficulty")
    return f"{script.seed}" if level is None else f"{script.seed} (difficulty={level!r})"


def _compare(seed: int | str, first: _Trace, second: _Trace) -> str | None:
    if first.start.observation != second.start.observation:
        return f"seed {seed}: reset() observations differ between two runs with the same seed"
    if len(first.steps) != len(second.steps):
        return f"seed {seed}: the episode lasted {len(first.steps)} steps once and {len(second.steps)} steps again"
    for n, (a, b) in enumerate(zip(first.steps, second.steps), 1):
        for field in ("observation", "raw_reward", "terminated", "truncated", "error"):
            if getattr(a, field) != getattr(b, field):
                return (f"seed {seed}, step {n}: {field} differs between two runs with the same seed and "
                        "actions")
    return None


def _solution_problem(seed: int, trace: _Trace) -> str | None:
    if trace.start.error:
        return f"reset({seed}) failed: {trace.start.error}"
    result = trace.solution
    if result is None or result.error:
        detail = result.error if result else "not called"
        if detail == "the environment defines no solution()":
            return "the environment has no solution() method"
        return f"solution() for seed {seed} failed: {detail}"
    if not result.solution.strip():
        return f"solution() for seed {seed} returned no actions"
    return None


def _won(last) -> bool:
    """Whether an episode's last step (None: no step) ended it with a win."""
    return last is not None and last.terminated and is_success(last.raw_reward)


def _replay_problem(script: _Script, trace: _Trace) -> str | None:
    error = trace.first_error()
    if error:
        return f"replaying solution() for seed {script.seed}: {error}"
    last = trace.steps[-1] if trace.steps else None
    if _won(last):
        return None
    reward = last.raw_reward if last else 0.0
    return (f"replaying solution() for seed {script.seed} did not win: reward {reward} after "
            f"{len(trace.steps)} of {len(script.actions)} actions"
            + (" (episode truncated)" if last is not None and last.truncated else ""))


def _show(action: str) -> str:
    return repr(action if len(action) <= 40 else action[:37] + "...")
