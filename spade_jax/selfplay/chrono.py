"""The loop's two small clocks: when a periodic job is due, and how long each phase took."""

from __future__ import annotations

import contextlib
import time

from spade_jax import compile_cache


def itstime(step: int, every: int, *, last: bool = False) -> bool:
    """Whether a job run every `every` steps (0: never) is due at `step`; `last` also makes it due."""
    return every > 0 and (step % every == 0 or last)


class Chrono:
    """One iteration's `time/*` values: wall-clock seconds per named phase (`"<name>_s"`),
    counters that vary with the machine (`record`), none of which a resumed run repeats, and
    the programs the iteration got from XLA (`compile_cache.counts`): `programs_compiled`,
    `programs_cached` (loaded from the persistent cache) and `compile_s` (both kinds)."""

    def __init__(self):
        self.values: dict[str, float] = {}
        self._start = time.perf_counter()
        self._compiles = compile_cache.counts()

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.values[f"{name}_s"] = self.values.get(f"{name}_s", 0.0) + time.perf_counter() - start

    def record(self, name: str, value: float) -> None:
        self.values[name] = value

    def seconds(self, *names: str) -> float:
        """The summed seconds of the named phases (0 for a phase that did not run)."""
        return sum(self.values.get(f"{n}_s", 0.0) for n in names)

    def metrics(self) -> dict[str, float]:
        """Every value under `time/`, with the whole iteration's seconds as `time/iteration_s`."""
        compiles = compile_cache.counts().since(self._compiles)
        values = {**self.values, "programs_compiled": compiles.compiled, "programs_cached": compiles.cache_hits,
                  "compile_s": compiles.seconds, "iteration_s": time.perf_counter() - self._start}
        return {f"time/{k}": v for k, v in values.items()}
