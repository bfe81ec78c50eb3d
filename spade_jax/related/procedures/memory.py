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

**Held-out evaluation sees nothing designed.** Designed programs are adversarial and name
their own classes, skills and tools, so the memory keeps two sets of graphs:

- the *training* graphs learn from the plain plays of every program the loop plays, seed or
  designed, except a program that *claims a held-out family* (`provenance` None: one of its
  classes is named after a held-out program of `memory.heldout`, by its name or its class name,
  case, underscores and a trailing ``Env`` ignored); they guide the training plays of designed
  programs;
- the *seed library's* graphs learn only from programs byte-identical to a seed program that is
  not held out (`provenance` `SEED`); they guide the plays of those seed programs (so text a
  designed program wrote cannot reach them by the agent following it) and they are the only
  graphs held-out evaluation is served (``guidance(key, seed_library=True)``).

So no path learned from a designed program is served to a held-out item under either key: with
``key="skill"`` a designed program of a held-out item's skill guides training plays only (the
held-out item gets the path of the seed programs of its skill), and with ``key="family"`` a
held-out family has no seed-library graph (its program is never played). There is no option to
serve training graphs to evaluation: it would have to exclude held-out keys and families, and
every held-out item's key is one, so it would serve a held-out item nothing.

**Text.** Guidance is built only from kinds of the grammar above (`valid_kind`: tool names
`[A-Za-z_][A-Za-z0-9_]{0,39}`); an episode with another kind is not counted, a checkpointed
transition with one is not restored and `render` drops one. At most `MAX_STEPS` steps and
`MAX_CHARS` characters; a step that does not fit gives way to `` ...``, never cut mid-name.

**State** (`to_state`): ``{"format": 2, "graphs": ..., "seed_library": ...}``. A checkpoint of
the earlier format (the graphs alone, without provenance) restores its graphs as training
graphs and an empty seed library (nothing in it can be shown to come from seed programs).
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
from spade_jax.envs import library
from spade_jax.envs.library import SKILLS
from spade_jax.envs.tool_use import TOOL_CALL

START, END = "START", "END"
KEYS = ("skill", "family")
STAGES = ("progress", "error", "win", "loss", "cut")
BOXED_SHAPES = ("empty", "number", "expression", "list", "word", "text")
ERROR_PREFIXES = ("error", "invalid", "unknown", "no tool call")
GUIDANCE_PREFIX = "A procedure that won before (reliability {reliability:.2f}):"
MAX_STEPS, MAX_CHARS = 16, 1000  # the most steps and characters any configuration renders
SEED, DESIGNED = "seed", "designed"  # `provenance`: a seed-library program, any other program
STATE_FORMAT = 2

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")
_EXPRESSION = re.compile(r"[\d\s.+\-*/^()=x]+")
_LIST_SPLIT = re.compile(r"[,;\s]+")
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
_SKILL_LINE = re.compile(r"^Skill:\s*([^.\n]+)", re.MULTILINE)
_KIND = re.compile("|".join([r"answer", r"invalid", r"call:\?", "call:" + _TOOL_NAME.pattern,
                             "boxed:(?:" + "|".join(BOXED_SHAPES) + ")"]))


@dataclasses.dataclass(frozen=True)
class ProcedureConfig:
    """Procedure memory (`agent.procedure_memory`): off by default.

    key: "skill" (held-out families of a known skill use its graph) or "family" (the
    program's ``*Env`` class name); prior_success / prior_failure: the Beta prior of a
    transition's reliability; min_count: plays a transition needs to be preplayed;
    max_steps: nodes of a preplayed path (at most `MAX_STEPS`); max_chars: length of the
    guidance text (at most `MAX_CHARS`).
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
        if self.min_count < 1 or not 1 <= self.max_steps <= MAX_STEPS:
            raise ValueError(f"min_count must be >= 1 and max_steps in [1, {MAX_STEPS}], got {self.min_count}, "
                             f"{self.max_steps}")
        if not len(GUIDANCE_PREFIX) + 20 <= self.max_chars <= MAX_CHARS:
            raise ValueError(f"max_chars must be in [{len(GUIDANCE_PREFIX) + 20}, {MAX_CHARS}], got {self.max_chars}")


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


def valid_kind(kind) -> bool:
    """Whether `kind` is one `action_kind` can return (the only kinds counted, restored or rendered)."""
    return isinstance(kind, str) and _KIND.fullmatch(kind) is not None


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


def _family_name(name: str) -> str:
    """``HiddenRuleEnv``, ``hidden_rule``, ``Hidden_Rule_ENV`` -> ``hiddenrule``."""
    folded = re.sub(r"[^a-z0-9]", "", name.lower())
    return folded.removesuffix("env")


@functools.lru_cache(maxsize=8)
def _heldout(heldout: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """The folded names of the held-out programs' families and the sources of the other seed programs."""
    families = set()
    for name in heldout:
        families.add(_family_name(name))
        family = family_of(library.load_source(name))
        if family:
            families.add(_family_name(family))
    seeds = frozenset(library.load_source(env.name) for env in library.SEED_ENVS if env.name not in heldout)
    return frozenset(families), seeds


def provenance(program: str, heldout: Sequence[str]) -> str | None:
    """`SEED` for the source of a seed-library program not in `heldout` (the names of held-out seed
    programs, `memory.heldout`); None for a program that claims a held-out family (any class named
    after a held-out program, see the module docstring) or cannot be parsed: never learned from;
    else `DESIGNED`."""
    families, seeds = _heldout(tuple(heldout))
    if program in seeds:
        return SEED
    module = _module(program)
    if module is None:
        return None
    claims = any(isinstance(node, ast.ClassDef) and _family_name(node.name) in families for node in ast.walk(module))
    return None if claims else DESIGNED


# ---- the graph and its memory ---------------------------------------------------------------


@dataclasses.dataclass
class _Graph:
    edges: dict[tuple[str, str], list[int]] = dataclasses.field(default_factory=dict)  # -> [success, count]
    runs: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # kind -> [sum of runs, won visits]


class ProcedureMemory:
    """One procedure graph per key, updated from episode outcomes, preplayed as guidance; and the
    seed library's graphs, the only ones served to held-out evaluation (see the module docstring)."""

    def __init__(self, cfg: ProcedureConfig = ProcedureConfig()):
        self.cfg = cfg
        self._graphs: dict[str, _Graph] = {}
        self._seed_graphs: dict[str, _Graph] = {}

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

    def _of(self, seed_library: bool) -> dict[str, _Graph]:
        return self._seed_graphs if seed_library else self._graphs

    def transition(self, key: str, src: str, dst: str, *, seed_library: bool = False) -> tuple[int, int] | None:
        """``(success, count)`` of a transition, None when the graph does not hold it."""
        edge = self._of(seed_library).get(key, _Graph()).edges.get((src, dst))
        return (edge[0], edge[1]) if edge else None

    def update(self, key: str, procedure: Sequence[Step], won: bool, *, seed_library: bool = False) -> int:
        """Counts one episode of `key` (see the module docstring), into the seed library's graphs as
        well when `seed_library` (a play of a seed program, `provenance` `SEED`); returns the
        transitions it updated. An episode with a kind outside the grammar (`valid_kind`) is not counted."""
        path = procedure_path(procedure)
        if not all(valid_kind(kind) for kind, _ in path):
            return 0
        if seed_library:
            self._count(self._seed_graphs, key, path, won)
        return self._count(self._graphs, key, path, won)

    @staticmethod
    def _count(graphs: dict[str, _Graph], key: str, path: tuple[tuple[str, int], ...], won: bool) -> int:
        nodes = [START] + [kind for kind, _ in path] + [END]
        transitions = list(dict.fromkeys(zip(nodes, nodes[1:])))
        graph = graphs.get(key)
        if not won:
            held = [t for t in transitions if graph is not None and t in graph.edges]
            for t in held:
                graph.edges[t][1] += 1
            return len(held)
        graph = graphs.setdefault(key, _Graph())
        for t in transitions:
            edge = graph.edges.setdefault(t, [0, 0])
            edge[0] += 1
            edge[1] += 1
        for kind, run in path:
            total = graph.runs.setdefault(kind, [0, 0])
            total[0] += run
            total[1] += 1
        return len(transitions)

    def preplay(self, key: str | None, *, seed_library: bool = False) -> Preplay | None:
        """The most reliable won path of `key`'s graph (of the seed library's graphs when
        `seed_library`; None when it has none)."""
        graph = self._of(seed_library).get(key) if key is not None else None
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

    def guidance(self, key: str | None, *, seed_library: bool = False) -> str | None:
        """The preplayed path of `key` as soft guidance for the first observation, or None;
        `seed_library`: from the seed library's graphs only (what held-out evaluation gets)."""
        preplay = self.preplay(key, seed_library=seed_library)
        return render(preplay, self.cfg.max_chars) if preplay else None

    def to_state(self) -> dict:
        """JSON (see the module docstring): per key, transitions as ``[src, dst, success, count]``
        and runs as ``[kind, sum, visits]``."""
        return {"format": STATE_FORMAT, "graphs": _graphs_state(self._graphs),
                "seed_library": _graphs_state(self._seed_graphs)}

    @classmethod
    def from_state(cls, cfg: ProcedureConfig, state: dict) -> "ProcedureMemory":
        """The memory of `to_state`, or of the earlier format (its graphs, an empty seed library);
        transitions and runs of kinds outside the grammar are dropped."""
        memory = cls(cfg)
        if "format" in state:
            memory._graphs = _graphs_of(state["graphs"])
            memory._seed_graphs = _graphs_of(state["seed_library"])
        else:
            memory._graphs = _graphs_of(state)
        return memory

    def summary(self) -> dict:
        """For the gallery: per key, its nodes, transitions with counts and reliabilities, the preplay,
        and ``heldout_text``, the seed library's preplay held-out evaluation is served (or None)."""
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
                "heldout_text": self.guidance(key, seed_library=True),
            }
        return out

    @staticmethod
    def _typical_run(graph: _Graph, kind: str) -> int:
        total, visits = graph.runs.get(kind, (1, 1))
        return max(1, int(total / visits + 0.5))


def _graphs_state(graphs: dict[str, _Graph]) -> dict:
    return {key: {"edges": [[s, d, *v] for (s, d), v in sorted(g.edges.items())],
                  "runs": [[k, *v] for k, v in sorted(g.runs.items())]}
            for key, g in sorted(graphs.items())}


def _graphs_of(state: dict) -> dict[str, _Graph]:
    def node(n):
        return n in (START, END) or valid_kind(n)

    return {key: _Graph(
        edges={(s, d): [int(success), int(count)] for s, d, success, count in g["edges"] if node(s) and node(d)},
        runs={k: [int(total), int(n)] for k, total, n in g["runs"] if valid_kind(k)},
    ) for key, g in state.items()}


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
    `max_chars` characters (trailing steps give way to `` ...``); steps of a kind outside the
    grammar (`valid_kind`) are dropped, never rendered."""
    head = GUIDANCE_PREFIX.format(reliability=preplay.reliability)
    steps = [(kind, run) for kind, run in preplay.steps if valid_kind(kind)]
    items = [f"{i}. {_label(kind, run)}" for i, (kind, run) in enumerate(steps, 1)]
    for n in range(len(items), 0, -1):
        text = head + " " + "  ".join(items[:n]) + ("" if n == len(items) else " ...")
        if len(text) <= max_chars:
            return text
    return head + " ..."
