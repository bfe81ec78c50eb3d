"""``SandboxPool``: the trainer-side client of a sandbox host process.

The pool never runs environment code itself: it starts ``python -m spade_jax.sandbox.host``
(JAX-free, scrubbed environment, own session) and sends it batched requests. Every call
returns per-episode results in the order asked; failures of one episode are reported in
its result and never raise. Not thread-safe: use one pool per thread (or process).

    with SandboxPool(SandboxConfig(num_workers=4)) as pool:
        print(pool.isolation)
        first = pool.start([EpisodeSpec(program=src, seed=s, max_turns=8) for s in range(16)])
        ids = [r.episode_id for r in first]
        results = pool.step(ids, actions)
        pool.close(ids)
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import select
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Sequence

import spade_jax
from spade_jax.sandbox.isolation import IsolationUnavailable
from spade_jax.sandbox.protocol import HEADER_BYTES, ProtocolError, decode_payload, encode_frame, write_all
from spade_jax.sandbox.records import EpisodeSpec, IsolationReport, SandboxConfig, SolutionResult, StepResult

_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_PASSTHROUGH = ("SPADE_SANDBOX_NO_NAMESPACES",)
_REPLY_MARGIN_S = 30.0


class SandboxError(RuntimeError):
    """The sandbox host itself failed (exited, hung or answered nonsense); the pool is unusable."""


class _NamespaceSetupFailed(SandboxError):
    """The host entered namespaces but could not build its private root."""


def host_environment() -> dict[str, str]:
    """The whole environment the host (and so every worker) starts with: no secrets from ours."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(spade_jax.__file__)))
    env = {"PYTHONPATH": package_root, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           "LANG": "C.UTF-8", "PATH": os.defpath}
    env.update({name: "1" for name in _THREAD_VARS})
    env.update({name: os.environ[name] for name in _PASSTHROUGH if name in os.environ})
    return env


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class SandboxPool:
    """Runs environment episodes in isolated worker processes behind one sandbox host."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self._next_id = 0
        try:
            self.isolation = self._start_host(self.config)
        except _NamespaceSetupFailed as err:
            # the probe passed but building the private root did not: "auto" accepts process limits
            self.isolation = self._start_host(dataclasses.replace(self.config, isolation="rlimits"))
            self.isolation = dataclasses.replace(self.isolation, notes=(
                f"namespaces were granted but setting them up failed ({err}); using process limits only",))
        if not self.isolation.full:
            warnings.warn(f"sandbox isolation is reduced: {'; '.join(self.isolation.notes)}", RuntimeWarning,
                          stacklevel=2)

    def _start_host(self, config: SandboxConfig) -> IsolationReport:
        self._closed = False
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "spade_jax.sandbox.host"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=host_environment(), cwd="/", close_fds=True, start_new_session=True)
        self._finalizer = weakref.finalize(self, _terminate, self._proc)
        self._wfd, self._rfd = self._proc.stdin.fileno(), self._proc.stdout.fileno()
        try:
            write_all(self._wfd, encode_frame(config.to_dict()))
            hello = self._read(time.monotonic() + config.host_start_timeout_s)
        except BaseException:
            self._shutdown_host()
            raise
        if not hello.get("ok"):
            self._shutdown_host()
            error = hello.get("error", "the sandbox host failed to start")
            if hello.get("kind") == "isolation":
                raise IsolationUnavailable(error)
            if hello.get("kind") == "setup" and config.isolation == "auto":
                raise _NamespaceSetupFailed(error)
            raise SandboxError(error)
        return IsolationReport.from_dict(hello["isolation"])

    # --- public API --------------------------------------------------------------------------

    @property
    def host_pid(self) -> int:
        """Process id of the host (the outermost process of this pool's tree)."""
        return self._proc.pid

    def start(self, specs: Sequence[EpisodeSpec]) -> list[StepResult]:
        """Starts one episode per spec (fork, load, instantiate, reset), concurrently.

        Each result carries the new ``episode_id`` and the reset observation and info;
        on failure ``error`` (and ``timed_out``) is set and the episode is not live.
        ``close`` every id you get back, failed ones included (the host keeps a small
        record of each until then).
        """
        if not specs:
            return []
        programs, episodes = {}, []
        for spec in specs:
            if not isinstance(spec, EpisodeSpec):
                raise TypeError(f"start() takes EpisodeSpec objects, got {type(spec).__name__}")
            digest = hashlib.sha256(spec.program.encode("utf-8", "surrogatepass")).hexdigest()
            programs[digest] = spec.program
            episodes.append({"id": self._next_id, "program": digest, "seed": spec.seed,
                             "max_turns": spec.max_turns, "turn_limit": spec.turn_limit,
                             "env_kwargs": spec.env_kwargs})
            self._next_id += 1
        budget = self.config.load_timeout_s + self.config.call_timeout_s
        reply = self._request({"op": "start", "programs": programs, "episodes": episodes}, len(specs), budget)
        return [StepResult.from_dict(r) for r in reply["results"]]

    def step(self, episode_ids: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
        """Steps each episode with its action, concurrently; results in the order asked."""
        ids = _ids(episode_ids)
        if len(actions) != len(ids):
            raise ValueError(f"step() got {len(ids)} episode ids but {len(actions)} actions")
        if not ids:
            return []
        reply = self._request({"op": "step", "ids": ids, "actions": list(actions)}, len(ids),
                              self.config.call_timeout_s)
        return [StepResult.from_dict(r) for r in reply["results"]]

    def solution_results(self, episode_ids: Sequence[int]) -> list[SolutionResult]:
        """Calls ``solution()`` on each episode's env; errors and timeouts are in the results."""
        ids = _ids(episode_ids)
        if not ids:
            return []
        reply = self._request({"op": "solution", "ids": ids}, len(ids), self.config.call_timeout_s)
        return [SolutionResult.from_dict(r) for r in reply["results"]]

    def solution(self, episode_ids: Sequence[int]) -> list[str | None]:
        """Reference action sequences (one action per line); None where unavailable (see solution_results)."""
        return [r.solution for r in self.solution_results(episode_ids)]

    def close(self, episode_ids: Sequence[int]) -> None:
        """Ends episodes: their workers are killed and reaped, their ids forgotten."""
        ids = _ids(episode_ids)
        if ids:
            self._request({"op": "close", "ids": ids}, 1, 1.0)

    def output(self, episode_ids: Sequence[int]) -> list[str]:
        """What each episode's env printed since the last call (the last 16 KiB at most)."""
        ids = _ids(episode_ids)
        if not ids:
            return []
        return self._request({"op": "output", "ids": ids}, 1, 1.0)["outputs"]

    def stats(self) -> dict:
        """Live worker count, episode records held and fds registered by the host."""
        reply = self._request({"op": "stats"}, 1, 1.0)
        return {k: reply[k] for k in ("live", "records", "registered_fds")}

    def close_all(self) -> None:
        """Kills every episode and stops the host. Idempotent."""
        if self._closed:
            return
        try:
            if self._proc.poll() is None:
                self._request({"op": "shutdown"}, 1, 5.0)
        except SandboxError:
            pass
        self._shutdown_host()

    shutdown = close_all

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close_all()

    # --- host channel ------------------------------------------------------------------------

    def _request(self, message: dict, calls: int, per_call_s: float) -> dict:
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        waves = math.ceil(calls / self.config.num_workers)
        deadline = time.monotonic() + waves * (per_call_s + 0.5) + _REPLY_MARGIN_S
        try:
            write_all(self._wfd, encode_frame(message))
            reply = self._read(deadline)
        except (OSError, EOFError, ProtocolError) as err:
            self._shutdown_host()
            raise SandboxError(f"lost the sandbox host ({type(err).__name__}: {err}); "
                               f"exit code {self._proc.poll()}") from None
        if not reply.get("ok"):
            raise SandboxError(reply.get("error", "the sandbox host refused the request"))
        return reply

    def _read(self, deadline: float) -> dict:
        header = self._read_exact(HEADER_BYTES, deadline)
        return decode_payload(self._read_exact(int.from_bytes(header, "big"), deadline))

    def _read_exact(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        while left:
            timeout = deadline - time.monotonic()
            if timeout <= 0 or not select.select([self._rfd], [], [], timeout)[0]:
                self._shutdown_host()
                raise SandboxError("the sandbox host did not answer in time; it was killed")
            chunk = os.read(self._rfd, min(left, 1 << 20))
            if not chunk:
                raise EOFError("the sandbox host closed its channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _shutdown_host(self) -> None:
        self._closed = True
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._finalizer()


def _ids(episode_ids: Sequence[int]) -> list[int]:
    ids = list(episode_ids)
    for eid in ids:
        if isinstance(eid, bool) or not isinstance(eid, int):
            raise TypeError(f"episode ids are ints, got {eid!r}")
    return ids
