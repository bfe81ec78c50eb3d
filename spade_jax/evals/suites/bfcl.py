"""BFCL-v4 multi-turn (`bfcl[:CATEGORIES]`): base, miss_func, miss_param and long_context,
played as episodes and scored by the package's own multi-turn checker.

The data, the executable backends (a file system, a trading bot, a travel agency, ...) and the
checker are ``bfcl-eval==2026.3.23``'s (installed ``--no-deps``; the modules used need only
``mpmath`` and ``filelock``); nothing is downloaded. CATEGORIES is a comma-separated subset
(``bfcl:base,miss_func``); results are filed as ``bfcl`` or ``bfcl-<categories>``. The package
writes lock files under its project root, which would be site-packages: unless
``BFCL_PROJECT_ROOT`` is set, this suite points it at a temporary directory (removed at exit)
before the package is first imported.

Each item is one entry (200 per category), played in BFCL's prompting mode through the agent's
multi-turn engine by `BfclPool`, in this process (the backends are the package's code, not
model-written). The first observation is upstream's default prompting system prompt (the
function docs as JSON, calls written ``[func(a=1), other(b='x')]``) followed by the first user
turn. Each reply is decoded as upstream decodes it (outer ``[]`` added when missing); a reply
with no calls, or one that is not a list of calls, ends the user turn and the next observation
is the next user turn (for miss_func, the held-out functions are shown at the turn the data
says, with upstream's message); after the last turn the episode terminates. A reply of calls
is executed on the episode's own backend instances and the observation is upstream's
execution-results message. After ``MAXIMUM_STEP_LIMIT`` (20) steps in one turn the next step
ends the episode, which then fails, as upstream force-quits the entry. The pool reports reward
0 at the end; the verdict is `score`'s.

``score`` replays the episode's replies through the same decoder to get the calls of every
step of every turn and runs ``multi_turn_checker`` (state and execution-response checks
against the ground truth, turn by turn), as upstream's ``multi_turn_runner`` does: 1.0 when
valid, else 0.0 with the checker's error type and message. An episode that did not finish all
its user turns (the step limit, ``max_turns``, the context budget) scores 0 as
``multi_turn:force_terminated``. Every episode and every checker run uses a fresh instance
namespace (the package caches backend instances by model name and entry id in a module's
globals), removed when the episode closes or the check returns.

Where this differs from upstream's evaluation:

* prompting mode only, with the default prompt format; the prompt is the first user message,
  under a neutral system message (``BENCHMARK_SYSTEM_PROMPT``), not the system message;
* model text is never evaluated: a call must name a function of the entry's classes, take
  literal arguments (no names, operators, calls, ``*``/``**``), integers within ±10**6 (the
  ground truth's largest is 987654), arguments of at most `bounded.MAX_LITERAL_SIZE`
  elements and characters in all, and numbers of at most 1000 for ``logarithm``/``square_root``
  precision, ``power`` exponents and ``round_number`` decimal places, whose cost grows with
  them (the ground truth's largest is 10), whatever the literal's type: a float, or a string
  or bytes that ``int()`` or ``float()`` reads, reaches mpmath's precision as an int does. A
  reply breaking one of these is refused whole with an error observation, nothing runs, and
  it counts as a step (upstream evaluates such text, and its decoder ``eval``s arithmetic and
  lambdas);
* the package sets ``mpmath.mp.dps`` (``logarithm``) and the decimal context's ``prec``
  (``square_root``) for the whole process; here every execution, the checker's included,
  restores both afterwards (`bounded.numeric_state_kept`);
* an item whose calls take more than ``work_s`` seconds of execution (default
  `bounded.ITEM_WORK_S`) ends failed with the reason, before its next reply runs, and scores
  0 as ``budget`` (`bounded.WorkBudget`; no ground-truth item comes near it);
* positional arguments are kept (upstream's decoder drops them, so ``sort('a.txt')``, which
  the ground truth itself writes, would run as ``sort()``).

As upstream, the pool gets each reply whole (``read_action``, the engine's hook), not cut to
512 characters as sandbox environments get theirs: 8 long_context entries need a single call
of 1000 to 7000 characters (a long post or file text).
"""

from __future__ import annotations

import ast
import atexit
import dataclasses
import itertools
import importlib.metadata
import json
import os
import shutil
import tempfile
from types import SimpleNamespace

from spade_jax.evals import bounded
from spade_jax.evals.registry import register
from spade_jax.evals.suite import (BENCHMARK_SYSTEM_PROMPT, Context, GenerationSettings, InProcessPool, Item,
                                   Score, SuiteUnavailable, spread)
from spade_jax.sandbox.records import StepResult

PACKAGE = "bfcl-eval"
VERSION = "2026.3.23"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION} (it needs mpmath and filelock)"
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
MAX_INT = 10**6
COSTLY = {("logarithm", "precision"): 1000, ("square_root", "precision"): 1000, ("power", "exponent"): 1000,
          ("round_number", "decimal_places"): 1000}
FORCE_TERMINATED = "multi_turn:force_terminated"

_namespaces = itertools.count()


def _package() -> SimpleNamespace:
    """The package's modules this suite uses, imported with its project root outside site-packages."""
    if "BFCL_PROJECT_ROOT" not in os.environ:
        root = tempfile.mkdtemp(prefix="spade-bfcl-")
        atexit.register(shutil.rmtree, root, True)
        os.environ["BFCL_PROJECT_ROOT"] = root
    try:
        from bfcl_eval import utils
        from bfcl_eval.constants import default_prompts
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
    except ImportError as err:
        raise SuiteUnavailable(f"bfcl needs {INSTALL}: {err}") from None
    return SimpleNamespace(utils=utils, prompts=default_prompts, checker=multi_turn_checker, execution=multi_turn_utils)


def _fresh_namespace() -> str:
    return f"spadejax_bfcl_{next(_namespaces)}"


def _forget(bfcl: SimpleNamespace, namespace: str) -> None:
    """Drops the backend instances the package cached for ``namespace``."""
    cache = vars(bfcl.execution)
    for key in [k for k in cache if k.startswith(namespace + "_")]:
        del cache[key]


def system_prompt(prompts, functions: list[dict]) -> str:
    """Upstream's default prompting system prompt (``formulate_system_prompt`` with
    ``DEFAULT_SYSTEM_PROMPT_FORMAT``: python calls, no tag, JSON docs, plaintext, classic)."""
    style = prompts.PROMPT_STYLE_TEMPLATES["classic"]
    return prompts.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"],
        task=style["task"],
        tool_call_format=style["tool_call_no_tag"].format(output_format=prompts.OUTPUT_FORMAT_MAPPING["python"],
                                                          param_types=prompts.PARAM_TYPE_MAPPING["python"]),
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(format="json", functions=json.dumps(functions, indent=4)),
    )


class Refused(ValueError):
    """A reply of calls this suite will not run; the message says why."""


def decode_calls(text: str, parameters: dict[str, list[str]]) -> list[str]:
    """The reply's calls as call strings the package executes, rebuilt from literals.

    ``parameters`` maps each callable function to its parameter names (in doc order). Returns
    [] when the reply holds no list of calls (upstream's decoder fails or finds none), which
    ends the turn; raises `Refused` when it holds calls that may not run.
    """
    body = text.strip("`\n ")
    body = ("" if body.startswith("[") else "[") + body + ("" if body.endswith("]") else "]")
    try:
        tree = ast.parse(body.strip().strip("'"), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    if not isinstance(tree, ast.List) or not all(isinstance(e, ast.Call) for e in tree.elts):
        return []
    calls = [_call(call, parameters) for call in tree.elts]
    if bounded.literal_size([arguments for _, arguments in calls]) > bounded.MAX_LITERAL_SIZE:
        raise Refused(f"the arguments are too large (over {bounded.MAX_LITERAL_SIZE} elements and characters)")
    return [call for call, _ in calls]


def _call(call: ast.Call, parameters: dict[str, list[str]]) -> tuple[str, list]:
    """The call string and its argument values."""
    if not isinstance(call.func, ast.Name):
        raise Refused(f"{ast.unparse(call.func)[:80]!r} is not a function name")
    name = call.func.id
    if name not in parameters:
        raise Refused(f"{name!r} is not one of the available functions")
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise Refused(f"{name}: * and ** arguments are not accepted")
    positional = [_literal(name, a) for a in call.args]
    keywords = {k.arg: _literal(name, k.value) for k in call.keywords}
    named = dict(zip(parameters[name], positional)) | keywords
    for (function, parameter), cap in COSTLY.items():
        if function == name and parameter in named and not bounded.within(named[parameter], cap):
            raise Refused(f"{name}: {parameter} may be at most {cap}")
    arguments = [repr(v) for v in positional] + [f"{k}={v!r}" for k, v in keywords.items()]
    return f"{name}({', '.join(arguments)})", positional + list(keywords.values())


def _literal(name: str, node: ast.AST):
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Refused(f"{name}: the argument {ast.unparse(node)[:80]!r} is not a literal") from None
    if _too_large(value):
        raise Refused(f"{name}: integers must lie within ±{MAX_INT}")
    return value


def _too_large(value) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) > MAX_INT
    if isinstance(value, dict):
        return any(_too_large(k) or _too_large(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_too_large(v) for v in value)
    return False


@dataclasses.dataclass
class Transcript:
    """What the model called, turn by turn and step by step (the checker's input), and where
    the episode stands. `feed` takes one reply; the pool and `score` share it."""

    user_turns: int
    parameters: dict[str, list[str]]
    step_limit: int
    turns: list[list[list[str]]] = dataclasses.field(default_factory=lambda: [[]])
    steps: int = 0
    finished: bool = False
    force_quit: bool = False

    @property
    def done(self) -> bool:
        return self.finished or self.force_quit

    @property
    def turn(self) -> int:
        return len(self.turns) - 1

    def feed(self, reply: str) -> list[str] | str | None:
        """The calls to execute, or the refusal (str), or None when the reply ended the turn."""
        try:
            calls = decode_calls(reply, self.parameters)
        except Refused as refusal:
            self._count_step()
            return str(refusal)
        if not calls:
            if self.turn + 1 == self.user_turns:
                self.finished = True
            else:
                self.turns.append([])
                self.steps = 0
            return None
        self.turns[-1].append(calls)
        self._count_step()
        return calls

    def _count_step(self) -> None:
        self.steps += 1
        self.force_quit = self.steps > self.step_limit


def _parameters(entry: dict) -> dict[str, list[str]]:
    docs = entry["function"] + [d for held in entry.get("missed_function", {}).values() for d in held]
    return {d["name"]: list(d["parameters"].get("properties", {})) for d in docs}


def _long_context(entry: dict) -> bool:
    return "long_context" in entry["id"] or "composite" in entry["id"]


@dataclasses.dataclass
class _Episode:
    entry: dict
    namespace: str
    transcript: Transcript
    budget: bounded.WorkBudget


class BfclPool(InProcessPool):
    """The sandbox pool's episode calls for BFCL entries, stepping the package's backends here;
    each episode's execution is bounded by a `bounded.WorkBudget` of ``work_s`` seconds."""

    def __init__(self, bfcl: SimpleNamespace, entries: dict[str, dict], work_s: float = bounded.ITEM_WORK_S):
        self._bfcl = bfcl
        self._entries = entries
        self._work_s = work_s
        super().__init__()

    def start(self, specs):
        results = []
        for spec in specs:
            episode_id = self._new_id()
            entry = self._entries.get(spec.program)
            if entry is None:
                results.append(StepResult(episode_id, truncated=True, failed_call="load",
                                          error=f"unknown BFCL entry {spec.program[:80]!r}"))
                continue
            episode = _Episode(entry, _fresh_namespace(), Transcript(len(entry["question"]), _parameters(entry),
                                                                     self._bfcl.prompts.MAXIMUM_STEP_LIMIT),
                               bounded.WorkBudget(self._work_s))
            self._episodes[episode_id] = episode
            self._execute(episode, [])  # builds the backend instances from the entry's initial_config
            first = system_prompt(self._bfcl.prompts, entry["function"]) + "\n\n" + self._user_turn(episode)
            results.append(StepResult(episode_id, observation=first))
        return results

    def step(self, episode_ids, actions):
        results = []
        for episode_id, action in zip(episode_ids, actions):
            episode = self._episodes.get(episode_id)
            if episode is None:
                results.append(StepResult(episode_id, truncated=True, failed_call="step", error="no such episode"))
                continue
            if episode.budget.exhausted:
                results.append(self._over_budget(episode_id, episode))
                continue
            transcript = episode.transcript
            outcome = transcript.feed(action)
            if isinstance(outcome, list):
                outputs = self._execute(episode, outcome)
                if episode.budget.exhausted:
                    results.append(self._over_budget(episode_id, episode))
                    continue
                observation = repr([{"role": "tool", "name": c, "content": o} for c, o in zip(outcome, outputs)])
            elif isinstance(outcome, str):
                observation = f"Error: {outcome}. Nothing was executed."
            else:
                observation = "" if transcript.done else self._user_turn(episode)
            if transcript.force_quit:
                observation = f"Model has been forced to quit after {transcript.step_limit} steps."
            results.append(StepResult(episode_id, observation=observation, terminated=transcript.done,
                                      turn=sum(map(len, transcript.turns))))
        return results

    @staticmethod
    def _over_budget(episode_id: int, episode: _Episode) -> StepResult:
        return StepResult(episode_id, truncated=True, failed_call="limit", error=episode.budget.reason,
                          turn=sum(map(len, episode.transcript.turns)))

    def _release(self, episode: _Episode) -> None:
        _forget(self._bfcl, episode.namespace)

    def _execute(self, episode: _Episode, calls: list[str]) -> list[str]:
        entry = episode.entry
        with episode.budget.charge():
            outputs, _ = self._bfcl.execution.execute_multi_turn_func_call(
                calls, entry["initial_config"], entry["involved_classes"], episode.namespace, entry["id"],
                long_context=_long_context(entry), is_evaL_run=False)
        return outputs

    def _user_turn(self, episode: _Episode) -> str:
        turn = episode.transcript.turn
        held_out = episode.entry.get("missed_function", {}).get(str(turn))
        if held_out is not None:
            return self._bfcl.prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=held_out)
        return "\n\n".join(m["content"] for m in episode.entry["question"][turn])


@dataclasses.dataclass
class BfclSuite:
    bfcl: SimpleNamespace
    categories: tuple[str, ...]
    settings: GenerationSettings
    entries: dict[str, dict]  # entry id -> the package's test entry, function docs included
    truth: dict[str, list[list[str]]]  # entry id -> ground-truth calls per turn
    notes: list = dataclasses.field(default_factory=list)
    name: str = "bfcl"
    work_s: float = bounded.ITEM_WORK_S  # seconds of execution one item's calls may take
    system_prompt = BENCHMARK_SYSTEM_PROMPT  # upstream's prompt opens the first user message

    def all_items(self) -> list[Item]:
        turn_bound = self.bfcl.prompts.MAXIMUM_STEP_LIMIT + 2
        return [Item(entry_id, group=_category(entry_id), program=entry_id,
                     max_turns=len(entry["question"]) * turn_bound)
                for entry_id, entry in self.entries.items()]

    def items(self, limit: int | None, seed: int) -> list[Item]:
        """Every entry (category by category, in file order), or ``limit`` of them spread over the
        categories (`suite.spread`)."""
        items = self.all_items()
        return [items[i] for i in spread([item.group for item in items], limit, seed, "bfcl")]

    @staticmethod
    def read_action(reply: str) -> str:
        """What the pool's ``step`` gets of a reply: all of it (the engine's hook)."""
        return reply

    def episode_pool(self, context: Context) -> BfclPool:
        return BfclPool(self.bfcl, self.entries, self.work_s)

    def transcript(self, entry_id: str, replies: list[str]) -> Transcript:
        """The calls the pool ran for these replies, as it decoded them."""
        entry = self.entries[entry_id]
        transcript = Transcript(len(entry["question"]), _parameters(entry), self.bfcl.prompts.MAXIMUM_STEP_LIMIT)
        for reply in replies:
            if transcript.done:
                break
            transcript.feed(reply)
        return transcript

    def score(self, item: Item, trajectory, context: Context | None = None) -> Score:
        replies = [self.read_action(m["content"]) for m in trajectory.messages if m["role"] == "assistant"]
        transcript = self.transcript(item.program, replies)
        details = {"category": item.group, "calls": transcript.turns, "end": trajectory.end_reason}
        error = getattr(trajectory, "error", None) or ""
        if error.startswith(bounded.BUDGET_EXCEEDED):
            verdict = {"valid": False, "error_type": "budget", "error_message": error}
        elif transcript.finished:
            verdict = self.check(item.program, transcript.turns)
        else:
            verdict = {"valid": False, "error_type": FORCE_TERMINATED,
                       "error_message": f"{len(transcript.turns) - 1} of {transcript.user_turns} user turns finished"}
        valid = bool(verdict["valid"])
        details["valid"] = valid
        if not valid:
            details.update(error_type=verdict.get("error_type"), error=verdict.get("error_message"))
            differences = verdict.get("details", {}).get("differences")
            if differences:
                details["differing_attributes"] = sorted(differences)
        return Score(1.0 if valid else 0.0, valid, details)

    def check(self, entry_id: str, calls: list[list[list[str]]]) -> dict:
        """The package's ``multi_turn_checker`` on the model's calls, in a fresh namespace."""
        namespace = _fresh_namespace()
        entry = self.entries[entry_id]
        try:
            with bounded.numeric_state_kept():
                return self.bfcl.checker.multi_turn_checker(calls, self.truth[entry_id], entry,
                                                            entry_id.rsplit("_", 1)[0], namespace)
        finally:
            _forget(self.bfcl, namespace)


def _category(entry_id: str) -> str:
    return entry_id.rsplit("_", 1)[0].removeprefix("multi_turn_")


@register("bfcl", GenerationSettings(temperature=0.0, max_new_tokens=1024),
          summary="BFCL-v4 multi-turn (base, miss_func, miss_param, long_context), scored by its own checker")
def make(argument: str, settings: GenerationSettings, eval_config) -> BfclSuite:
    """BFCL-v4 multi-turn (base, miss_func, miss_param, long_context), scored by its own checker."""
    categories = tuple(c.strip().removeprefix("multi_turn_") for c in argument.split(",") if c.strip()) or CATEGORIES
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise SuiteUnavailable(f"unknown BFCL multi-turn categor{'ies' if len(unknown) > 1 else 'y'} {unknown}; "
                               f"choose from {list(CATEGORIES)}")
    categories = tuple(dict.fromkeys(categories))
    bfcl = _package()
    entries, truth = {}, {}
    for category in categories:
        rows = bfcl.utils.load_dataset_entry(f"multi_turn_{category}")
        answers = {a["id"]: a["ground_truth"] for a in bfcl.utils.load_ground_truth_entry(f"multi_turn_{category}")}
        for row in rows:
            entries[row["id"]] = row
            truth[row["id"]] = answers[row["id"]]
    notes = ["prompting mode, default format; the BFCL prompt opens the first user message",
             "calls must use the entry's functions with literal arguments (integers within ±1e6, precisions, "
             f"exponents and decimal places at most 1000, {bounded.MAX_LITERAL_SIZE} elements and characters in all); "
             "others are refused with an error observation",
             f"an item whose calls take over {bounded.ITEM_WORK_S:g} s of execution fails as 'budget'"]
    installed = importlib.metadata.version(PACKAGE)
    if installed != VERSION:
        notes.append(f"{PACKAGE} {installed} is installed; this suite was checked against {VERSION}")
    name = "bfcl" if categories == CATEGORIES else "bfcl-" + "-".join(categories)
    return BfclSuite(bfcl, categories, settings, entries, truth, notes, name)
