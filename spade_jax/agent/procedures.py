"""Procedure memory with preplay (ProPlay-style): what won before, given as soft guidance.

Training-free: counts, no gradients. Pure Python; it reads environment programs only with
``ast`` (they are adversarial and never run outside the sandbox).

**Abstraction.** A trajectory becomes one `Step` per agent turn: the *kind* of its action
and the *stage* the step reaches.

- kind: ``call:<tool>`` for a ``<tool_call>`` (``call:?`` when its name cannot be read),
  ``answer`` for ``<answer>``, ``boxed:<shape>`` for a ``\\boxed{}`` game action, the shape
  one of `BOXED_SHAPES` (``number`` 12 / -3.5 / 3/4, ``expression`` digits with operators (+-*/^()=x),
  ``list`` two or more parts split by commas, semicolons or spaces, ``word`` one token,
  ``text`` anything else, ``empty``), and ``invalid`` for a reply with none of these.
- stage: from the observation that followed the step, ``error`` when it starts with one
  of `ERROR_PREFIXES` (the environment rejected the action) else ``progress``; the last
  step, which no observation follows, reaches ``win`` (the episode was won), ``loss``
  (it terminated unwon) or ``cut`` (truncated, out of turns or context, a sandbox failure).

**Procedure.** The path of a trajectory: its kinds with the ``error`` steps dropped (a
rejected action left the task where it was) and consecutive repeats collapsed into one
node with a run length, between the nodes `START` and `END`.

**Graph** (one per key: the environment's skill, or its family = the ``*Env`` class
name): nodes are kinds, each transition keeps ``success`` and ``count``, and its
reliability is ``(success + prior_success) / (count + prior_success + prior_failure)``
(the mean of a Beta posterior). `ProcedureMemory.update`, once per episode and once per
distinct transition of its path:

- a won episode adds its path: every transition gets ``count += 1`` and ``success += 1``
  (created at 0/0 first), and each node records its run length (for "x3" in the text);
- a lost episode only refines what is there: every transition of its path that the
  graph already holds gets ``count += 1`` (``success`` unchanged); the others are not
  added, so the graph holds only transitions of won procedures.

**Preplay.** `ProcedureMemory.guidance(key)`: the path from START to END with the largest
product of reliabilities over at most ``max_steps`` nodes (transitions seen fewer than
``min_count`` times left out; ties go to the shorter path, then to the smaller sequence
of kinds), rendered in at most ``max_chars`` characters. None when no won path exists.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import re
from typing import Iterable, Sequence

from spade_jax.agent.actions import parse_action
from spade_jax.envs.contract import extract_boxed
from spade_jax.envs.library import SKILLS
from spade_jax.envs.tool_use import TOOL_CALL

START, END = "START", "END"
KEYS = ("skill", "family")
STAGES = ("progress", "error", "win", "loss", "cut")
BOXED_SHAPES = ("empty", "number", "expression", "list", "word", "text")
ERROR_PREFIXES = ("error", "invalid", "unknown", "no tool call")
PROCEDURES_FILE = "procedures.json"  # the memory's summary in the workdir, for the gallery
GUIDANCE_PREFIX = "A procedure that won before (reliability {reliability:.2f}):"

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")
_EXPRESSION = re.compile(r"[\d\s.+\-*/^()=x]+")
_LIST_SPLIT = re.compile(r"[,;\s]+")
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
_SKILL_LINE = re.compile(r"^Skill:\s*([^.\n]+)", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ProcedureConfig:
    """Procedure memory (`agent.procedure_memory`): off by default.

    key: "skill" (held-out families of a known skill use its graph) or "family" (the
    program's ``*Env`` class name); prior_success / prior_failure: the Beta prior of a
    transition's reliability; min_count: plays a transition needs to be preplayed;
    max_steps: nodes of a preplayed path; max_chars: length of the guidance text.
    """

    enabled: bool = False
    key: str = "skill"
    prior_success: float = 1.0
    prior_failure: float = 1.0
    min_count: int = 1
    max_steps: int = 6
    max_chars: int = 300

    def __post_init__(self):
        if self.key not in KEYS:
            raise ValueError(f"key must be one of {KEYS}, got {self.key!r}")
        if self.prior_success <= 0 or self.prior_failure <= 0:
            raise ValueError(f"the Beta prior needs prior_success > 0 and prior_failure > 0, got "
                             f"{self.prior_success}, {self.prior_failure}")
        if self.min_count < 1 or self.max_steps < 1:
            raise ValueError(f"min_count and max_steps must be >= 1, got {self.min_count}, {self.max_steps}")
        if self.max_chars < len(GUIDANCE_PREFIX) + 20:
            raise ValueError(f"max_chars must be >= {len(GUIDANCE_PREFIX) + 20}, got {self.max_chars}")


@dataclasses.dataclass(frozen=True)
class Step:
    """One agent turn: the kind of its action and the stage it reached (see the module docstring)."""

    kind: str
    stage: str


@dataclasses.dataclass(frozen=True)
class Preplay:
    """A preplayed path: its nodes as (kind, typical run length) and the product of reliabilities."""

    steps: tuple[tuple[str, int], ...]
    reliability: float


# ---- abstraction ------------------------------------------------------------------------------


def boxed_shape(content: str) -> str:
    """The shape of a ``\\boxed{}`` content, one of `BOXED_SHAPES`."""
    text = content.strip()
    if not text:
        return "empty"
    if _NUMBER.fullmatch(text):
        return "number"
    if _EXPRESSION.fullmatch(text) and any(c.isdigit() for c in text) and any(c in "+-*/^()=x" for c in text):
        return "expression"
    if len([p for p in _LIST_SPLIT.split(text) if p]) >= 2:
        return "list"
    if text.isalnum():
        return "word"
    return "text"


def action_kind(response: str) -> str:
    """The kind of the action in a model reply (the action `parse_action` hands the environment)."""
    action = parse_action(response)
    if action.startswith("<answer>"):
        return "answer"
    call = TOOL_CALL.fullmatch(action)
    if call:
        try:
            name = json.loads(call.group(1)).get("name")
        except (ValueError, AttributeError, RecursionError):
            name = None
        return f"call:{name}" if isinstance(name, str) and _TOOL_NAME.fullmatch(name) else "call:?"
    boxed = extract_boxed(action)
    return f"boxed:{boxed_shape(boxed)}" if boxed is not None else "invalid"


def observation_stage(observation: str) -> str:
    """``error`` for an observation that rejects the action (`ERROR_PREFIXES`), else ``progress``."""
    return "error" if str(observation).strip().lower().startswith(ERROR_PREFIXES) else "progress"


def abstract(messages: Sequence[dict], won: bool, end_reason: str) -> tuple[Step, ...]:
    """The steps of an episode from its messages (system, first observation, then reply and
    observation alternating) and its outcome (`Trajectory.won`, `Trajectory.end_reason`)."""
    steps = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        following = messages[i + 1] if i + 1 < len(messages) else None
        if following is not None:
            stage = observation_stage(following.get("content", ""))
        else:
            stage = "win" if won else "loss" if end_reason == "terminated" else "cut"
        steps.append(Step(action_kind(str(message.get("content", ""))), stage))
    return tuple(steps)


def procedure_path(steps: Iterable[Step]) -> tuple[tuple[str, int], ...]:
    """The procedure of `steps`: kinds without the ``error`` steps, consecutive repeats as (kind, run)."""
    path: list[list] = []
    for step in steps:
        if step.stage == "error":
            continue
        if path and path[-1][0] == step.kind:
            path[-1][1] += 1
        else:
            path.append([step.kind, 1])
    return tuple((kind, run) for kind, run in path)


# ---- keys ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _module(program: str) -> ast.Module | None:
    try:
        return ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def family_of(program: str) -> str | None:
    """The program's environment class name (its first top-level ``class ...Env``), read with ``ast``."""
    module = _module(program)
    if module is None:
        return None
    return next((node.name for node in module.body if isinstance(node, ast.ClassDef) and node.name.endswith("Env")),
                None)


def skill_of(program: str) -> str | None:
    """The skill a program's docstring declares (a line ``Skill: <one of SKILLS>. ...``, as in the seed library)."""
    module = _module(program)
    docstring = ast.get_docstring(module) if module is not None else None
    match = _SKILL_LINE.search(docstring or "")
    return match.group(1).strip().lower() if match and match.group(1).strip().lower() in SKILLS else None


# ---- the graph and its memory ---------------------------------------------------------------


@dataclasses.dataclass
class _Graph:
    edges: dict[tuple[str, str], list[int]] = dataclasses.field(default_factory=dict)  # -> [success, count]
    runs: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # kind -> [sum of runs, won visits]


class ProcedureMemory:
    """One procedure graph per key, updated from episode outcomes, preplayed as guidance."""

    def __init__(self, cfg: ProcedureConfig = ProcedureConfig()):
        self.cfg = cfg
        self._graphs: dict[str, _Graph] = {}

    def key(self, program: str, skill: str | None = None) -> str | None:
        """The graph an environment uses: its `skill` (else the one its docstring declares) or its family."""
        if self.cfg.key == "family":
            return family_of(program)
        return skill or skill_of(program)

    def keys(self) -> list[str]:
        return sorted(self._graphs)

    @property
    def num_transitions(self) -> int:
        return sum(len(g.edges) for g in self._graphs.values())

    def reliability(self, success: int, count: int) -> float:
        a, b = self.cfg.prior_success, self.cfg.prior_failure
        return (success + a) / (count + a + b)

    def transition(self, key: str, src: str, dst: str) -> tuple[int, int] | None:
        """``(success, count)`` of a transition, None when the graph does not hold it."""
        edge = self._graphs.get(key, _Graph()).edges.get((src, dst))
        return (edge[0], edge[1]) if edge else None

    def update(self, key: str, procedure: Sequence[Step], won: bool) -> int:
        """Counts one episode of `key` (see the module docstring); returns the transitions it updated."""
        path = procedure_path(procedure)
        nodes = [START] + [kind for kind, _ in path] + [END]
        transitions = list(dict.fromkeys(zip(nodes, nodes[1:])))
        graph = self._graphs.get(key)
        if not won:
            held = [t for t in transitions if graph is not None and t in graph.edges]
            for t in held:
                graph.edges[t][1] += 1
            return len(held)
        graph = self._graphs.setdefault(key, _Graph())
        for t in transitions:
            edge = graph.edges.setdefault(t, [0, 0])
            edge[0] += 1
            edge[1] += 1
        for kind, run in path:
            total = graph.runs.setdefault(kind, [0, 0])
            total[0] += run
            total[1] += 1
        return len(transitions)

    def preplay(self, key: str | None) -> Preplay | None:
        """The most reliable won path of `key`'s graph (None when it has none)."""
        graph = self._graphs.get(key) if key is not None else None
        if graph is None:
            return None
        out: dict[str, list[tuple[str, float]]] = {}
        for (src, dst), (success, count) in sorted(graph.edges.items()):
            if count >= self.cfg.min_count:
                out.setdefault(src, []).append((dst, self.reliability(success, count)))
        # best[node]: (-product, path) of the best walk from START with exactly d transitions.
        best: dict[str, tuple[float, tuple[str, ...]]] = {START: (-1.0, ())}
        found: list[tuple[float, int, tuple[str, ...]]] = []
        for _ in range(self.cfg.max_steps + 1):
            step: dict[str, tuple[float, tuple[str, ...]]] = {}
            for node, (neg, path) in best.items():
                for dst, r in out.get(node, ()):
                    candidate = (neg * r, path + (dst,))
                    if dst == END:
                        found.append((candidate[0], len(path), path))
                    elif dst not in step or candidate < step[dst]:
                        step[dst] = candidate
            best = step
        if not found:
            return None
        neg, _, path = min(found)
        return Preplay(tuple((kind, self._typical_run(graph, kind)) for kind in path), -neg)

    def guidance(self, key: str | None) -> str | None:
        """The preplayed path of `key` as soft guidance for the first observation, or None."""
        preplay = self.preplay(key)
        return render(preplay, self.cfg.max_chars) if preplay else None

    def to_state(self) -> dict:
        """JSON: per key, transitions as ``[src, dst, success, count]`` and runs as ``[kind, sum, visits]``."""
        return {key: {"edges": [[s, d, *v] for (s, d), v in sorted(g.edges.items())],
                      "runs": [[k, *v] for k, v in sorted(g.runs.items())]}
                for key, g in sorted(self._graphs.items())}

    @classmethod
    def from_state(cls, cfg: ProcedureConfig, state: dict) -> "ProcedureMemory":
        memory = cls(cfg)
        for key, g in state.items():
            memory._graphs[key] = _Graph(
                edges={(s, d): [int(success), int(count)] for s, d, success, count in g["edges"]},
                runs={k: [int(total), int(n)] for k, total, n in g["runs"]},
            )
        return memory

    def summary(self) -> dict:
        """For the gallery: per key, its nodes, transitions with counts and reliabilities, the preplay."""
        out = {}
        for key in self.keys():
            graph = self._graphs[key]
            preplay = self.preplay(key)
            out[key] = {
                "nodes": sorted({n for edge in graph.edges for n in edge}),
                "transitions": [
                    {"from": s, "to": d, "success": v[0], "count": v[1], "reliability": self.reliability(*v)}
                    for (s, d), v in sorted(graph.edges.items())
                ],
                "preplay": None if preplay is None else {
                    "path": [kind for kind, _ in preplay.steps], "reliability": preplay.reliability,
                    "text": render(preplay, self.cfg.max_chars)},
            }
        return out

    @staticmethod
    def _typical_run(graph: _Graph, kind: str) -> int:
        total, visits = graph.runs.get(kind, (1, 1))
        return max(1, int(total / visits + 0.5))


def _label(kind: str, run: int) -> str:
    if kind.startswith("call:"):
        text = f"call {kind[5:]}"
    elif kind.startswith("boxed:"):
        text = f"\\boxed{{{kind[6:]}}}"
    else:
        text = {"answer": "answer", "invalid": "reply without an action"}.get(kind, kind)
    return f"{text} (x{run})" if run > 1 else text


def render(preplay: Preplay, max_chars: int) -> str:
    """``A procedure that won before (reliability 0.62): 1. call price (x3)  2. answer``, at most
    `max_chars` characters (trailing steps give way to `` ...``)."""
    head = GUIDANCE_PREFIX.format(reliability=preplay.reliability)
    items = [f"{i}. {_label(kind, run)}" for i, (kind, run) in enumerate(preplay.steps, 1)]
    for n in range(len(items), 0, -1):
        text = head + " " + "  ".join(items[:n]) + ("" if n == len(items) else " ...")
        if len(text) <= max_chars:
            return text
    return (head + " " + items[0])[:max_chars]
