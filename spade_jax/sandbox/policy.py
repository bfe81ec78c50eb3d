"""The static part of admission: pull the program out of model text, apply the import policy
and read the difficulty levels it declares (``difficulty_levels``).

Also the single source of truth for which modules an environment program may import;
sandbox workers enforce the same list at run time (see ``worker.guarded_builtins``).
Runs on the trusted side on untrusted text: it only parses, never compiles or runs.
Standard library only.
"""

from __future__ import annotations

import ast
import re

# Standard-library modules that make sense for environments, plus numpy.
ALLOWED_MODULES: frozenset[str] = frozenset({
    "__future__", "abc", "array", "bisect", "calendar", "cmath", "collections", "copy",
    "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools",
    "hashlib", "heapq", "itertools", "json", "math", "numbers", "numpy", "operator",
    "pprint", "random", "re", "statistics", "string", "struct", "textwrap", "typing",
    "unicodedata",
})
# numpy submodules that reach outside the process or load native code.
DENIED_SUBMODULES: frozenset[str] = frozenset({
    "numpy.ctypeslib", "numpy.distutils", "numpy.f2py", "numpy.testing", "numpy.lib.format",
})
# spade_jax modules an environment may import (the contract helpers and ToolUseEnv).
ENV_PACKAGE_MODULES: frozenset[str] = frozenset({
    "spade_jax", "spade_jax.envs", "spade_jax.envs.contract", "spade_jax.envs.tool_use",
})
# Built-in names and attributes an environment has no use for but a sandbox escape does.
FORBIDDEN_NAMES: frozenset[str] = frozenset({
    "__import__", "__builtins__", "__subclasses__", "__globals__", "__code__",
    "breakpoint", "exit", "input", "open", "quit",
})

# The optional difficulty knob: a class attribute of the *Env class, a literal tuple of level names.
DIFFICULTY_ATTRIBUTE = "DIFFICULTY_LEVELS"
MAX_DIFFICULTY_LEVELS = 8
_LEVEL_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_ENV_CLASS = re.compile(r"^\s*class\s+\w*Env\b", re.MULTILINE)


class PolicyError(ValueError):
    """The program text fails the parse stage; the message says why."""


def import_refusal(module: str) -> str | None:
    """Why importing ``module`` is refused, or None when it is allowed."""
    if module in ENV_PACKAGE_MODULES:
        return None
    root = module.split(".", 1)[0]
    if root not in ALLOWED_MODULES:
        return f"import of {module!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
    if any(module == d or module.startswith(d + ".") for d in DENIED_SUBMODULES):
        return f"import of {module!r} is not allowed (numpy submodule outside the sandbox policy)"
    return None


def extract_code(text: str) -> str:
    """The program in a model's reply: the fenced block defining a ``*Env`` class, else the whole text.

    Among fenced blocks (```python, ```py or bare ```), the last one that defines a class
    ending in ``Env`` wins; failing that the last python-tagged block; an unclosed fence
    runs to the end of the text (truncated generations then fail to parse with a clear error).
    """
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    code_blocks = [body for lang, body in blocks if lang in ("python", "py", "python3", "")]
    with_env = [body for body in code_blocks if _ENV_CLASS.search(body)]
    if with_env:
        return with_env[-1].strip("\n") + "\n"
    if code_blocks:
        return code_blocks[-1].strip("\n") + "\n"
    return text


def check_program(code: str, max_chars: int = 100_000,
                  forbidden_names: frozenset[str] = FORBIDDEN_NAMES) -> ast.Module:
    """Parses ``code`` and applies the import and name policy; raises PolicyError with the reason."""
    if not code.strip():
        raise PolicyError("no program text")
    if len(code) > max_chars:
        raise PolicyError(f"program has {len(code)} characters, more than the limit {max_chars}")
    try:
        tree = ast.parse(code, filename="<env>")
    except SyntaxError as err:
        raise PolicyError(f"syntax error at line {err.lineno}: {err.msg}") from None
    except (ValueError, MemoryError, RecursionError) as err:
        raise PolicyError(f"cannot parse program: {type(err).__name__}: {err}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _refuse_import(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise PolicyError(f"line {node.lineno}: relative imports are not allowed")
            _refuse_import(node.module or "", node)
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in DENIED_SUBMODULES:
                    _refuse_import(full, node)
        elif isinstance(node, ast.Name) and node.id in forbidden_names:
            raise PolicyError(f"line {node.lineno}: use of {node.id!r} is not allowed")
        elif isinstance(node, ast.Attribute) and node.attr in forbidden_names:
            raise PolicyError(f"line {node.lineno}: use of attribute {node.attr!r} is not allowed")
    return tree


def _refuse_import(module: str, node: ast.AST) -> None:
    reason = import_refusal(module)
    if reason:
        raise PolicyError(f"line {node.lineno}: {reason}")


def difficulty_levels(program: str | ast.Module) -> tuple[str, ...]:
    """The levels the ``*Env`` class declares in ``DIFFICULTY_LEVELS`` (easiest first), () if none.

    Read from the syntax tree only (never executed): the value must be a literal tuple of
    1..MAX_DIFFICULTY_LEVELS distinct short names (letters, digits, ``_``, ``-``; at most 32
    characters); anything else raises PolicyError saying why.
    """
    tree = program if isinstance(program, ast.Module) else _parse(program)
    env = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Env")), None)
    declared = [node for node in (env.body if env else ())
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == DIFFICULTY_ATTRIBUTE
                                                        for t in node.targets)]
    if not declared:
        return ()
    node = declared[-1]
    where = f"line {node.lineno}: {DIFFICULTY_ATTRIBUTE}"
    if not isinstance(node.value, ast.Tuple):
        raise PolicyError(f"{where} must be a literal tuple of level names, e.g. (\"easy\", \"medium\", \"hard\")")
    levels = []
    for item in node.value.elts:
        if not (isinstance(item, ast.Constant) and isinstance(item.value, str) and _LEVEL_NAME.fullmatch(item.value)):
            raise PolicyError(f"{where} holds {ast.unparse(item)[:40]!r}: each level must be a string literal of "
                              "1-32 letters, digits, '_' or '-'")
        levels.append(item.value)
    if not 1 <= len(levels) <= MAX_DIFFICULTY_LEVELS or len(set(levels)) != len(levels):
        raise PolicyError(f"{where} must name 1..{MAX_DIFFICULTY_LEVELS} distinct levels, got {tuple(levels)}")
    return tuple(levels)


def _parse(code: str) -> ast.Module:
    try:
        return ast.parse(code, filename="<env>")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        raise PolicyError(f"cannot parse program: {type(err).__name__}: {err}") from None
