"""Bounds on what a benchmark suite does in the trainer's process with a model's reply, and
reply budgets fitted to the model's context.

Suites whose benchmark code runs here (BFCL's backends, ACEBench's simulated APIs) execute
calls decoded from sampled text. A policy trained by RL finds any call that is expensive or
that changes the process, so every such call passes three guards:

* a static cost model, checked before anything runs: arguments are literals (never code),
  their total size is bounded with shared sub-lists counted every time they occur
  (`literal_size`: ``[[0]*10**4]*10**4`` is 10^8, not 2), and each suite bounds the values
  that set a backend's precision or size (`numeric_magnitude` reads them as the backend
  would: ints, floats, and strings or bytes that ``int()``/``float()`` accept). A call that
  breaks a bound is refused whole, with a reason, and nothing runs;
* `numeric_state_kept` around every execution: mpmath's working precision and the calling
  thread's ``decimal`` context are restored, whatever the backend set (BFCL's ``logarithm``
  sets ``mpmath.mp.dps``, its ``square_root`` the decimal context's ``prec``);
* `WorkBudget`: the seconds one item's calls took, summed over its episode; once spent, the
  episode ends as failed with the reason, before the next reply runs.

Why bounds before execution rather than a worker process with rlimits: a Python thread
cannot be stopped, so a hard per-call limit needs a process; the backends keep state across
the steps of an episode and the checker replays it, so they would all move into that process
with every reply and result crossing a pipe, and a call over its limit would cost the whole
worker (every episode it holds) a restart. The backends are the benchmarks' own code and
their costs are functions of their arguments, which the static model bounds; what it cannot
see (a backend whose cost does not follow from its arguments' sizes) is what `WorkBudget`
catches after the fact. It does not interrupt a call in progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import decimal
import math
import sys
import time
from typing import Iterator, Sequence

BUDGET_EXCEEDED = "work budget exceeded"  # how the reason of an item stopped by its WorkBudget begins
MAX_LITERAL_SIZE = 100_000  # elements and characters of the arguments of one reply, repetitions expanded
ITEM_WORK_S = 60.0  # seconds of in-process execution one item's calls may take, summed over its episode


def literal_size(value, limit: int = MAX_LITERAL_SIZE) -> int:
    """How large ``value`` is when written out: 1 per scalar, its length per string or bytes,
    1 plus its items per container (dict keys and values), a container that occurs several
    times counted each time. Stops counting once past ``limit`` (the result is then > limit),
    so a value built to be huge costs no more than ``limit`` steps to measure."""
    seen: dict[int, int] = {}

    def size(v, budget: int) -> int:
        if isinstance(v, (str, bytes)):
            return max(1, len(v))
        if not isinstance(v, (list, tuple, set, frozenset, dict)):
            return 1
        known = seen.get(id(v))
        if known is not None:
            return known
        total = 1
        for item in (x for kv in v.items() for x in kv) if isinstance(v, dict) else v:
            total += size(item, budget - total)
            if total > budget:
                return total  # not memoised: a partial count
        seen[id(v)] = total
        return total

    return size(value, limit)


def numeric_magnitude(value) -> float | None:
    """The size of the number a backend would read from ``value`` (``abs``; ``inf`` past what a
    float holds, ``nan`` for what ``float()`` reads as such), or None when it is no number:
    booleans, ints and floats as they are; strings and bytes as ``int()`` reads them, else as
    ``float()`` does (``'20000'``, ``b'20000'``, ``' 2_0000 '`` and ``'2e4'`` are all 20000)."""
    if isinstance(value, (str, bytes)):
        for read in (int, float):
            try:
                return _magnitude(read(value))
            except (ValueError, OverflowError):
                continue
        return None
    if isinstance(value, (bool, int, float)):
        return _magnitude(value)
    return None


def _magnitude(number: int | float) -> float:
    if isinstance(number, float):
        return abs(number)
    return math.inf if int(number).bit_length() > 1000 else float(abs(int(number)))


def within(value, cap: float) -> bool:
    """Whether the number a backend reads from ``value`` is at most ``cap`` in size (what is no
    number passes: the backend rejects it itself)."""
    magnitude = numeric_magnitude(value)
    return magnitude is None or magnitude <= cap


@contextlib.contextmanager
def numeric_state_kept() -> Iterator[None]:
    """Runs the body with mpmath's precision and this thread's decimal context as they were
    restored afterwards (the body gets a copy of the decimal context to change)."""
    mpmath = sys.modules.get("mpmath")
    saved = (mpmath.mp.prec, mpmath.mp.pretty) if mpmath is not None else None
    try:
        with decimal.localcontext():
            yield
    finally:
        mpmath = sys.modules.get("mpmath")
        if mpmath is not None:
            mpmath.mp.prec, mpmath.mp.pretty = saved if saved is not None else (53, False)


@dataclasses.dataclass
class WorkBudget:
    """Seconds of in-process execution one item may spend. ``with budget.charge():`` runs a piece
    of the item's execution, timed and under `numeric_state_kept`."""

    seconds: float = ITEM_WORK_S
    spent: float = 0.0

    @contextlib.contextmanager
    def charge(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with numeric_state_kept():
                yield
        finally:
            self.spent += time.perf_counter() - started

    @property
    def exhausted(self) -> bool:
        return self.spent > self.seconds

    @property
    def reason(self) -> str:
        return f"{BUDGET_EXCEEDED}: its calls took {self.spent:.1f} s of execution, over the item's {self.seconds:g} s"



def reply_budgets(prompt_lengths: Sequence[int], requested: int, max_positions: int) -> list[int]:
    """Each prompt's reply budget: ``requested`` tokens, or the room its prompt leaves in the
    model's ``max_positions`` when that is less (0: no room at all)."""
    return [max(0, min(requested, max_positions - length)) for length in prompt_lengths]


@dataclasses.dataclass
class BudgetRecord:
    """Reply budgets fitted to the model, as a suite's summary records them: the requested
    budget, the smallest one used, how many replies were clamped below it and how many prompts
    left no room (those items failed unanswered)."""

    requested: int
    max_positions: int | None  # None: the policy declares no context, budgets are as requested
    used_min: int | None = None
    clamped: int = 0
    no_room: int = 0

    def add(self, budgets: Sequence[int]) -> None:
        for budget in budgets:
            if budget < 1:
                self.no_room += 1
                continue
            self.clamped += budget < self.requested
            self.used_min = budget if self.used_min is None else min(self.used_min, budget)

    def summary(self) -> dict:
        return {"requested": self.requested, "used_min": self.used_min, "clamped": self.clamped,
                "no_room": self.no_room, "max_positions": self.max_positions}
