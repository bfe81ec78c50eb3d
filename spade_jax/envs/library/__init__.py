"""The seed environment library: handwritten environment programs with difficulty knobs.

Each program is a standalone module in this package (one ``*Env`` class) following
the contract in ``spade_jax/envs/contract.py``. They seed the environment memory at
iteration 0, are the training material for the bootstrapped tiny model, and serve
as examples in designer prompts. Knobs are module-level UPPERCASE constants; the
registry lists the values each one may take and ``render`` rewrites them.

Standard library only (no jax): sandbox workers and the designer import this.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import pathlib
import re

SKILLS: tuple[str, ...] = (
    "mathematical reasoning",
    "logical deduction",
    "spatial reasoning",
    "pattern recognition",
    "optimization",
    "causal inference",
)


@dataclasses.dataclass(frozen=True)
class SeedEnv:
    """One library program: its skill, contract kind ('game' or 'tool_use') and knob ranges."""

    name: str
    skill: str
    kind: str
    filename: str
    description: str
    knobs: dict[str, tuple[int, ...]] = dataclasses.field(hash=False, repr=False)


def _span(low: int, high: int) -> tuple[int, ...]:
    return tuple(range(low, high + 1))


SEED_ENVS: tuple[SeedEnv, ...] = (
    SeedEnv("arithmetic", "mathematical reasoning", "game", "arithmetic.py",
            "evaluate a short integer expression with operator precedence",
            {"NUM_OPERANDS": _span(2, 4), "MAX_OPERAND": _span(5, 99)}),
    SeedEnv("shopping", "mathematical reasoning", "tool_use", "shopping.py",
            "look up unit prices with a tool and total a shopping list",
            {"NUM_ITEMS": _span(1, 5), "MAX_PRICE": _span(5, 50), "MAX_QUANTITY": _span(1, 4)}),
    SeedEnv("number_guess", "logical deduction", "game", "number_guess.py",
            "find a secret number from too-high/too-low feedback (binary search)",
            {"MAX_NUMBER": _span(4, 1000)}),
    SeedEnv("knights_knaves", "logical deduction", "game", "knights_knaves.py",
            "deduce who always tells the truth from statements with a unique consistent reading",
            {"NUM_PEOPLE": _span(2, 4)}),
    SeedEnv("tallest", "logical deduction", "tool_use", "tallest.py",
            "find the tallest person using only pairwise comparisons",
            {"NUM_PEOPLE": _span(3, 8)}),
    SeedEnv("grid_walk", "spatial reasoning", "game", "grid_walk.py",
            "walk a text grid around walls to the goal, one move per turn",
            {"GRID_SIZE": _span(3, 8), "NUM_WALLS": _span(0, 6)}),
    SeedEnv("compass_walk", "spatial reasoning", "game", "compass_walk.py",
            "track position and heading through walking directions",
            {"NUM_MOVES": _span(1, 8), "MAX_STEP": _span(1, 9), "RELATIVE": _span(0, 1)}),
    SeedEnv("nearest_city", "spatial reasoning", "tool_use", "nearest_city.py",
            "locate cities with a tool and pick the one nearest home by Manhattan distance",
            {"NUM_CITIES": _span(2, 6), "MAP_SIZE": _span(5, 50)}),
    SeedEnv("sequence", "pattern recognition", "game", "sequence.py",
            "infer an arithmetic, geometric, growing-step or Fibonacci-like rule and extend it",
            {"SHOWN_TERMS": _span(4, 8), "NUM_KINDS": _span(1, 4)}),
    SeedEnv("repeat_pattern", "pattern recognition", "game", "repeat_pattern.py",
            "continue a repeating block of letters",
            {"PERIOD": _span(2, 5), "NUM_SYMBOLS": _span(2, 6), "ANSWER_LENGTH": _span(1, 4)}),
    SeedEnv("hidden_rule", "pattern recognition", "tool_use", "hidden_rule.py",
            "probe a hidden linear or quadratic rule on small inputs and extrapolate",
            {"MAX_COEFF": _span(2, 9), "NUM_KINDS": _span(1, 2)}),
    SeedEnv("knapsack", "optimization", "game", "knapsack.py",
            "choose the most valuable set of items under a weight limit",
            {"NUM_ITEMS": _span(3, 7), "MAX_WEIGHT": _span(2, 9), "MAX_VALUE": _span(3, 20)}),
    SeedEnv("job_order", "optimization", "game", "job_order.py",
            "order jobs on one machine to minimise the (weighted) sum of finish times",
            {"NUM_JOBS": _span(2, 6), "MAX_DURATION": _span(2, 9), "WEIGHTED": _span(0, 1)}),
    SeedEnv("shortest_path", "optimization", "tool_use", "shortest_path.py",
            "explore a weighted road map with a tool and report the cheapest route cost",
            {"NUM_TOWNS": _span(3, 8), "MAX_COST": _span(2, 9), "EXTRA_ROADS": _span(0, 6)}),
    SeedEnv("switch_lights", "causal inference", "game", "switch_lights.py",
            "intervene on switches to identify which one controls each light",
            {"NUM_SWITCHES": _span(2, 6)}),
    SeedEnv("causal_chain", "causal inference", "game", "causal_chain.py",
            "propagate an intervention through single and joint cause-effect rules",
            {"NUM_EVENTS": _span(3, 8), "NUM_RULES": _span(2, 8), "JOINT_RULES": _span(0, 1)}),
    SeedEnv("plant_experiment", "causal inference", "tool_use", "plant_experiment.py",
            "run controlled growth trials with a tool to find the required factors",
            {"NUM_FACTORS": _span(2, 6), "NUM_CAUSES": _span(1, 2)}),
)

_BY_NAME = {env.name: env for env in SEED_ENVS}


def get(name: str) -> SeedEnv:
    """The registry entry called ``name``."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown seed environment {name!r}; known: {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def by_skill(skill: str) -> tuple[SeedEnv, ...]:
    """The seed environments that train ``skill`` (one of SKILLS)."""
    if skill not in SKILLS:
        raise ValueError(f"unknown skill {skill!r}; known: {', '.join(SKILLS)}")
    return tuple(env for env in SEED_ENVS if env.skill == skill)


def load_source(name: str) -> str:
    """The program text of ``name`` with its default knob values."""
    return importlib.resources.files(__name__).joinpath(get(name).filename).read_text(encoding="utf-8")


def source_path(name: str) -> pathlib.Path:
    """The file holding ``name``'s program (for tools that take paths, like the `envs` suite)."""
    return pathlib.Path(__file__).with_name(get(name).filename)


def default_knobs(name: str) -> dict[str, int]:
    """The knob values written in the program file."""
    source = load_source(name)
    return {knob: int(_knob_line(knob).search(source).group(2)) for knob in get(name).knobs}


def render(name: str, knobs: dict[str, int] | None = None) -> str:
    """The program text of ``name`` with the given knob constants substituted (others keep defaults)."""
    env = get(name)
    source = load_source(name)
    for knob, value in (knobs or {}).items():
        if knob not in env.knobs:
            raise ValueError(f"{name} has no knob {knob!r}; knobs: {', '.join(env.knobs)}")
        allowed = env.knobs[knob]
        if type(value) is not int or value not in allowed:
            raise ValueError(f"{name}.{knob} must be an int in {allowed[0]}..{allowed[-1]}, got {value!r}")
        source = _knob_line(knob).sub(lambda match: f"{match.group(1)}{value}", source, count=1)
    return source


def _knob_line(knob: str) -> re.Pattern:
    return re.compile(rf"^({knob} = )(-?\d+)", re.MULTILINE)


__all__ = ["SEED_ENVS", "SKILLS", "SeedEnv", "by_skill", "default_knobs", "get", "load_source", "render",
           "source_path"]
