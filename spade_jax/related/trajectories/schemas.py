"""The tool schemas of a tool-use program, read on the trusted side without running it.

The class read is the one the sandbox runs (`sandbox.worker.load_env`): the program's single
module-level class whose name ends in ``Env``. Its ``tools`` come from the last assignment in
its body or, when it has none, from its bases that are classes of the same module (followed
by name, first base first). A program with no such class, or with several, is not read, and
the synthesizer checks at every episode start that the sandbox runs a class of that name with
exactly these tools (`graph.ToolProbe.open`).

Values are JSON only: ``dict`` with ``str`` keys, ``list`` (a tuple reads as one), ``str``,
``int`` (64-bit), finite ``float``, ``bool``, ``None``; plus f-strings without format specs and
names of module constants (``NAME = <such a literal>`` before the class). Sets, bytes, complex
numbers, calls and every other expression are refused. The size of the list as JSON is counted
while it is read (every reference to a constant counts in full), and its nesting is bounded
(`limits`), so reading costs at most those bounds. Tool and parameter names must be Python
identifiers of at most 64 characters (the dispatcher calls ``tool_<name>(**arguments)``); every
other string is escaped (`limits.program_text`). ``parameters`` and ``properties`` are objects
when present (`render_tool_list` reads them), ``required`` a list of strings (or None).

Every failure is a `ProgramRejected` with its reason; `NotToolUse` (a subclass) when the
program declares no tools at all, i.e. it is not a tool-use program.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re

from spade_jax.related.trajectories.limits import (MAX_PARAMS, MAX_SCHEMA_CHARS, MAX_SCHEMA_DEPTH, MAX_SOURCE_CHARS,
                                                   MAX_TOOLS, escape_json)
from spade_jax.text import display_line

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_INT_BOUND = 2**63
_MAX_BASES = 8  # base classes followed from the Env class to the one that assigns tools


class ProgramRejected(ValueError):
    """Synthesis cannot use the program; the message says why (the summary table shows it)."""


class NotToolUse(ProgramRejected):
    """The class the sandbox runs declares no ``tools`` list: the program is not a tool-use program."""


@dataclasses.dataclass(frozen=True)
class Tool:
    """One tool's name, its parameters (name -> JSON type) in schema order and the required ones."""

    name: str
    params: tuple[tuple[str, str], ...]
    required: tuple[str, ...]

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)


@dataclasses.dataclass(frozen=True)
class ToolClass:
    """The class the sandbox runs and its validated, escaped tool schemas."""

    name: str
    schemas: list


def read_tool_schemas(source: str) -> list[dict]:
    """The validated tool schemas of the class the sandbox runs (module docstring)."""
    return read_tool_class(source).schemas


def read_tool_class(source: str) -> ToolClass:
    """The class the sandbox runs and its tool schemas; `ProgramRejected` with the reason otherwise."""
    if not isinstance(source, str):
        raise ProgramRejected(f"the program is not text ({type(source).__name__})")
    if len(source) > MAX_SOURCE_CHARS:
        raise ProgramRejected(f"the program has {len(source)} characters, more than {MAX_SOURCE_CHARS}")
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ProgramRejected(f"does not parse: {display_line(str(err.msg), 120)} (line {err.lineno})") from None
    except (RecursionError, MemoryError):
        raise ProgramRejected("does not parse: too deeply nested") from None
    except ValueError as err:  # null bytes
        raise ProgramRejected(f"does not parse: {display_line(str(err), 120)}") from None
    classes = {stmt.name: (i, stmt) for i, stmt in enumerate(tree.body) if isinstance(stmt, ast.ClassDef)}
    envs = [name for name in classes if name.endswith("Env")]
    if not envs:
        raise NotToolUse("no class whose name ends in 'Env'")
    if len(envs) > 1:
        raise ProgramRejected(f"the sandbox runs exactly one class whose name ends in 'Env'; found "
                              f"{display_line(', '.join(envs), 200)}")
    env = envs[0]
    owner, node = _tools_assignment(env, classes)
    if node is None:
        raise NotToolUse(f"class {env} declares no tools list")
    where = f"class {owner}: tools"
    reader = _Reader(_module_constants(tree.body[: classes[owner][0]]))
    schemas = reader.read(node, where)
    if not isinstance(schemas, list) or not schemas:
        raise ProgramRejected(f"{where} is not a non-empty list")
    if len(schemas) > MAX_TOOLS:
        raise ProgramRejected(f"{where} has {len(schemas)} tools, more than {MAX_TOOLS}")
    tools = [parse_tool(schema) for schema in schemas]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ProgramRejected(f"{where} names a tool twice")
    schemas = escape_json(schemas)
    size = len(json.dumps(schemas, ensure_ascii=False))
    if size > MAX_SCHEMA_CHARS:
        raise ProgramRejected(f"{where} has {size} characters as JSON, more than {MAX_SCHEMA_CHARS}")
    return ToolClass(env, schemas)


def _tools_assignment(env: str, classes: dict) -> tuple[str, ast.AST | None]:
    """(the class whose body assigns ``tools``, the assigned expression), searching ``env`` then its
    module-level bases by name, first base first (None when none assigns it)."""
    todo, seen = [env], set()
    while todo and len(seen) < _MAX_BASES:
        name = todo.pop(0)
        if name in seen or name not in classes:
            continue
        seen.add(name)
        cls = classes[name][1]
        value = None
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "tools" for t in stmt.targets):
                value = stmt.value
            elif (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "tools"
                  and stmt.value is not None):
                value = stmt.value
        if value is not None:
            return name, value
        todo = [b.id for b in cls.bases if isinstance(b, ast.Name)] + todo
    return env, None


def _module_constants(statements: list[ast.stmt]) -> dict[str, ast.AST]:
    """Module-level ``NAME = expr`` (also ``A, B = 1, 2`` and ``A = B = 1``) before the class, the
    last binding winning; a name bound another way afterwards (``+=``, import, def, for) is dropped."""
    constants: dict[str, ast.AST] = {}
    for stmt in statements:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                pairs = [(target, stmt.value)]
                if isinstance(target, ast.Tuple):
                    value = stmt.value
                    same = isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts)
                    pairs = list(zip(target.elts, value.elts)) if same else [(t, None) for t in target.elts]
                for name, value in pairs:
                    if isinstance(name, ast.Name):
                        if value is None:
                            constants.pop(name.id, None)
                        else:
                            constants[name.id] = value
            continue
        for name in _bound_names(stmt):
            constants.pop(name, None)
    return constants


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    targets = {ast.AugAssign: lambda s: [s.target], ast.For: lambda s: [s.target], ast.AsyncFor: lambda s: [s.target],
               ast.With: lambda s: [i.optional_vars for i in s.items if i.optional_vars is not None],
               ast.Delete: lambda s: s.targets}.get(type(stmt))
    if targets is None:
        return []
    return [n.id for t in targets(stmt) for n in ast.walk(t) if isinstance(n, ast.Name)]


class _Reader:
    """Reads a JSON literal from an expression, counting its JSON size and depth as it goes."""

    def __init__(self, constants: dict[str, ast.AST]):
        self.constants = constants
        self.chars = 0
        self.where = ""

    def read(self, node: ast.AST, where: str):
        self.where = where
        return self._value(node, depth=0, names=())

    def _reject(self, why: str):
        raise ProgramRejected(f"{self.where}: {why}")

    def _count(self, chars: int) -> None:
        self.chars += chars
        if self.chars > MAX_SCHEMA_CHARS:
            self._reject(f"more than {MAX_SCHEMA_CHARS} characters as JSON")

    def _value(self, node: ast.AST, depth: int, names: tuple[str, ...]):
        if depth > MAX_SCHEMA_DEPTH:
            self._reject(f"nested more than {MAX_SCHEMA_DEPTH} deep")
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Constant):
            return self._scalar(node.value, line)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(
                node.operand, ast.Constant) and type(node.operand.value) in (int, float):
            return self._scalar(-node.operand.value if isinstance(node.op, ast.USub) else node.operand.value, line)
        if isinstance(node, ast.Name):
            if node.id not in self.constants or node.id in names:
                self._reject(f"{node.id} (line {line}) is not a module constant holding a literal")
            return self._value(self.constants[node.id], depth + 1, names + (node.id,))
        if isinstance(node, (ast.List, ast.Tuple)):
            self._count(2 + len(node.elts))
            return [self._value(e, depth + 1, names) for e in node.elts]
        if isinstance(node, ast.Dict):
            self._count(2 + 2 * len(node.keys))
            out = {}
            for key, value in zip(node.keys, node.values):
                if key is None:
                    self._reject(f"dict unpacking (line {line}) is not read")
                k = self._value(key, depth + 1, names)
                if not isinstance(k, str):
                    self._reject(f"a dict key (line {line}) is not a string")
                out[k] = self._value(value, depth + 1, names)
            return out
        if isinstance(node, ast.JoinedStr):
            return self._fstring(node, depth, names)
        self._reject(f"{type(node).__name__} (line {line}) is not a JSON literal")

    def _scalar(self, value, line):
        if value is None or type(value) in (bool, str):
            self._count(len(value) + 2 if isinstance(value, str) else 5)
            return value
        if type(value) is int and -_INT_BOUND < value < _INT_BOUND:
            self._count(20)
            return value
        if type(value) is float and math.isfinite(value):
            self._count(24)
            return value
        self._reject(f"{type(value).__name__} {display_line(repr(value), 40)} (line {line}) is not a JSON value "
                     "(strings, 64-bit integers, finite floats, booleans, None)")

    def _fstring(self, node: ast.JoinedStr, depth: int, names: tuple[str, ...]) -> str:
        """What Python makes of the f-string from these values (``str``, ``!r``, ``!a``; no format specs)."""
        self._count(2)
        parts = []
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                if part.format_spec is not None:
                    self._reject(f"format specs (line {part.lineno}) are not read")
                start = self.chars
                value = self._value(part.value, depth + 1, names)
                text = repr(value) if part.conversion == ord("r") else ascii(value) if part.conversion == ord(
                    "a") else str(value)
                self.chars = start  # the value is counted as the text it becomes
            else:
                text = str(part.value)
            self._count(len(text))
            parts.append(text)
        return "".join(parts)


def parse_tool(schema) -> Tool:
    """The name, parameters and required parameters of one OpenAI-style schema
    (``{"type": "function", "function": ...}`` or the bare function object), validated."""
    fn = schema.get("function", schema) if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ProgramRejected(f"a tool schema has no name: {display_line(str(schema), 80)}")
    name = fn["name"]
    if not _NAME.match(name):
        raise ProgramRejected(f"tool name {display_line(name, 80)!r} is not an identifier of at most 64 characters")
    parameters = fn.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ProgramRejected(f"tool {name}: parameters is not an object")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise ProgramRejected(f"tool {name}: parameters.properties is not an object")
    if len(properties) > MAX_PARAMS:
        raise ProgramRejected(f"tool {name}: {len(properties)} parameters, more than {MAX_PARAMS}")
    params = []
    for key, spec in properties.items():
        if not _NAME.match(key):
            raise ProgramRejected(f"tool {name}: parameter {display_line(key, 80)!r} is not an identifier")
        if not isinstance(spec, dict):
            raise ProgramRejected(f"tool {name}: parameter {key} is not an object")
        kind = spec.get("type", "string")
        params.append((key, kind if isinstance(kind, str) else "any"))
    required = parameters.get("required", [])
    required = [] if required is None else required
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ProgramRejected(f"tool {name}: parameters.required is not a list of strings")
    return Tool(name, tuple(params), tuple(required))
