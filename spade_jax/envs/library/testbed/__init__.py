"""The testbed families: environment programs a small model trained from scratch can learn.

Each program follows the environment contract (``spade_jax/envs/contract.py``) in the seed
library's style and has ONE difficulty knob (a length, a range, a count) whose value is the
family's difficulty: the `testbed` preset's bootstrap teaches its ``trained`` values, most
transcripts at the easy end, so the initial agent's win rate falls across them; the
``allowed`` values beyond ``trained`` score what it was never shown. The knob is a module-level
UPPERCASE constant (``library.render``'s form) and ``DIFFICULTY_LEVELS``/``LEVELS`` map the
contract's easy/medium/hard to values inside ``trained``.

A registry of its own, not `library.SEED_ENVS`: the seed library is every preset's iteration-0
memory, the `tiny` preset's held-out evaluation (every seed program it does not train on) and,
by its sources, the `tiny` bootstrap's cache key; adding these programs there would change all
three. Standard library only (sandbox workers may import it).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import pathlib
import re


@dataclasses.dataclass(frozen=True)
class TestbedEnv:
    """One testbed program: its skill (one of `library.SKILLS`), its knob, the values the knob
    may take (``allowed``) and those the testbed bootstrap teaches (``trained``, a prefix of them)."""

    __test__ = False  # not a pytest test class

    name: str
    skill: str
    filename: str
    description: str
    knob: str
    allowed: tuple[int, ...] = dataclasses.field(hash=False, repr=False)
    trained: tuple[int, ...] = dataclasses.field(hash=False, repr=False)
    kind: str = "game"

    @property
    def knobs(self) -> dict[str, tuple[int, ...]]:
        """``{knob: allowed values}``, the seed registry's form (`bootstrap.data.knobs_for` reads it)."""
        return {self.knob: self.allowed}


def _span(low: int, high: int) -> tuple[int, ...]:
    return tuple(range(low, high + 1))


TESTBED_ENVS: tuple[TestbedEnv, ...] = (
    TestbedEnv("bisect", "logical deduction", "bisect.py",
               "find a hidden number; each wrong guess is answered with the range still possible",
               "RANGE", (6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256), (6, 8, 12, 16, 24, 32, 48, 64, 96, 128)),
    TestbedEnv("code_lock", "logical deduction", "code_lock.py",
               "find a code of digits 1-4; each try is told which digits are right",
               "LENGTH", _span(2, 10), _span(2, 8)),
    TestbedEnv("sort_list", "optimization", "sort_list.py",
               "write a list of two-digit numbers from smallest to largest",
               "LENGTH", _span(2, 14), _span(2, 12)),
    TestbedEnv("carry_add", "mathematical reasoning", "carry_add.py",
               "add two numbers one column per turn, ones first, carrying",
               "DIGITS", _span(1, 10), _span(1, 8)),
    TestbedEnv("letter_count", "pattern recognition", "letter_count.py",
               "count how often a letter appears in a row of letters p-s",
               "LENGTH", (3, 4, 6, 8, 10, 12, 16, 20, 24, 30, 36, 42), (3, 4, 6, 8, 10, 12, 16, 20, 24, 30)),
)

_BY_NAME = {env.name: env for env in TESTBED_ENVS}
SKILLS: tuple[str, ...] = tuple(dict.fromkeys(env.skill for env in TESTBED_ENVS))


def get(name: str) -> TestbedEnv:
    """The registry entry called ``name``."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown testbed family {name!r}; known: {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def load_source(name: str) -> str:
    """The program text of ``name`` with its default knob value."""
    return importlib.resources.files(__name__).joinpath(get(name).filename).read_text(encoding="utf-8")


def source_path(name: str) -> pathlib.Path:
    """The file holding ``name``'s program."""
    return pathlib.Path(__file__).with_name(get(name).filename)


def default_knob(name: str) -> int:
    """The knob value written in the program file."""
    env = get(name)
    return int(_knob_line(env.knob).search(load_source(name)).group(2))


def level_values(name: str) -> dict[str, int]:
    """``{level: knob value}`` of the program's ``LEVELS`` table."""
    match = re.search(r"^LEVELS = (\{.*\})$", load_source(name), re.MULTILINE)
    return {level: int(value) for level, value in re.findall(r'"(\w+)": (\d+)', match.group(1))}


def render(name: str, value: int | None = None) -> str:
    """The program text of ``name`` with its knob set to ``value`` (None: the default), validated."""
    env = get(name)
    source = load_source(name)
    if value is None:
        return source
    if type(value) is not int or value not in env.allowed:
        raise ValueError(f"{name}.{env.knob} must be an int in {env.allowed[0]}..{env.allowed[-1]}, got {value!r}")
    return _knob_line(env.knob).sub(lambda match: f"{match.group(1)}{value}", source, count=1)


def knob_setting(code: str) -> tuple[str, int] | None:
    """(family, knob value) of a program written as a testbed family (a rendering, or a designer's
    variant that keeps the family's class name and knob constant); None for anything else."""
    for env in TESTBED_ENVS:
        class_name = "".join(part.title() for part in env.name.split("_")) + "Env"
        match = _knob_line(env.knob).search(code)
        if match and re.search(rf"^class {class_name}\b", code, re.MULTILINE):
            return env.name, int(match.group(2))
    return None


def _knob_line(knob: str) -> re.Pattern:
    return re.compile(rf"^({knob} = )(-?\d+)", re.MULTILINE)


__all__ = ["SKILLS", "TESTBED_ENVS", "TestbedEnv", "default_knob", "get", "knob_setting", "level_values",
           "load_source", "render", "source_path"]
