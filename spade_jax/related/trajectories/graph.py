"""The tool dependency graph of one tool-use environment, from its schemas and from probing.

Tools are read on the trusted side from the ``tools`` class attribute of the class the
sandbox runs, as JSON literals (`schemas`: the program is never imported or run here).
Everything else is learned by calling the tools inside the sandbox (`ToolProbe`): the
environment is reset on a few seeds, each tool is called with values drawn from the first
observation, and then with values drawn from other tools' outputs. Every episode start checks
that the sandbox runs that class with exactly those tools; task texts and results are escaped
and bounded (`limits`).

A call *fails* (`is_failure`) when the sandbox reports an error or the episode ends, the
dispatcher flags it (``info["error"]``: malformed call, unknown tool, the tool raised), its
reply starts with ``Error`` or ``Unknown`` (the convention of the seed library's tools for a
value they do not know), or its reply equals the tool's *rejection*: what it answers, on
the same seed, to sentinel arguments no environment knows (``"zzqx-none"``, -987654321):
a tool that answers every bad value with one fixed sentence ("The machine only accepts ...")
is caught by the last rule. Anything else is a result, unless it is longer than
``limits.MAX_RESULT_CHARS``.

Edges: ``A -> B`` through argument ``p`` when a value taken from A's output, passed as B's
``p`` (B's other arguments from the observation and earlier outputs), gives a result on some
probe seed. Entry tools are those whose every argument can be filled from the observation
alone with a result.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Sequence

from spade_jax.envs.tool_use import render_tool_list, tool_call_action
from spade_jax.related.trajectories.limits import MAX_RESULT_CHARS, MAX_TASK_CHARS, program_text
from spade_jax.related.trajectories.schemas import ProgramRejected, Tool, parse_tool, read_tool_class
from spade_jax.sandbox import EpisodeSpec, StepResult
from spade_jax.text import display_line

SENTINELS = {"string": "zzqx-none", "integer": -987654321, "number": -987654.5}
PROBE_TURNS = 1000  # the sandbox's most steps per episode: probes share one episode per seed
MAX_COMBINATIONS = 4096  # argument combinations `assignments` ranks at most (the cheapest kept)
_FAILURE_PREFIXES = ("error", "unknown")
_TOKEN = re.compile(r"'([^'\n]{1,40})'|\"([^\"\n]{1,40})\"|(-?\d+(?:\.\d+)?)|([A-Za-z][A-Za-z0-9_'-]*)")
_SENTENCE_END = re.compile(r"[.!?:]\s*$")


@dataclasses.dataclass(frozen=True)
class Edge:
    """A value from ``source``'s output fed ``target``'s argument ``argument`` with a result."""

    source: str
    target: str
    argument: str


@dataclasses.dataclass(frozen=True)
class ToolGraph:
    """Nodes (tool names, schema order), edges, and the entry tools (fillable from the observation)."""

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]
    entry: tuple[str, ...]

    def edges_from(self, tool: str) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.source == tool)

    def has_edge(self, source: str, target: str) -> bool:
        return any(e.source == source and e.target == target for e in self.edges)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def task_text(observation: str, schemas: list[dict]) -> str:
    """The first observation without the tool list and call format the base class appends."""
    suffix = "\n\n" + render_tool_list(schemas)
    if observation.endswith(suffix):
        return observation[: -len(suffix)]
    return observation.split("\n\nTools:\n", 1)[0]


def text_values(text: str) -> list[tuple[int, object]]:
    """Candidate argument values in ``text`` with a salience tier (0 first), in order of appearance.

    Tier 0: quoted phrases, numbers, capitalised words inside a sentence, words next to a
    comma or right after a number (list members: "2 apple, 3 bread"); tier 1: other
    capitalised words; tier 2: the rest. Numbers come as int/float.
    """
    out, seen = [], set()
    for match in _TOKEN.finditer(text):
        quoted = match.group(1) or match.group(2)
        before, after = text[: match.start()].rstrip(), text[match.end():].lstrip()
        if quoted is not None:
            value, tier = quoted, 0
        elif match.group(3) is not None:
            number = match.group(3)
            value, tier = (float(number) if "." in number else int(number)), 0
        else:
            value = match.group(4).strip("'-")
            if not value:
                continue
            listed = before.endswith(",") or after.startswith(",") or bool(re.search(r"\d$", before))
            starts_sentence = not before or bool(_SENTENCE_END.search(before))
            capital = value[0].isupper()
            tier = 0 if listed or (capital and not starts_sentence) else 1 if capital else 2
        key = (type(value).__name__, value)
        if key not in seen:
            seen.add(key)
            out.append((tier, value))
    return out


def typed_values(values: Sequence[tuple[int, object]], kind: str) -> list[tuple[int, object]]:
    """The values a parameter of JSON type ``kind`` admits (numbers as strings rank last for strings)."""
    if kind == "integer":
        return [(t, v) for t, v in values if isinstance(v, int)]
    if kind == "number":
        return [(t, v) for t, v in values if isinstance(v, (int, float))]
    if kind == "boolean":
        return [(0, True), (0, False)]
    if kind == "string":
        return [(t, v) if isinstance(v, str) else (2, str(v)) for t, v in values]
    return []


def assignments(tool: Tool, pools: dict[str, list[tuple[int, object]]], rng: random.Random,
                limit: int, include: Sequence[str] = (), width: int = 6) -> list[dict]:
    """Up to ``limit`` argument dicts for ``tool``: each parameter's candidates from ``pools[name]``
    (tiered, shuffled within a tier, the first ``width`` kept), combinations ordered by summed
    rank, no value used twice in one call. Optional parameters are left out unless named in
    ``include``. [] when a parameter to fill has no candidate."""
    names = [name for name in tool.param_names if name in tool.required or name in include]
    names = names or list(tool.param_names[:1])
    ranked = []
    for name in names:
        candidates = [(tier, rng.random(), value) for tier, value in pools.get(name, [])]
        candidates.sort(key=lambda c: (c[0], c[1]))
        ranked.append([value for _, _, value in candidates[:width]])
        if not ranked[-1]:
            return []
    combos = [((), 0)]
    for values in ranked:
        combos = [(combo + (value,), cost + rank) for combo, cost in combos for rank, value in enumerate(values)]
        if len(combos) > MAX_COMBINATIONS:  # width ** parameters would grow without bound
            combos = sorted(combos, key=lambda c: c[1])[:MAX_COMBINATIONS]
    combos = [c for c in combos if len({json.dumps(v) for v in c[0]}) == len(c[0])]
    keyed = sorted(combos, key=lambda c: (c[1], rng.random()))
    return [dict(zip(names, combo)) for combo, _ in keyed[:limit]]


def is_failure(result, rejection: str | None = None) -> bool:
    """Whether a sandbox step result is an error rather than a tool result (module docstring)."""
    if not result.ok or result.done or (result.info or {}).get("error"):
        return True
    text = (result.observation or "").strip()
    return text.lower().startswith(_FAILURE_PREFIXES) or (rejection is not None and text == rejection)


class ToolProbe:
    """Calls tools of one program in sandbox episodes: ``open(seed)``, ``call``, ``close``.

    ``schemas`` default to the program's (`schemas.read_tool_schemas`); the class the sandbox
    must run is always read from the source. ``oversized`` counts replies over
    ``MAX_RESULT_CHARS``. Once an episode is over (an error, or it ended), calls to it fail
    without reaching the sandbox."""

    def __init__(self, pool, source: str, schemas: list[dict] | None = None, env_kwargs: dict | None = None):
        tool_class = read_tool_class(source)
        self.pool, self.source, self.env_class = pool, source, tool_class.name
        self.schemas = tool_class.schemas if schemas is None else schemas
        self.tools = {t.name: t for t in map(parse_tool, self.schemas)}
        self.env_kwargs = dict(env_kwargs or {})
        self.oversized = 0
        self._rejections: dict[tuple[int, str], str | None] = {}
        self._ended: set[int] = set()

    def open(self, seed: int, turns: int = PROBE_TURNS) -> tuple[int, str] | tuple[None, str]:
        """A fresh episode reset with ``seed``: (episode id, task text: escaped, cut to
        ``MAX_TASK_CHARS``), or (None, the error). `ProgramRejected` when the sandbox runs another
        class or other tools than the ones read."""
        spec = EpisodeSpec(self.source, seed=seed, max_turns=turns, env_kwargs=self.env_kwargs, turn_limit=turns)
        (start,) = self.pool.start([spec])
        if not start.ok:
            self.pool.close([start.episode_id])
            return None, start.error or "the environment did not start"
        if start.env_class != self.env_class or list(start.tools) != list(self.tools):
            self.pool.close([start.episode_id])
            running = display_line(f"{start.env_class} with tools [{', '.join(start.tools)}]", 200)
            raise ProgramRejected(f"the sandbox runs {running}, not the tools read "
                                  f"({self.env_class}: {', '.join(self.tools)})")
        task = task_text(program_text(start.observation), self.schemas)
        return start.episode_id, program_text(task, MAX_TASK_CHARS)

    def close(self, episode_id: int) -> None:
        self._ended.discard(episode_id)
        self.pool.close([episode_id])

    def ended(self, episode_id: int) -> bool:
        return episode_id in self._ended

    def raw_call(self, episode_id: int, name: str, arguments: dict):
        if episode_id in self._ended:
            return StepResult(episode_id, truncated=True, error="the episode is over", failed_call="limit")
        (result,) = self.pool.step([episode_id], [tool_call_action(name, arguments)])
        if not result.ok or result.done:
            self._ended.add(episode_id)
        return result

    def rejection(self, episode_id: int, seed: int, name: str) -> str | None:
        """The tool's reply to sentinel arguments on this seed (asked once per episode seed)."""
        key = (seed, name)
        if key not in self._rejections:
            tool = self.tools[name]
            sentinel = {p: SENTINELS.get(kind, SENTINELS["string"]) for p, kind in tool.params
                        if p in tool.required or not tool.required}
            result = self.raw_call(episode_id, name, sentinel)
            self._rejections[key] = None if not result.ok else (result.observation or "").strip()
        return self._rejections[key]

    def call(self, episode_id: int, seed: int, name: str, arguments: dict, ask_rejection: bool = True) -> str | None:
        """The tool's result text, or None when the call fails (`is_failure`). With
        ``ask_rejection=False`` only a rejection already known for the seed is used (no extra
        call: a replay must see exactly its own calls)."""
        if ask_rejection:
            rejection = self.rejection(episode_id, seed, name)
        else:
            rejection = self._rejections.get((seed, name))
        result = self.raw_call(episode_id, name, arguments)
        if is_failure(result, rejection):
            return None
        text = program_text(result.observation.strip())
        if len(text) > MAX_RESULT_CHARS:
            self.oversized += 1
            return None
        return text


def probe_graph(pool, source: str, *, seeds: Sequence[int] = (0, 1, 2), max_tries: int = 12, seed: int = 0,
                env_kwargs: dict | None = None, probe: ToolProbe | None = None) -> ToolGraph:
    """The tool graph of a tool-use program (module docstring). Deterministic for ``seed``.

    Per probe seed, one episode: entry probes, then edge probes from every tool that has
    produced an output (repeated until no new tool produces one). ``max_tries`` argument
    assignments are tried per probe (through ``probe``, by default a new one). `ProgramRejected`
    (`NotToolUse` among them) when the program's tools cannot be used.
    """
    probe = ToolProbe(pool, source, env_kwargs=env_kwargs) if probe is None else probe
    names = tuple(probe.tools)
    entry, edges = set(), set()
    for probe_seed in seeds:
        rng = random.Random(f"{seed}/{probe_seed}")
        episode_id, task = probe.open(probe_seed)
        if episode_id is None:
            continue
        try:
            observed = text_values(task)
            outputs: dict[str, list[str]] = {}
            for name in names:
                if probe.ended(episode_id):
                    break
                tool = probe.tools[name]
                for arguments in assignments(tool, _pools(tool, observed), rng, max_tries):
                    result = probe.call(episode_id, probe_seed, name, arguments)
                    if result is not None:
                        entry.add(name)
                        outputs.setdefault(name, []).append(result)
                        break
            tried: set[tuple[str, str, str]] = set()
            while True:
                todo = [(a, b, p) for a in names if a in outputs for b in names
                        for p in probe.tools[b].param_names if (a, b, p) not in tried]
                if not todo or probe.ended(episode_id):
                    break
                for source_tool, target, argument in todo:
                    if probe.ended(episode_id):
                        break
                    tried.add((source_tool, target, argument))
                    tool = probe.tools[target]
                    fed = [v for text in outputs[source_tool] for v in text_values(text)]
                    others = observed + [v for texts in outputs.values() for text in texts for v in text_values(text)]
                    pools = _pools(tool, others)
                    pools[argument] = typed_values(fed, dict(tool.params)[argument])
                    for arguments in assignments(tool, pools, rng, max_tries, include=(argument,)):
                        result = probe.call(episode_id, probe_seed, target, arguments)
                        if result is not None:
                            edges.add(Edge(source_tool, target, argument))
                            outputs.setdefault(target, []).append(result)
                            break
        finally:
            probe.close(episode_id)
    ordered_edges = tuple(sorted(edges, key=lambda e: (names.index(e.source), names.index(e.target), e.argument)))
    return ToolGraph(names, ordered_edges, tuple(n for n in names if n in entry))


def _pools(tool: Tool, values: list[tuple[int, object]]) -> dict[str, list[tuple[int, object]]]:
    return {name: typed_values(values, kind) for name, kind in tool.params}
