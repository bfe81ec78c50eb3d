"""LiveCodeBench code generation from a local release file (`lcb:PATH`); solutions run in the sandbox.

PATH is a JSONL file of the ``livecodebench/code_generation_lite`` release (``test.jsonl`` ..
``test6.jsonl``; one problem per line) or a directory of them. Fields read:
``question_id``, ``question_title``, ``question_content``, ``starter_code``, ``difficulty``
(the item's group: easy / medium / hard), ``platform``, ``public_test_cases`` and
``private_test_cases`` (each a JSON list of ``{"input", "output", "testtype"}``, given as a
list, as a JSON string, or, as the release stores the private ones, as base64 of zlib of a
pickled JSON string: that pickle is read with an unpickler that refuses every global, so it
can only yield the string), and ``metadata`` (a dict or a JSON string; ``func_name`` names the
method of functional problems). A problem is functional when its tests' ``testtype`` is
``functional`` (LeetCode style: ``Solution().<func_name>(*args)``, each input line one JSON
argument, the output one JSON value), else stdin (AtCoder / Codeforces style: the program
reads stdin and writes stdout). Every public and private test counts, as in LiveCodeBench.
The file is indexed once (byte offsets) and each item's tests are read back from it when
it is scored, so a full release file is never held in memory.

Each item is one user message: the problem, the starter code (functional) or the stdin/stdout
instructions, and the request for one ```python block. Scoring: the code of the reply's LAST
closed ```python (or ```py / ```python3 / bare ```) block is run against each test in the
sandbox (``context.pool``, a ``SandboxPool``: the isolation, limits and import policy of
environment programs). Comparison is LiveCodeBench's: stdout and the expected output are
stripped, split into lines and each line stripped; line counts must agree and each line
must be equal as text or as a list of exact decimals (``1.0`` == ``1``); functional return
values must equal the expected JSON value (tuples count as lists). The expected outputs
never enter the sandbox: the sandbox returns a digest of the canonical stdout (or the
JSON of the return value) and the comparison happens here. ``value`` is the fraction of
tests passed, ``solved`` only when all pass.

How the code runs: a generated environment program (``program_for``) embeds the code,
compiles it at ``reset()``, and runs one test per ``step()`` (the action is the test's
input as JSON): stdin programs run as ``__main__`` in a fresh namespace per test, with
``input``, ``print``, ``open(0)`` and ``sys.stdin`` / ``sys.stdout`` (also ``.buffer``) bound
to the test's input and a captured output; functional code is executed once and each test
calls a fresh ``Solution()``. As in LiveCodeBench, the namespace is pre-filled with the star
imports of string, re, datetime, collections, heapq, bisect, copy, math, random,
statistics, itertools, functools, operator, json and typing. ``sys`` is not importable
under the sandbox's import policy, so the reply's ``import sys`` / ``from sys import ...``
are rewritten (here, with ``ast``) to bind a stand-in with ``stdin``, ``stdout``, ``stderr``,
``exit``, ``maxsize``, ``argv`` and a ``setrecursionlimit`` that does nothing (the limit stays
at the interpreter's default of 1000 frames). Any other module outside
``spade_jax.sandbox.policy.ALLOWED_MODULES`` (os, io, threading, ...) fails to import and that
test fails.

Limits: each test gets the pool's ``call_timeout_s`` (a test past it is stopped, the
worker killed, and the remaining tests are not run); the whole item gets
``ITEM_TIME_LIMIT_S`` (and at most the pool's ``episode_time_s``), measured by the program in
the sandbox, so that every process of a multi-process run sees the same verdict and takes
the same number of (collective) steps; output beyond
``OUTPUT_LIMIT_CHARS`` fails the test. Memory and processes are the pool's limits.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import functools
import hashlib
import inspect
import io
import json
import pickle
import re
import zlib
from pathlib import Path

from spade_jax.evals.registry import register
from spade_jax.evals.suite import Context, GenerationSettings, Item, Score, SuiteUnavailable, spread
from spade_jax.evals.suites._files import data_path, files_of, suite_name

SUFFIXES = (".jsonl",)
WHERE = ("a LiveCodeBench code_generation JSONL, e.g. test6.jsonl of "
         "https://huggingface.co/datasets/livecodebench/code_generation_lite")
ITEM_TIME_LIMIT_S = 60.0
OUTPUT_LIMIT_CHARS = 1 << 24
MAX_CODE_CHARS = 100_000
SYS_STUB = "__lcb_sys__"
# what ``from sys import *`` binds (the stand-in's names)
SYS_NAMES = ("argv", "exit", "maxsize", "setrecursionlimit", "getrecursionlimit", "stderr", "stdin", "stdout")
PRELUDE_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                   "statistics", "itertools", "functools", "operator", "json", "typing")

INTRO = ("You will be given a question (problem specification) and will generate a correct Python program "
         "that matches the specification and passes all tests. Use only the Python standard library; the "
         "program cannot use files, the operating system or threads.")
FUNCTIONAL_FORMAT = ("Use the following starter code to write the solution to the problem and enclose your "
                     "code within delimiters.\n```python\n{starter}\n```")
STDIN_FORMAT = ("Read the inputs from stdin, solve the problem and write the answer to stdout (do not directly "
                "test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when "
                "the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT."
                "\n```python\n# YOUR CODE HERE\n```")


# --- data ------------------------------------------------------------------------------------


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a test-case pickle")


def decode_tests(raw) -> list[dict]:
    """A test list as the release stores it: a list, a JSON string, or base64(zlib(pickle(JSON)))."""
    if isinstance(raw, list):
        return raw
    if not raw:
        return []
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    data = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(raw.encode("ascii"))))).load()
    return json.loads(data) if isinstance(data, (str, bytes)) else data


def _metadata(raw) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def index_problems(path: Path) -> list[dict]:
    """Every problem under ``path`` with where its line starts, without its tests; in file order."""
    problems, seen = [], set()
    for file in files_of(path, SUFFIXES):
        offset = 0
        with file.open("rb") as f:
            for number, line in enumerate(f, 1):
                start, offset = offset, offset + len(line)
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise SuiteUnavailable(f"{file}:{number} is not JSON ({err.msg}); lcb needs {WHERE}") from None
                if not isinstance(record, dict) or not isinstance(record.get("question_content"), str):
                    raise SuiteUnavailable(f"{file}:{number} has no question_content; lcb needs {WHERE}")
                public = decode_tests(record.get("public_test_cases"))
                func_name = _metadata(record.get("metadata")).get("func_name")
                functional = any(t.get("testtype") == "functional" for t in public) or (
                    not public and bool(func_name))
                if functional and not func_name:
                    raise SuiteUnavailable(f"{file}:{number} has functional tests but no metadata.func_name")
                item_id = str(record.get("question_id") or f"{file.stem}/{number}")
                while item_id in seen:
                    item_id += "+"
                seen.add(item_id)
                problems.append({
                    "id": item_id, "difficulty": str(record.get("difficulty") or "unknown").lower(),
                    "title": record.get("question_title") or "", "content": record["question_content"],
                    "starter": record.get("starter_code") or "", "func_name": func_name if functional else None,
                    "file": str(file), "offset": start})
    return problems


@functools.lru_cache(maxsize=4)
def load_tests(file: str, offset: int) -> tuple[tuple[str, str], ...]:
    """(input, expected output) of every public then private test of the problem at ``offset``."""
    with open(file, "rb") as f:
        f.seek(offset)
        record = json.loads(f.readline())
    tests = decode_tests(record.get("public_test_cases")) + decode_tests(record.get("private_test_cases"))
    return tuple((str(t["input"]), str(t["output"])) for t in tests)


def prompt_for(problem: dict) -> str:
    if problem["func_name"]:
        form = FUNCTIONAL_FORMAT.format(starter=problem["starter"].strip("\n"))
    else:
        form = STDIN_FORMAT
    return (f"{INTRO}\n\n### Question:\n{problem['content'].strip()}\n\n### Format: {form}\n\n"
            "### Answer: (use the provided format with backticks)")


# --- the reply's code ------------------------------------------------------------------------

_FENCED = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)


def extract_python(reply: str) -> str | None:
    """The code of the last closed ```python / ```py / ```python3 / bare ``` block, or None."""
    blocks = [body for lang, body in _FENCED.findall(reply) if lang.lower() in ("python", "py", "python3", "")]
    return blocks[-1] if blocks else None


class _StubSys(ast.NodeTransformer):
    """Rewrites ``import sys [as s]`` and ``from sys import a [as b], *`` to bind the stand-in."""

    @staticmethod
    def _bind(name: str, value: ast.expr) -> ast.Assign:
        return ast.Assign(targets=[ast.Name(name, ast.Store())], value=value)

    def visit_Import(self, node: ast.Import):
        kept = [alias for alias in node.names if alias.name != "sys"]
        binds = [self._bind(alias.asname or "sys", ast.Name(SYS_STUB, ast.Load()))
                 for alias in node.names if alias.name == "sys"]
        if not binds:
            return node
        out = ([ast.Import(names=kept)] if kept else []) + binds
        return [ast.copy_location(statement, node) for statement in out]

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.module != "sys" or node.level:
            return node
        names = [(n, n) for n in SYS_NAMES] if any(a.name == "*" for a in node.names) else [
            (alias.asname or alias.name, alias.name) for alias in node.names]
        return [ast.copy_location(self._bind(target, ast.Attribute(ast.Name(SYS_STUB, ast.Load()), source, ast.Load())),
                                  node) for target, source in names]


def prepare_code(code: str) -> str:
    """The code as it will run: ``sys`` imports bound to the stand-in. Raises SyntaxError (and
    ValueError / RecursionError / MemoryError for pathological text) when it does not parse."""
    if len(code) > MAX_CODE_CHARS:
        raise ValueError(f"the code has {len(code)} characters, more than {MAX_CODE_CHARS}")
    tree = _StubSys().visit(ast.parse(code, "<solution>"))
    return ast.unparse(ast.fix_missing_locations(tree))


# --- comparison (this function also runs inside the sandbox, see program_for) ----------------


def canonical_output(text):
    """LiveCodeBench's stdout comparison as one string: two outputs pass for each other iff their
    canonical forms are equal (lines stripped; a line is equal as text, or as a list of exact
    decimals, NaN never equal to itself). A number becomes its integer digits when it is a whole
    number of at most 1000 digits, else ``[-]digits e exponent`` without trailing zeros."""
    from decimal import Decimal, InvalidOperation

    def exact(token):
        body = token[1:] if token[:1] == "-" else token
        if body.isdigit() and body.isascii() and len(body) <= 1000:  # the common case, without Decimal
            body = body.lstrip("0")
            return (token[0] + body if token[0] == "-" else body) if body else "0"
        number = Decimal(token)
        if number.is_nan():
            raise ValueError("NaN equals nothing")
        if number.is_infinite():
            return "-inf" if number.is_signed() else "inf"
        if not number:
            return "0"
        sign, digits, exponent = number.as_tuple()
        digits = list(digits)
        while digits[-1] == 0:
            digits.pop()
            exponent += 1
        head = ("-" if sign else "") + "".join(map(str, digits))
        if 0 <= exponent and len(digits) + exponent <= 1000:
            return head + "0" * exponent
        return head + "e" + str(exponent)

    lines = []
    for line in text.strip().split("\n"):
        line = line.strip()
        try:
            lines.append("d" + " ".join([exact(token) for token in line.split()]))
        except (InvalidOperation, ValueError, TypeError):
            lines.append("s" + line)
    return "\n".join(lines)


def output_digest(text: str) -> str:
    return hashlib.sha256(canonical_output(text).encode("utf-8", "backslashreplace")).hexdigest()


def value_digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8", "backslashreplace")).hexdigest()


# --- the program that runs in the sandbox ----------------------------------------------------

_PROGRAM = r'''"""Runs one LiveCodeBench solution against tests, one per step.

Generated by spade_jax.evals.suites.livecodebench.
"""
import hashlib
import json
from datetime import datetime as _clock

SOLUTION = @SOLUTION@
FUNC_NAME = @FUNC_NAME@
PRELUDE = @PRELUDE@
SYS_STUB = @SYS_STUB@
OUTPUT_LIMIT = @OUTPUT_LIMIT@
_RESTORE = {"compile": compile, "pow": pow, "abs": abs}  # builtins the prelude's star imports shadow


@CANONICAL@


def _digest(text):
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()


def _describe(err):
    try:
        return (type(err).__name__ + ": " + str(err))[:300]
    except BaseException:
        return "an exception"


class _In:
    """One test's input, read-only (text; bytes as ``.buffer``)."""

    def __init__(self, data):
        self._data, self._pos = data, 0
        self._newline = "\n" if isinstance(data, str) else b"\n"
        if isinstance(data, str):
            self.buffer = _In(data.encode("utf-8"))

    def read(self, size=-1):
        end = len(self._data) if size is None or size < 0 else min(len(self._data), self._pos + size)
        chunk, self._pos = self._data[self._pos:end], end
        return chunk

    def readline(self, size=-1):
        end = self._data.find(self._newline, self._pos)
        end = len(self._data) if end < 0 else end + 1
        if size is not None and size >= 0:
            end = min(end, self._pos + size)
        chunk, self._pos = self._data[self._pos:end], end
        return chunk

    def readlines(self, hint=-1):
        lines = []
        while True:
            line = self.readline()
            if not line:
                return lines
            lines.append(line)

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def fileno(self):
        return 0

    def isatty(self):
        return False

    def readable(self):
        return True

    def close(self):
        pass


class _Out:
    """A captured output stream (``keep=False``: a sink)."""

    def __init__(self, keep=True):
        self._parts, self._keep, self.size, self.over = [], keep, 0, False
        self.buffer = _BytesOut(self)

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not " + type(text).__name__)
        if self._keep and not self.over:
            self.size += len(text)
            if self.size > OUTPUT_LIMIT:
                self.over = True
                self._parts = []
            else:
                self._parts.append(text)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass

    def fileno(self):
        return 1

    def isatty(self):
        return False

    def getvalue(self):
        return "".join(self._parts)


class _BytesOut:
    def __init__(self, text):
        self._text = text

    def write(self, data):
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self):
        pass


class _Sys:
    """What solutions use of ``sys``: the test's streams and a few harmless calls."""

    maxsize = 9223372036854775807
    argv = ["main.py"]
    byteorder = "little"

    def __init__(self, stdin, stdout, stderr):
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr

    def setrecursionlimit(self, limit):
        pass

    def getrecursionlimit(self):
        return 1000

    def set_int_max_str_digits(self, digits):
        pass

    def exit(self, status=None):
        raise SystemExit(status)


def _stop(status=None):
    raise SystemExit(status)


def _print_to(stdout):
    def print_(*args, sep=" ", end="\n", file=None, flush=False):
        target = stdout if file is None else file
        target.write((" " if sep is None else sep).join([str(a) for a in args]) + ("\n" if end is None else end))
    return print_


def _input_from(stdin):
    def input_(prompt=""):
        line = stdin.readline()
        if not line:
            raise EOFError("EOF when reading a line")
        return line[:-1] if line.endswith("\n") else line
    return input_


def _open_from(stdin):
    def open_(file, mode="r", *args, **kwargs):
        if (file == 0 or file == "/dev/stdin") and not any(c in str(mode) for c in "wax+"):
            return stdin.buffer if "b" in str(mode) else stdin
        raise PermissionError("solutions cannot open files")
    return open_


class LiveCodeBenchEnv:
    def __init__(self, max_turns=None, value_limit=60000, time_limit_s=60.0, **kwargs):
        self.value_limit = value_limit
        self.time_limit_s = time_limit_s

    def _namespace(self, text, name):
        stdin, stdout, stderr = _In(text), _Out(), _Out(keep=False)
        stand_in = _Sys(stdin, stdout, stderr)
        namespace = dict(self.base)
        namespace.update({"__name__": name, SYS_STUB: stand_in, "sys": stand_in, "stdin": stdin, "stdout": stdout,
                          "stderr": stderr, "setrecursionlimit": stand_in.setrecursionlimit,
                          "maxsize": stand_in.maxsize, "print": _print_to(stdout), "input": _input_from(stdin),
                          "open": _open_from(stdin), "exit": _stop, "quit": _stop})
        return namespace, stdout

    def reset(self, seed=None):
        self.started = _clock.now()
        self.base = {}
        exec(PRELUDE, self.base)
        self.base.update(_RESTORE)
        try:
            self.code = compile(SOLUTION, "<solution>", "exec")
            if FUNC_NAME is not None:
                self.module, _ = self._namespace("", "solution")
                exec(self.code, self.module)
        except BaseException as err:
            return json.dumps({"ready": False, "error": _describe(err)}), {}
        return json.dumps({"ready": True}), {}

    def step(self, action):
        if (_clock.now() - self.started).total_seconds() > self.time_limit_s:
            return json.dumps({"stopped": True}), 0.0, False, False, {}
        text = json.loads(action)["input"]
        verdict = self._call(text) if FUNC_NAME is not None else self._script(text)
        return json.dumps(verdict), 0.0, False, False, {}

    def _script(self, text):
        namespace, stdout = self._namespace(text, "__main__")
        error = None
        try:
            exec(self.code, namespace)
        except SystemExit as done:
            if done.code not in (None, 0):
                error = "SystemExit: " + str(done.code)[:100]
        except BaseException as err:
            error = _describe(err)
        if stdout.over:
            error = "output limit: more than " + str(OUTPUT_LIMIT) + " characters"
        output = stdout.getvalue()
        return {"error": error, "digest": _digest(canonical_output(output)), "preview": output[:200]}

    def _call(self, text):
        try:
            args = [json.loads(line) for line in text.split("\n")]
            owner = self.module.get("Solution")
            method = getattr(owner(), FUNC_NAME) if isinstance(owner, type) else self.module[FUNC_NAME]
            value = method(*args)
            if isinstance(value, tuple):
                value = list(value)
            encoded = json.dumps(value)
        except BaseException as err:
            return {"error": _describe(err)}
        if len(encoded) <= self.value_limit:
            return {"error": None, "value": encoded}
        return {"error": None, "digest": _digest(json.dumps(value, sort_keys=True)), "preview": encoded[:200]}
'''


def program_for(code: str, func_name: str | None) -> str:
    """The environment program that runs ``code`` (already ``prepare_code``-d) against tests."""
    prelude = "".join([f"from {m} import *\n" for m in PRELUDE_MODULES] + [f"import {m}\n" for m in PRELUDE_MODULES])
    fills = {"@SOLUTION@": repr(code), "@FUNC_NAME@": repr(func_name), "@PRELUDE@": repr(prelude),
             "@SYS_STUB@": repr(SYS_STUB), "@OUTPUT_LIMIT@": str(OUTPUT_LIMIT_CHARS),
             "@CANONICAL@": inspect.getsource(canonical_output)}
    return re.sub("|".join(map(re.escape, fills)), lambda m: fills[m.group(0)], _PROGRAM)


# --- the suite -------------------------------------------------------------------------------


@dataclasses.dataclass
class LiveCodeBenchSuite:
    problems: list
    settings: GenerationSettings
    name: str
    time_limit_s: float = ITEM_TIME_LIMIT_S

    def items(self, limit, seed):
        return [Item(p["id"], group=p["difficulty"], reference={k: p[k] for k in ("func_name", "file", "offset")},
                     messages=({"role": "user", "content": prompt_for(p)},))
                for p in (self.problems[i] for i in spread([p["difficulty"] for p in self.problems], limit, seed, "lcb"))]

    def score(self, item: Item, reply, context: Context) -> Score:
        return self.score_batch([item], [reply], context)[0]

    def score_batch(self, items, replies, context: Context) -> list[Score]:
        """Scores many replies at once: their solutions run side by side on the pool's workers."""
        if context.pool is None:
            raise ValueError(f"{self.name} runs solutions in the sandbox: Context.pool must be a SandboxPool")
        scores: list[Score | None] = []
        runnable = []  # (index in scores, (code, func_name, tests))
        for item, reply in zip(items, replies):
            if not isinstance(reply, str):
                raise TypeError(f"{self.name} scores chat replies, got {type(reply).__name__}")
            tests = load_tests(item.reference["file"], item.reference["offset"])
            prepared = _prepared(reply, len(tests))
            if isinstance(prepared, Score):
                scores.append(prepared)
            else:
                runnable.append((len(scores), (prepared, item.reference["func_name"], tests)))
                scores.append(None)
        ran = run_tests_batch(context.pool, [solution for _, solution in runnable], self.time_limit_s)
        for (index, _), score in zip(runnable, ran):
            scores[index] = score
        return scores


def _prepared(reply: str, total: int) -> str | Score:
    """The reply's code ready to run, or the failing score when there is none to run."""
    code = extract_python(reply)
    if code is None:
        return _failed(total, "no ```python code block in the reply")
    try:
        return prepare_code(code)
    except SyntaxError as err:
        return _failed(total, f"syntax error at line {err.lineno}: {err.msg}")
    except (ValueError, RecursionError, MemoryError) as err:
        return _failed(total, f"cannot parse the code: {type(err).__name__}: {err}"[:300])


def _failed(total: int, why: str) -> Score:
    return Score(0.0, False, {"passed": 0, "total": total, "error": why})


@dataclasses.dataclass
class _Run:
    """One solution's progress through its tests (`run_tests_batch`)."""

    tests: list
    functional: bool
    episode_id: int | None = None
    next_test: int = 0
    passed: int = 0
    failure: dict | None = None
    stopped: dict | None = None
    result: Score | None = None

    def score(self) -> Score:
        if self.result is not None:
            return self.result
        details = {"passed": self.passed, "total": len(self.tests)}
        if self.failure or self.stopped:
            details["first_failure"] = self.failure or self.stopped
        if self.stopped:
            details["stopped"] = self.stopped
        total = len(self.tests)
        return Score(self.passed / total if total else 0.0, bool(total) and self.passed == total, details)


def run_tests(pool, code: str, func_name: str | None, tests, time_limit_s: float = ITEM_TIME_LIMIT_S) -> Score:
    """Runs ``code`` against ``tests`` ((input, expected output) pairs) in one sandbox episode."""
    return run_tests_batch(pool, [(code, func_name, tests)], time_limit_s)[0]


def run_tests_batch(pool, solutions, time_limit_s: float = ITEM_TIME_LIMIT_S) -> list[Score]:
    """Runs each ``(code, func_name, tests)`` in its own sandbox episode, all at once: one start
    call, then one step call per round with the next test of every solution still running, so
    the pool's workers run solutions side by side (at most the pool's live-episode limit at a
    time). Scores in input order."""
    from spade_jax.sandbox import EpisodeSpec

    config = pool.config
    value_limit = max(1000, min(60000, config.max_observation_chars - 2000))
    time_limit_s = min(time_limit_s, config.episode_time_s)
    runs = [_Run(list(tests), func_name is not None) for _, func_name, tests in solutions]
    chunk = max(1, config.max_live_episodes)
    for first in range(0, len(runs), chunk):
        part = runs[first:first + chunk]
        specs = [EpisodeSpec(program=program_for(code, func_name), seed=0, turn_limit=len(tests) + 1,
                             env_kwargs={"value_limit": value_limit, "time_limit_s": time_limit_s})
                 for code, func_name, tests in solutions[first:first + chunk]]
        starts = pool.start(specs)
        try:
            for run, start in zip(part, starts):
                run.episode_id = start.episode_id
                ready = _json(start.observation) if start.ok else {}
                if not start.ok or not ready.get("ready"):
                    why = start.error if not start.ok else ready.get("error")
                    run.result = Score(0.0, False, {"passed": 0, "total": len(run.tests),
                                                    "error": f"did not load: {why}"[:500], "timed_out": start.timed_out})
            while live := [r for r in part if r.result is None and r.stopped is None and r.next_test < len(r.tests)]:
                results = pool.step([r.episode_id for r in live],
                                    [json.dumps({"input": r.tests[r.next_test][0]}) for r in live])
                for run, result in zip(live, results):
                    _record(run, result, time_limit_s)
        finally:
            pool.close([r.episode_id for r in part if r.episode_id is not None])
    return [run.score() for run in runs]


def _record(run: _Run, result, time_limit_s: float) -> None:
    """Folds one test's step result into ``run``."""
    index = run.next_test
    run.next_test += 1
    if not result.ok:  # the worker is gone: the remaining tests are not run
        run.stopped = {"test": index, "error": ("timed out: " if result.timed_out else "") + (result.error or "")[:300],
                       "timed_out": result.timed_out}
        return
    verdict = _json(result.observation)
    if verdict.get("stopped"):
        run.stopped = {"test": index, "error": f"item time limit of {time_limit_s:g} s reached"}
        return
    why = _mismatch(verdict, run.tests[index][1], run.functional)
    if why is None:
        run.passed += 1
    elif run.failure is None:
        got = verdict.get("preview", verdict.get("value", ""))
        run.failure = {"test": index, "error": why, "got": str(got)[:200]}


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _mismatch(verdict: dict, expected: str, functional: bool) -> str | None:
    """None when the sandbox's verdict matches ``expected``, else why not."""
    if verdict.get("error"):
        return str(verdict["error"])[:300]
    if functional:
        want = json.loads(expected)
        if "value" in verdict:
            try:
                return None if json.loads(verdict["value"]) == want else "wrong answer"
            except (ValueError, TypeError, RecursionError):
                return "the return value came back unreadable"
        return None if verdict.get("digest") == value_digest(want) else "wrong answer"
    return None if verdict.get("digest") == output_digest(expected) else "wrong answer"


@register("lcb", GenerationSettings(temperature=0.0, max_new_tokens=4096))
def make(argument: str, settings: GenerationSettings, eval_config) -> LiveCodeBenchSuite:
    """LiveCodeBench code generation from a local release JSONL; solutions run in the sandbox."""
    path = data_path("lcb", argument, "a local release file", WHERE, SUFFIXES)
    problems = index_problems(path)
    if not problems:
        raise SuiteUnavailable(f"{path} holds no problems; lcb needs {WHERE}")
    return LiveCodeBenchSuite(problems, settings, suite_name("lcb", path))
