"""A persistent XLA compilation cache, and counts of how each process got its programs.

JAX keys a program by its HLO, shapes, shardings, devices, compile options and the jax/XLA
versions. With the cache on, a resumed or repeated run (the main job, `spade_jax.evals`,
`spade_jax.serve`, `spade_jax.related.trajectories`) loads every program an earlier process compiled
instead of compiling it again: the engine's bucketed programs, the update, the evaluation
sampler. Every program is written, however fast it compiled (`min_compile_time_secs` 0): the
engine's many small programs are most of a `tiny` run's compile seconds.

`counts()` is a running tally of this process's executable requests (compiled or loaded from
the cache) from JAX's monitoring events; `selfplay.chrono.Chrono` reports one iteration's share.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import jax
from jax import monitoring

OFF = "none"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # a compile, or a load from the cache
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass(frozen=True)
class CompileCounts:
    """Executables a process asked XLA for: `programs` of them, `seconds` spent getting them,
    `cache_hits` of them loaded from the persistent cache rather than compiled."""

    programs: int = 0
    seconds: float = 0.0
    cache_hits: int = 0

    @property
    def compiled(self) -> int:
        return self.programs - self.cache_hits

    def since(self, earlier: "CompileCounts") -> "CompileCounts":
        return CompileCounts(self.programs - earlier.programs, self.seconds - earlier.seconds,
                             self.cache_hits - earlier.cache_hits)


_lock = threading.Lock()
_tally = CompileCounts()


def _on_duration(event: str, seconds: float, **_) -> None:
    global _tally
    if event == _COMPILE_EVENT:
        with _lock:
            _tally = dataclasses.replace(_tally, programs=_tally.programs + 1, seconds=_tally.seconds + seconds)


def _on_event(event: str, **_) -> None:
    global _tally
    if event == _HIT_EVENT:
        with _lock:
            _tally = dataclasses.replace(_tally, cache_hits=_tally.cache_hits + 1)


monitoring.register_event_duration_secs_listener(_on_duration)
monitoring.register_event_listener(_on_event)


def counts() -> CompileCounts:
    """This process's executable requests so far."""
    with _lock:
        return _tally


def cache_dir(setting: str, workdir: str | os.PathLike | None) -> Path | None:
    """Where config field `compile_cache_dir` puts the cache: "none" = off; a path = there (one
    cache several runs and entry points share); "" = the directory JAX was given already
    (`JAX_COMPILATION_CACHE_DIR`, as `tests/run.sh` sets for every test process), else
    `<workdir>/xla_cache`, else (no workdir) off."""
    if setting == OFF:
        return None
    if setting:
        return Path(os.path.expanduser(setting))
    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    return Path(workdir) / "xla_cache" if workdir else None


def enable(directory: str | os.PathLike) -> Path:
    """Turns the persistent cache on at `directory` for every program this process compiles.

    Call it before the process's first compile: JAX decides once per process whether to use
    the cache, at its first compile."""
    path = Path(directory).expanduser().absolute()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return path
