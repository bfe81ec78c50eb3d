"""Staged admission of environment programs written by the designer.

Eight named stages, stopping at the first failure, each failure with a reason. Every stage
that plays judges every declared difficulty level (``DIFFICULTY_LEVELS``, read by
``sandbox.policy.difficulty_levels``, each constructed with ``difficulty=<level>``) as it judges the
default: calibration may choose any of them for training.

1. parse        extract the program from the model's text, parse it, apply the import policy
                (trusted side, never executed here);
2. load         run the module in a sandbox worker; exactly one ``*Env`` class; instantiate it;
3. contract     ``num_seeds`` plays of random actions: ``reset`` returns (str, dict); every step
                gets a well-typed 5-tuple with a finite reward in ``reward_range``; the episode
                ends within the turn bound (max_turns); one such play per declared level; a
                malformed declaration fails here;
4. determinism  replaying the contract plays (same seeds, same actions; the first
                ``determinism_seeds`` and every level's) gives the same observations,
                rewards and flags, also when the replay pauses ``pause_s`` before the
                first step or before a random later one;
5. not_trivial  at every level: no no-op first action wins, and at most
                ``max_random_win_rate`` of ``random_plays`` random multi-step plays win;
6. feasibility  at every level, replaying ``solution()`` (one action per line) from a fresh
                reset reaches SUCCESS_REWARD for every contract seed (at the default within
                the turn bound; at a declared level within the program's own, since a level
                too long for the agent's turns is calibration's to skip, its solution failing
                there, not a broken program), and solution() is a play: two replays that have
                seen the same observations so far play the same next action (else it reads
                state no agent can see: an oracle);
7. blind        at every level, is there anything to learn: fixed answers, the same on every
                one of ``blind_seeds`` seeds, must not win most seeds, and the seed must not
                decide the outcome whatever the answer (see ``blind_verdict``);
8. novelty      not a near-duplicate (``similarity.py``) of a program in the archive: by
                shape with its numbers (``novelty="constants"``, the default: a known game
                with several new settings is new, one changed number is not), by shape alone (``"structure"``), or
                not checked (``"off"``; the reference has no such stage).

The blind stage comes after feasibility because its first fixed answer is taken from the
solutions feasibility verified (the move with which another seed's solution won, replayed
on every seed), and because it is the stage that plays the most episodes, so it runs on the
fewest programs. Its rules and their error rates are in ``AdmissionConfig``.

What is random, and why: the designer is rewarded for what happens in training, so any
way for a program to tell admission probes from real play is a hole it will learn. So the
probes look like play. Reset seeds are drawn uniformly from ``EPISODE_SEED_SPACE`` (the
space training draws from), fresh for every admission: ``seed=None`` takes them from OS
entropy, an int makes the whole admission reproducible (the loop derives one per iteration).
Actions come from ``probes.py``: random plays of several lengths mixing plausible actions in
the program's own format, no-ops and garbage, and the blind stage's fixed answers.
Determinism replays the random plays as they were, and with a pause inserted before a step,
so behaviour keyed on the wall clock or on call gaps (an agent in training takes seconds per
turn) shows. The probe seeds and the admission seed are recorded in ``report.details``.

Every candidate has ``time_budget_s`` of sandbox call time (the sum of its episodes' start
and step times); once spent, its episodes are closed and it is rejected at the current
stage. When the sandbox host dies under a batch (the pool answers the calls in flight with
``failed_call == "host"``), the candidates caught in it are re-run one at a time: one that
loses the host again alone is rejected ("crashed the sandbox host"), the others are judged
on their solo runs.

``admit_batch`` runs each stage for all surviving candidates at once, so their episodes run
concurrently over the pool. Type and range checks are the sandbox's (``sandbox/validate.py``).

    report = admit(model_text, AdmissionConfig(num_seeds=3), archive=[src, ...], seed=None)
    report.admitted, report.stage, report.reason, report.timings, report.to_dict()
"""

from __future__ import annotations

import ast
import dataclasses
import random
import time
from collections.abc import Sequence

import numpy as np

from spade_jax.admission.probes import (NOOP_ACTIONS, answer_key, blind_script, fixed_answers, random_actions,
                                        solution_answer)
from spade_jax.admission.similarity import SHINGLE_TOKENS, code_similarity, fingerprint, jaccard
from spade_jax.envs.contract import EPISODE_SEED_SPACE, SUCCESS_REWARD, is_success
from spade_jax.sandbox.policy import PolicyError, check_program, difficulty_levels, extract_code
from spade_jax.sandbox.pool import SandboxPool
from spade_jax.sandbox.records import EpisodeSpec, SandboxConfig, SolutionResult, StepResult

STAGES = ("parse", "load", "contract", "determinism", "not_trivial", "feasibility", "blind", "novelty")
NOVELTY_MODES = ("constants", "structure", "off")
_CHUNK = 256  # episodes admission keeps live at once
_BLIND_ANSWERS = 3  # fixed answers the blind stage plays on every seed, at every level
_EXTRA_ANSWERS = 3  # further answers it tries on a seed that two fixed answers both win
_BLIND_TURNS = 4  # turns of a blind play at most: a coin pays on a first guess, and steps cost time

__all__ = ["AdmissionConfig", "AdmissionReport", "NOVELTY_MODES", "STAGES", "admit", "admit_batch", "blind_verdict",
           "code_similarity"]


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    """Knobs of the admission stages.

    num_seeds: random seeds (from EPISODE_SEED_SPACE, fresh per admission) played by the
      contract stage and replayed by feasibility; determinism replays the first
      ``determinism_seeds`` of them.
    random_plays: random multi-step plays (fresh seeds) of the not_trivial stage at each level;
      more than ``max_random_win_rate`` of them winning at any level rejects the program.
    blind_seeds: fresh seeds on which the blind stage plays its fixed answers at each level (0:
      no blind stage). A fixed answer is one well-formed answer repeated for up to 4 turns (a
      tool-use program's after one call of its first tool): answer #0, the move with which a
      contract seed's solution won, plays every seed; two more (another seed's winning move, an
      example from the first observation, 1, a random plausible answer) play the seeds #0 won.
      Its two rules, with the defaults (16 seeds):
    max_fixed_answer_win_rate: a fixed answer winning more than this share of the seeds
      rejects (0.9: 15 of 16). A fair level where a fixed answer wins half the seeds (the seed
      library's easy levels come close: switch_lights' two wirings, repeat_pattern's two
      letters) is rejected with P(Bin(16, 0.5) >= 15) = 17/65536 = 2.6e-4. A bar low enough
      for a coin cannot work: those fair levels sit above the issue's 0.45 coin flip, so no
      single-answer share tells a coin from a small answer space.
    max_blind_win_rate: more than this share of the seeds won *whatever the answer* rejects
      (0.1: 2 of 16). A seed is won whatever the answer when two different fixed answers win
      it after the same number of moves and so does every further answer tried there
      (``blind_verdict``): on a fair seed with one right answer that never happens, and a tie
      (knapsack: two best packings) is told apart by the further answers, winning moves of
      other seeds' solutions that also won their own seed. A coin flip whose well-formed
      answers all win a seed-decided share p of seeds is missed with P(Bin(16, p) <= 1):
      1.0e-3 at p = 0.45, 0.026 at p = 0.3, 0.14 at p = 0.2; the blend's plateau
      (``rl.rewards.plateau``) pays such a coin 0.2 at p = 0.2 and nothing below p = 0.15,
      against 1 at 0.45.
    pause_s: the determinism stage also replays each play with a pause of this many seconds
      before a random step (0 disables); costs about one pause per batch.
    time_budget_s: sandbox call time (start and step calls, summed over all its episodes)
      each candidate may use over the whole admission.
    max_turns: passed to the constructor; None keeps the class's own default. The
      contract stage requires episodes to end within it (when None: within the env's
      ``self.max_turns``, or 100 steps if the env keeps no such attribute).
    reward_range: allowed raw rewards (the sandbox clips to [-1, 1] anyway).
    novelty: how the novelty stage compares programs, one of NOVELTY_MODES (see stage 8).
    novelty_threshold: similarity at or above which a program duplicates an archive entry
      or, with ``batch_novelty``, a program admitted earlier in the same batch.
    sandbox: the pool config used when admit/admit_batch create their own pool.
    """

    num_seeds: int = 3
    determinism_seeds: int = 2
    random_plays: int = 8
    max_random_win_rate: float = 0.5
    blind_seeds: int = 16
    max_fixed_answer_win_rate: float = 0.9
    max_blind_win_rate: float = 0.1
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
        if self.blind_seeds < 0:
            raise ValueError(f"AdmissionConfig.blind_seeds must be >= 0 (0: no blind stage), got {self.blind_seeds}")
        for name in ("max_fixed_answer_win_rate", "max_blind_win_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"AdmissionConfig.{name} must be in [0, 1], got {getattr(self, name)}")
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


# --- the admission ---------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Candidate:
    index: int  # position in the batch
    text: object
    report: AdmissionReport
    rng: random.Random
    seeds: list[int]  # contract (load: the first; determinism: the first few; feasibility: all)
    play_seeds: list[int]  # not_trivial: random_plays plays, then one per no-op (the same at every level)
    blind_seeds: list[int]  # the blind stage's (the same at every level)
    tool_use: bool = False
    tools: list = dataclasses.field(default_factory=list)
    turn_bound: int = 0
    levels: tuple = ()  # the declared DIFFICULTY_LEVELS
    levels_error: str | None = None  # why the declaration is malformed (a contract failure)
    contract: list = dataclasses.field(default_factory=list)  # (script, trace) per contract seed, then per level
    moves: dict = dataclasses.field(default_factory=dict)  # level -> the winning move of each contract seed's solution
    observations: dict = dataclasses.field(default_factory=dict)  # level -> first observation of a contract seed
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
    solution_after: bool = False  # fetch solution() once the actions are played (the play is unchanged)
    own_turns: bool = False  # the program's own turn bound, not max_turns (feasibility at a declared level)


@dataclasses.dataclass(eq=False)
class _BlindCell:
    """The blind stage at one level of one candidate: its fixed answers, the move with which each
    won each blind seed, each seed's own solution answer, and the further answers' results per seed."""

    c: _Candidate
    level: str | None
    answers: list[str]
    steps_an: np.ndarray  # (answers, blind seeds) int: the move that won (0: lost)
    own: dict = dataclasses.field(default_factory=dict)  # blind seed index -> its solution's answer line
    extras_n: list = dataclasses.field(default_factory=list)  # per blind seed: further answers' winning moves

    def __post_init__(self):
        self.extras_n = [[] for _ in self.c.blind_seeds]

    def script(self, answer: str, s: int, solution_after: bool = False) -> _Script:
        c = self.c
        actions = blind_script(answer, tool_use=c.tool_use, tools=c.tools, turns=min(c.turn_bound, _BLIND_TURNS))
        return _Script(c, c.blind_seeds[s], actions, turn_limit=c.turn_bound, env_kwargs=_level_kwargs(self.level),
                       solution_after=solution_after)

    def further_tries(self) -> list[tuple["_BlindCell", int | None, str, str, int]]:
        """(cell, target, answer key, answer line, source) per further play. Each target, a blind
        seed that two fixed answers won after the same number of moves, gets up to _EXTRA_ANSWERS
        final answers from the solutions of other blind seeds (``source``; never the target's own
        answer nor a fixed answer); each answer used is also played once on its own seed (target
        None)."""
        tool_use = self.c.tool_use
        played = {answer_key(a, tool_use) for a in self.answers}
        pool: dict[str, tuple[str, int]] = {}
        for i, line in sorted(self.own.items()):
            key = None if line is None else answer_key(line, tool_use)
            if key is not None and key not in played:
                pool.setdefault(key, (line, i))
        tries, used = [], {}
        for target in [s for s in range(self.steps_an.shape[1]) if _shared_step(self.steps_an[:, s])]:
            own = self.own.get(int(target))
            own_key = None if own is None else answer_key(own, tool_use)
            picks = [(key, line, i) for key, (line, i) in pool.items() if i != target and key != own_key]
            for key, line, i in picks[:_EXTRA_ANSWERS]:
                tries.append((self, int(target), key, line, i))
                used[key] = (line, i)
        tries += [(self, None, key, line, i) for key, (line, i) in used.items()]
        return tries


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
    """Runs the eight stages on one program (``pool=None``: a temporary pool; ``seed``: see admit_batch)."""
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
            n = self.cfg.num_seeds
            seeds = rng.sample(range(EPISODE_SEED_SPACE), n + plays + self.cfg.blind_seeds)
            report = AdmissionReport(False, "parse", "", isolation=isolation)
            c = _Candidate(index, text, report, rng, seeds[:n], seeds[n:n + plays], seeds[n + plays:])
            report.details.update(admission_seed=self.seed, probe_seeds={
                "contract": c.seeds, "not_trivial": c.play_seeds, "blind": c.blind_seeds})
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
            for level in (None, *c.levels):
                for i in range(plays):
                    # a quarter of the plays use the whole turn bound, the others a random length
                    length = c.turn_bound if i % 4 == 0 else c.rng.randint(1, c.turn_bound)
                    actions = random_actions(c.rng, length, tool_use=c.tool_use, tools=c.tools,
                                             plausible_only=c.rng.random() < 0.5)
                    if c.rng.random() < 0.25:
                        actions[0] = c.rng.choice(NOOP_ACTIONS)
                    scripts.append(_Script(c, c.play_seeds[i], actions, turn_limit=c.turn_bound,
                                           env_kwargs=_level_kwargs(level)))
                for noop, seed in zip(NOOP_ACTIONS, c.play_seeds[plays:]):  # no level may be won by doing nothing
                    noops.append(_Script(c, seed, [noop], turn_limit=c.turn_bound, env_kwargs=_level_kwargs(level)))
        traces = self._play(scripts + noops)
        reasons: dict[int, str] = {}
        wins: dict[tuple[int, str | None], int] = {}
        for script, trace in zip(scripts, traces):
            c = script.owner
            problem = self._judge_play(script, trace, None)
            if problem:
                reasons.setdefault(id(c), problem)
            last = trace.steps[-1] if trace.steps else None
            key = (id(c), script.env_kwargs.get("difficulty"))
            wins[key] = wins.get(key, 0) + _won(last)
        plays, limit = self.cfg.random_plays, self.cfg.max_random_win_rate
        for c in cands:
            c.report.details["random_play_wins"] = wins.get((id(c), None), 0)
            for level in (None, *c.levels):
                won = wins.get((id(c), level), 0)
                if plays and won / plays > limit:
                    reasons.setdefault(id(c), f"{_at_level(level)}random play wins {won} of {plays} plays "
                                              f"(limit {limit:g})")
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
        firsts = [_Script(c, seed, want_solution=True, env_kwargs=_level_kwargs(level), own_turns=level is not None)
                  for c in cands for level in (None, *c.levels) for seed in c.seeds]
        replays, failures = [], {}
        for script, trace in zip(firsts, self._play(firsts)):
            c = script.owner
            reason = _solution_problem(_seed_label(script), trace)
            if reason:
                failures.setdefault(id(c), reason)
                continue
            lines = [line for line in trace.solution.solution.splitlines() if line.strip()]
            replays.append(_Script(c, script.seed, lines, turn_limit=c.turn_bound, env_kwargs=script.env_kwargs,
                                   own_turns=script.own_turns))
        played: dict[tuple[int, str | None], list] = {}
        for script, trace in zip(replays, self._play(replays)):
            c = script.owner
            if id(c) in failures:
                continue
            reason = _replay_problem(script, trace)
            if reason:
                failures[id(c)] = reason
                continue
            level = script.env_kwargs.get("difficulty")
            played.setdefault((id(c), level), []).append((script, trace))
            c.moves.setdefault(level, []).append(script.actions[len(trace.steps) - 1])
            c.observations.setdefault(level, trace.start.observation)
            c.report.details.setdefault("solution_steps", []).append(len(trace.steps))
        for (owner, _), replayed in played.items():
            if owner not in failures:
                reason = _not_a_play(replayed)
                if reason:
                    failures[owner] = reason
        return [failures.get(id(c)) for c in cands]

    def _blind(self, cands):
        """Plays the fixed answers on the blind seeds at every level and judges each level with
        `blind_verdict`. Answer #0, the winning move of a contract seed's solution, plays every
        seed and then fetches the seed's own solution(); the others play the seeds #0 won, the
        only seeds where they can make two winners (so their win counts, for the fixed-answer
        rule, are lower bounds). On each seed two answers won, further answers are tried: the
        final answers of other blind seeds' solutions, each also played on its own seed and
        counted only where it wins there (so a solution() that answers differently after play
        cannot excuse a coin)."""
        if not self.cfg.blind_seeds:
            return [None for _ in cands]
        cells = []
        for c in cands:
            levels = (None, *c.levels)
            for level in levels:
                moves = c.moves[level] + [m for other in levels if other != level for m in c.moves[other]]
                answers = fixed_answers(c.rng, tool_use=c.tool_use, moves=moves, observation=c.observations[level],
                                        count=_BLIND_ANSWERS)
                cells.append(_BlindCell(c, level, answers, np.zeros((len(answers), len(c.blind_seeds)), int)))
        first = [(cell, s) for cell in cells for s in range(len(cell.c.blind_seeds))]
        for (cell, s), trace in zip(first, self._play([cell.script(cell.answers[0], s, solution_after=True)
                                                       for cell, s in first])):
            cell.steps_an[0, s] = _winning_move(trace)
            cell.own[s] = _own_answer(trace)
        rest = [(cell, a, int(s)) for cell in cells for a in range(1, len(cell.answers))
                for s in np.flatnonzero(cell.steps_an[0])]
        for (cell, a, s), trace in zip(rest, self._play([cell.script(cell.answers[a], s) for cell, a, s in rest])):
            cell.steps_an[a, s] = _winning_move(trace)
        tries = [t for cell in cells for t in cell.further_tries()]
        traces = self._play([cell.script(line, source if target is None else target)
                             for cell, target, _, line, source in tries])
        valid = {(id(cell), key) for (cell, target, key, *_), trace in zip(tries, traces)
                 if target is None and _winning_move(trace)}
        for (cell, target, key, *_), trace in zip(tries, traces):
            if target is not None and (id(cell), key) in valid:
                cell.extras_n[target].append(_winning_move(trace))
        reasons: dict[int, str] = {}
        for cell in cells:
            c = cell.c
            reason, stats = blind_verdict(cell.steps_an, cell.extras_n, seeds=c.blind_seeds,
                                          max_fixed_answer_win_rate=self.cfg.max_fixed_answer_win_rate,
                                          max_blind_win_rate=self.cfg.max_blind_win_rate)
            stats["answers"] = [_show(a) for a in cell.answers]
            c.report.details.setdefault("blind", {})["default" if cell.level is None else cell.level] = stats
            if reason:
                shown = ", ".join(f"#{a} {_show(answer)}" for a, answer in enumerate(cell.answers))
                reasons.setdefault(id(c), f"{_at_level(cell.level)}{reason}; fixed answers: {shown}")
        return [reasons.get(id(c)) for c in cands]

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
        """Starts every script's episode, optionally fetches solution() (``want_solution``: before
        the first step; ``solution_after``: once its actions are played), steps the actions
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
                                              max_turns=None if scripts[i].own_turns else self.cfg.max_turns,
                                              turn_limit=None if scripts[i].own_turns else scripts[i].turn_limit,
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
            afters = [i for i in todo if scripts[i].solution_after and i in open_ids and traces[i].start.ok
                      and not scripts[i].owner.fatal and not host_lost]
            for i, result in zip(afters, self.pool.solution_results([open_ids[i] for i in afters])):
                traces[i].solution = result
                host_lost = host_lost or traces[i].host_error() is not None
            if host_lost:
                for i in todo:
                    s = scripts[i]
                    wants = s.want_solution or s.solution_after
                    unfinished = (_running(traces[i]) and not s.owner.fatal
                                  and (pos[i] < len(s.actions) or (wants and traces[i].solution is None)))
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


def blind_verdict(steps_an, extras_n: Sequence[Sequence[int]], *, seeds: Sequence[int],
                  max_fixed_answer_win_rate: float, max_blind_win_rate: float) -> tuple[str | None, dict]:
    """The blind stage's judgement of one level: the reason to reject (None: admit) and its statistics.

    steps_an: after how many moves fixed answer a won seed n (0: it did not win), shape
    (answers, seeds) int; extras_n: per seed, the same for each further answer tried there
    (only answers that won their own seed count). A seed is won whatever the answer when two
    fixed answers won it after the same number of moves and every further answer tried there
    did too (two answers that reach a goal by different routes, as repeated moves of 1 and 2
    reach a sum of 4, are a game, not a coin). Rejects when one fixed answer wins more than
    ``max_fixed_answer_win_rate`` of the seeds, or when more than ``max_blind_win_rate`` of the
    seeds are won whatever the answer (the rates and their error bounds: ``AdmissionConfig``).
    """
    steps_an = np.asarray(steps_an, int)
    n = steps_an.shape[1]
    counts = (steps_an > 0).sum(axis=1)
    free = [s for s in range(n) if _shared_step(steps_an[:, s]) and
            all(step == _shared_step(steps_an[:, s]) for step in extras_n[s])]
    stats = {"wins": [int(k) for k in counts], "seeds": n, "won_whatever_the_answer": [seeds[s] for s in free]}
    if n and counts.size and counts.max() / n > max_fixed_answer_win_rate:
        best = int(counts.argmax())
        return (f"fixed answer #{best} wins {counts[best]} of {n} seeds (limit {max_fixed_answer_win_rate:g})",
                stats)
    if n and len(free) / n > max_blind_win_rate:
        shown = ", ".join(str(seeds[s]) for s in free[:3]) + (", ..." if len(free) > 3 else "")
        return (f"on {len(free)} of {n} seeds different answers all win (seeds {shown}): the seed decides the "
                f"outcome, not the play (limit {max_blind_win_rate:g})", stats)
    return None, stats


def _shared_step(steps_a) -> int:
    """The fewest moves after which two or more of these answers won (0: no two won alike)."""
    shared = [k for k in np.unique(steps_a) if k > 0 and (steps_a == k).sum() >= 2]
    return int(shared[0]) if shared else 0


def _not_a_play(replayed: Sequence[tuple[_Script, _Trace]]) -> str | None:
    """Why the replays of one level's solutions are not plays of one agent, or None: an agent acts
    on what it has seen, so two replays whose observations agree so far must play the same next
    action. One that does not reads state no agent can see (an oracle solution)."""
    seen: dict[tuple[str, ...], tuple[int, str]] = {}
    for script, trace in replayed:
        history = (trace.start.observation,)
        for n, action in enumerate(script.actions[:len(trace.steps)]):
            seed, other = seen.setdefault(history, (script.seed, action))
            if other != action:
                return (f"solution() is not a play: on seeds {seed} and {_seed_label(script)} the observations so far "
                        f"are the same ({n} steps in) but it plays {_show(other)} on one and {_show(action)} on the "
                        "other, so it reads state the agent cannot see")
            history += (trace.steps[n].observation,)
    return None


def _winning_move(trace: _Trace) -> int:
    """After how many moves the play won (0: it did not)."""
    return len(trace.steps) if _won(trace.steps[-1] if trace.steps else None) else 0


def _own_answer(trace: _Trace) -> str | None:
    """The answer line of the solution fetched after a blind play (None: none could be had)."""
    result = trace.solution
    if result is None or result.error or not result.solution:
        return None
    return solution_answer([line for line in result.solution.splitlines() if line.strip()])


def _level_kwargs(level: str | None) -> dict:
    return {} if level is None else {"difficulty": level}


def _at_level(level: str | None) -> str:
    return "" if level is None else f"at difficulty {level!r}: "


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


def _solution_problem(seed: str, trace: _Trace) -> str | None:
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
        return f"replaying solution() for seed {_seed_label(script)}: {error}"
    last = trace.steps[-1] if trace.steps else None
    if _won(last):
        return None
    reward = last.raw_reward if last else 0.0
    return (f"replaying solution() for seed {_seed_label(script)} did not win: reward {reward} after "
            f"{len(trace.steps)} of {len(script.actions)} actions"
            + (" (episode truncated)" if last is not None and last.truncated else ""))


def _show(action: str) -> str:
    return repr(action if len(action) <= 40 else action[:37] + "...")
