"""Staged admission of environment programs written by the designer.

Seven named stages, stopping at the first failure, each failure with a reason:

1. parse        extract the program from the model's text, parse it, apply the import policy
                (trusted side, never executed here);
2. load         run the module in a sandbox worker; exactly one ``*Env`` class; instantiate it;
3. contract     for several seeds, ``reset`` returns (str, dict); probe actions (well-formed,
                malformed, empty, oversized) get a well-typed 5-tuple with a finite reward in
                ``reward_range``; the episode ends within max_turns;
4. determinism  the same seed and actions give the same observations, rewards and flags;
5. not_trivial  a no-op or malformed first action does not already win;
6. feasibility  replaying ``solution()`` (one action per line) from a fresh reset reaches
                SUCCESS_REWARD, for every seed;
7. novelty      not a near-duplicate (``similarity.py``) of a program in the archive.

``admit_batch`` runs each stage for all surviving candidates at once, so their episodes run
concurrently over the pool. Type and range checks are the sandbox's (``validate.py``).

    report = admit(model_text, AdmissionConfig(num_seeds=3), archive=[src, ...])
    report.admitted, report.stage, report.reason, report.timings, report.to_dict()
"""

from __future__ import annotations

import ast
import dataclasses
import time
from collections.abc import Sequence

from spade_jax.envs.contract import SUCCESS_REWARD
from spade_jax.sandbox.policy import PolicyError, check_program, extract_code
from spade_jax.sandbox.pool import SandboxPool
from spade_jax.sandbox.records import EpisodeSpec, SandboxConfig, SolutionResult, StepResult
from spade_jax.sandbox.similarity import SHINGLE_TOKENS, code_similarity, fingerprint, jaccard

STAGES = ("parse", "load", "contract", "determinism", "not_trivial", "feasibility", "novelty")
GAME_PROBES = ("\\boxed{1}", "I am not sure what to do.", "", "\\boxed{" + "9" * 4000 + "}")
TOOL_PROBES = ('<tool_call>{"name": "lookup", "arguments": {}}</tool_call>', "<tool_call>not json</tool_call>",
               "", "<answer>0</answer>")
NOOP_ACTIONS = ("", "\\boxed{}", "pass")
TOOL_NOOP_ACTIONS = ("", "<answer></answer>", "<tool_call></tool_call>")
_WIN = SUCCESS_REWARD - 1e-6
_CHUNK = 256  # episodes admission keeps live at once

__all__ = ["AdmissionConfig", "AdmissionReport", "STAGES", "admit", "admit_batch", "code_similarity"]


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    """Knobs of the admission stages.

    num_seeds: seeds 0..num_seeds-1 used by contract, not_trivial and feasibility;
      determinism replays the first ``determinism_seeds`` of them.
    max_turns: passed to the constructor; None keeps the class's own default. The
      contract stage requires episodes to end within it (when None: within the env's
      ``self.max_turns``, or 100 steps if the env keeps no such attribute).
    reward_range: allowed raw rewards (the sandbox clips to [-1, 1] anyway).
    novelty_threshold: similarity at or above which a program duplicates an archive entry.
    sandbox: the pool config used when admit/admit_batch create their own pool.
    """

    num_seeds: int = 3
    determinism_seeds: int = 2
    max_turns: int | None = None
    reward_range: tuple[float, float] = (-1.0, 1.0)
    novelty_threshold: float = 0.85
    shingle_tokens: int = SHINGLE_TOKENS
    max_code_chars: int = 100_000
    sandbox: SandboxConfig = dataclasses.field(
        default_factory=lambda: SandboxConfig(load_timeout_s=10.0, call_timeout_s=5.0))

    def __post_init__(self):
        if self.num_seeds < 1 or not 1 <= self.determinism_seeds <= self.num_seeds:
            raise ValueError("AdmissionConfig needs num_seeds >= 1 and 1 <= determinism_seeds <= num_seeds")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"AdmissionConfig.max_turns must be positive or None, got {self.max_turns}")
        low, high = self.reward_range
        if not low <= SUCCESS_REWARD <= high:
            raise ValueError(f"AdmissionConfig.reward_range {self.reward_range} must contain SUCCESS_REWARD")
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


@dataclasses.dataclass
class _Script:
    code: str
    seed: int
    actions: Sequence[str] = ()
    want_solution: bool = False
    turn_limit: int | None = None


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


@dataclasses.dataclass(eq=False)
class _Candidate:
    text: object
    report: AdmissionReport
    tool_use: bool = False
    turn_bound: int = 0
    contract: list = dataclasses.field(default_factory=list)
    probes: tuple = ()


def admit(text: str, config: AdmissionConfig | None = None, archive: Sequence[str] = (),
          pool: SandboxPool | None = None) -> AdmissionReport:
    """Runs the seven stages on one program (``pool=None``: a temporary pool)."""
    return admit_batch([text], config, archive, pool)[0]


def admit_batch(texts: Sequence[str], config: AdmissionConfig | None = None, archive: Sequence[str] = (),
                pool: SandboxPool | None = None) -> list[AdmissionReport]:
    """Runs the stages on many programs, concurrently over the pool; reports in input order."""
    config = config or AdmissionConfig()
    own_pool = pool is None
    if own_pool:
        pool = SandboxPool(config.sandbox)
    try:
        return _Admission(pool, config, archive).run(list(texts))
    finally:
        if own_pool:
            pool.close_all()


class _Admission:
    def __init__(self, pool: SandboxPool, config: AdmissionConfig, archive: Sequence[str]):
        self.pool = pool
        self.cfg = config
        self.archive = [fingerprint(src, config.shingle_tokens) for src in archive]
        self.seeds = list(range(config.num_seeds))

    def run(self, texts: list[str]) -> list[AdmissionReport]:
        isolation = self.pool.isolation.to_dict()
        candidates = [_Candidate(text, AdmissionReport(False, "parse", "", isolation=isolation)) for text in texts]
        alive = candidates
        for stage in STAGES:
            started = time.perf_counter()
            for c in alive:
                c.report.stage = stage
            failures = getattr(self, f"_{stage}")(alive)
            elapsed = time.perf_counter() - started
            for c in alive:
                c.report.timings[stage] = elapsed
            for c, reason in zip(alive, failures):
                if reason:
                    c.report.reason = reason
            alive = [c for c, reason in zip(alive, failures) if not reason]
        for c in alive:
            c.report.admitted, c.report.reason = True, "passed all stages"
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
            c.probes = TOOL_PROBES if c.tool_use else GAME_PROBES
            failures.append(None)
        return failures

    def _load(self, cands):
        traces = self._play([_Script(c.report.code, self.seeds[0]) for c in cands])
        failures = []
        for c, trace in zip(cands, traces):
            start = trace.start
            if start.failed_call in ("load", "limit"):
                failures.append(start.error)
                continue
            c.report.class_name = start.env_class
            c.turn_bound = self.cfg.max_turns or start.turn_limit or 100
            c.report.details["max_turns"] = c.turn_bound
            failures.append(None)
        return failures

    def _contract(self, cands):
        scripts = [self._probe_script(c, seed) for c in cands for seed in self.seeds]
        traces = self._play(scripts)
        failures = []
        for i, c in enumerate(cands):
            c.contract = traces[i * len(self.seeds):(i + 1) * len(self.seeds)]
            failures.append(next(filter(None, (self._judge_contract(c, seed, t)
                                               for seed, t in zip(self.seeds, c.contract))), None))
        return failures

    def _judge_contract(self, c: _Candidate, seed: int, trace: _Trace) -> str | None:
        start = trace.start
        if start.error:
            return f"reset({seed}) failed: {start.error}"
        if not start.observation.strip():
            return f"reset({seed}) returned an empty observation"
        low, high = self.cfg.reward_range
        for n, step in enumerate(trace.steps, 1):
            action = c.probes[n - 1] if n <= len(c.probes) else ""
            if step.error:
                return f"seed {seed}, step {n} with action {_show(action)}: {step.error}"
            if not low <= step.raw_reward <= high:
                return (f"seed {seed}, step {n}: reward {step.raw_reward} is outside the allowed range "
                        f"[{low}, {high}]")
            if step.done and n <= c.turn_bound:
                return None
        return (f"seed {seed}: the episode did not end within max_turns={c.turn_bound} "
                f"(neither terminated nor truncated after {c.turn_bound} steps)")

    def _determinism(self, cands):
        seeds = self.seeds[:self.cfg.determinism_seeds]
        traces = self._play([self._probe_script(c, seed) for c in cands for seed in seeds])
        failures = []
        for i, c in enumerate(cands):
            reason = None
            for j, seed in enumerate(seeds):
                reason = _compare(seed, c.contract[j], traces[i * len(seeds) + j])
                if reason:
                    break
            failures.append(reason)
        return failures

    def _not_trivial(self, cands):
        scripts, owners = [], []
        for c in cands:
            for action in (TOOL_NOOP_ACTIONS if c.tool_use else NOOP_ACTIONS):
                for seed in self.seeds:
                    scripts.append(_Script(c.report.code, seed, [action], turn_limit=c.turn_bound))
                    owners.append(c)
        traces = self._play(scripts)
        reasons: dict[int, str] = {}
        for c, script, trace in zip(owners, scripts, traces):
            if id(c) in reasons:
                continue
            error = trace.first_error()
            if error:
                reasons[id(c)] = f"seed {script.seed}, no-op action {_show(script.actions[0])}: {error}"
            elif trace.steps and trace.steps[0].raw_reward >= _WIN:
                reasons[id(c)] = (f"the no-op action {_show(script.actions[0])} already wins "
                                  f"(reward {trace.steps[0].raw_reward}) on seed {script.seed}")
        return [reasons.get(id(c)) for c in cands]

    def _feasibility(self, cands):
        firsts = self._play([_Script(c.report.code, seed, want_solution=True) for c in cands for seed in self.seeds])
        replays, owners, failures = [], [], {}
        for i, c in enumerate(cands):
            for j, seed in enumerate(self.seeds):
                trace = firsts[i * len(self.seeds) + j]
                reason = _solution_problem(seed, trace)
                if reason:
                    failures.setdefault(id(c), reason)
                    continue
                lines = [line for line in trace.solution.solution.splitlines() if line.strip()]
                replays.append(_Script(c.report.code, seed, lines, turn_limit=c.turn_bound))
                owners.append(c)
        for c, script, trace in zip(owners, replays, self._play(replays)):
            if id(c) in failures:
                continue
            reason = _replay_problem(script, trace)
            if reason:
                failures[id(c)] = reason
            else:
                c.report.details.setdefault("solution_steps", []).append(len(trace.steps))
        return [failures.get(id(c)) for c in cands]

    def _novelty(self, cands):
        failures = []
        for c in cands:
            mine = fingerprint(c.report.code, self.cfg.shingle_tokens)
            scores = [jaccard(mine, other) for other in self.archive]
            best = max(range(len(scores)), key=scores.__getitem__, default=None)
            if best is not None:
                c.report.details["max_similarity"] = round(scores[best], 4)
                c.report.details["most_similar_index"] = best
            if best is not None and scores[best] >= self.cfg.novelty_threshold:
                failures.append(f"near-duplicate of archive program #{best} (similarity {scores[best]:.2f} "
                                f">= threshold {self.cfg.novelty_threshold})")
            else:
                failures.append(None)
        return failures

    # --- running scripted episodes -----------------------------------------------------------

    def _probe_script(self, c: _Candidate, seed: int) -> _Script:
        filler = [""] * (c.turn_bound + 1)
        return _Script(c.report.code, seed, [*c.probes, *filler], turn_limit=c.turn_bound + len(c.probes) + 2)

    def _play(self, scripts: list[_Script]) -> list[_Trace]:
        """Plays scripts in chunks, so admission never holds more than _CHUNK live episodes
        (nor more than the pool allows)."""
        chunk = min(_CHUNK, self.pool.config.max_live_episodes)
        return [trace for first in range(0, len(scripts), chunk)
                for trace in self._play_chunk(scripts[first:first + chunk])]

    def _play_chunk(self, scripts: list[_Script]) -> list[_Trace]:
        """Starts every script's episode, optionally fetches solution(), steps the actions
        round by round (all live episodes in one batch per round) until each ends, closes all."""
        if not scripts:
            return []
        starts = self.pool.start([EpisodeSpec(s.code, seed=s.seed, max_turns=self.cfg.max_turns,
                                              turn_limit=s.turn_limit) for s in scripts])
        traces = [_Trace(r) for r in starts]
        try:
            wants = [i for i, s in enumerate(scripts) if s.want_solution and starts[i].ok]
            for i, result in zip(wants, self.pool.solution_results([starts[i].episode_id for i in wants])):
                traces[i].solution = result
            turn = 0
            while True:
                active = [i for i, s in enumerate(scripts)
                          if turn < len(s.actions) and _running(traces[i])]
                if not active:
                    break
                results = self.pool.step([starts[i].episode_id for i in active],
                                         [scripts[i].actions[turn] for i in active])
                for i, result in zip(active, results):
                    traces[i].steps.append(result)
                turn += 1
        finally:
            self.pool.close([r.episode_id for r in starts])
        return traces


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


def _compare(seed: int, first: _Trace, second: _Trace) -> str | None:
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


def _replay_problem(script: _Script, trace: _Trace) -> str | None:
    error = trace.first_error()
    if error:
        return f"replaying solution() for seed {script.seed}: {error}"
    last = trace.steps[-1] if trace.steps else None
    if last is not None and last.terminated and last.raw_reward >= _WIN:
        return None
    reward = last.raw_reward if last else 0.0
    return (f"replaying solution() for seed {script.seed} did not win: reward {reward} after "
            f"{len(trace.steps)} of {len(script.actions)} actions"
            + (" (episode truncated)" if last is not None and last.truncated else ""))


def _show(action: str) -> str:
    return repr(action if len(action) <= 40 else action[:37] + "...")
