"""A run's life around its iterations: resume, the metric and environment logs, checkpoints on
cadence, a clean stop on SIGTERM or at the agent-token budget, and the state digest.

The run it drives (`selfplay.loop.SelfPlay`) offers `iteration(it)`, its `state` (iteration
counter and metric history), its `trainer`, and `saved()`: every stateful piece by checkpoint
key, with how to read it and how to put it back. One checkpoint holds the trainer's arrays and
those pieces as JSON, so a resumed run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading

import jax

from spade_jax.selfplay.checkpoint import Checkpointer
from spade_jax.selfplay.chrono import itstime
from spade_jax.selfplay.console import summary_line
from spade_jax.selfplay.gallery import write_gallery
from spade_jax.selfplay.runlog import EnvLog, MetricsWriter
from spade_jax.selfplay.state import OldCheckpointError


class Preempted(Exception):
    """Raised between phases after SIGTERM; the run saves and exits cleanly."""


class Lifecycle:
    def __init__(self, run, config, workdir: str, main: bool):
        self.run, self.config, self.workdir, self.main = run, config, workdir, main
        self.checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep,
                                         async_save=config.checkpoint.async_save)
        self.preempted = False
        self._saved_step: int | None = None
        self.total: int | None = None  # the iteration count `run_to_end` runs to

    def run_to_end(self, total: int) -> list[dict]:
        """Runs (or resumes) until `total` iterations, or until the agent has generated
        `agent_token_budget` tokens when that is set; returns the metric history."""
        self.total = total
        resumed = self.restore()
        state = self.run.state
        metrics_writer = env_log = None
        if self.main:
            metrics_writer = MetricsWriter(self.workdir, resume_from_iteration=state.iteration - 1 if resumed else None)
            env_log = EnvLog(self.workdir)
            if state.iteration:
                env_log.truncate_after(state.iteration - 1)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if _in_main_thread() else None
        try:
            while self.run.state.iteration < total and not self.budget_spent():
                if not self._one_iteration(total, metrics_writer, env_log):
                    break
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.checkpointer.wait()
            if metrics_writer:
                metrics_writer.close()
        if jax.process_count() > 1:
            print(f"process {jax.process_index()} state digest {self.state_digest()}", flush=True)
        return self.run.state.history

    def _one_iteration(self, total: int, metrics_writer, env_log) -> bool:
        """One iteration, logged and checkpointed; False when the run must stop (SIGTERM)."""
        state = self.run.state
        snapshot = self.meta()
        try:
            metrics, env_records = self.run.iteration(state.iteration)
        except Preempted:
            self.save(state.iteration, snapshot)
            self._announce_preemption()
            return False
        it = state.iteration
        state.history.append(metrics)
        state.iteration += 1
        if self.main:
            metrics_writer.write(it, metrics)
            env_log.append(env_records)
            if self.config.log.gallery:
                write_gallery(self.workdir)
            print(summary_line(it, metrics), flush=True)
        if itstime(state.iteration, self.config.checkpoint.every, last=state.iteration == total or self.budget_spent()):
            self.save(state.iteration)
        if self.main and self.budget_spent():
            print(f"agent token budget reached: {self.agent_tokens()} of {self.config.agent_token_budget} "
                  f"tokens after {state.iteration} iterations", flush=True)
        if self.preempted:
            self.save(state.iteration)
            self._announce_preemption()
            return False
        return True

    def agent_tokens(self) -> int:
        """Tokens the agent generated over the run so far (its plays, plain and hinted)."""
        return sum(int(m.get("agent/generated_tokens", 0)) for m in self.run.state.history)

    def is_last(self, it: int, extra_tokens: int = 0) -> bool:
        """Whether iteration ``it`` ends the run: the last of `run_to_end`'s total, or the one whose
        ``extra_tokens`` spend the agent-token budget."""
        return (self.total is not None and it >= self.total - 1) or self.budget_spent(extra_tokens)

    def budget_spent(self, extra_tokens: int = 0) -> bool:
        """Whether `agent_token_budget` (0: none) is used up, counting `extra_tokens` not yet in the
        history: the run's equal-compute stop."""
        budget = self.config.agent_token_budget
        return bool(budget) and self.agent_tokens() + extra_tokens >= budget

    def restore(self) -> bool:
        step = self.checkpointer.latest_step()
        if step is None:
            return False
        train, meta = self.checkpointer.restore(step, self.run.trainer.state_dict())
        self.run.trainer.load_state_dict(train)
        try:
            self.load_meta(meta)
        except OldCheckpointError as err:
            raise SystemExit(f"error: {self.workdir} checkpoint {step}: {err}") from None
        self._saved_step = step
        if self.main:
            print(f"resumed from checkpoint {step} in {self.workdir}", flush=True)
        return True

    def meta(self) -> dict:
        """The checkpoint's JSON: the seed and every saved piece of the run."""
        return {"seed": self.config.seed, **{key: get() for key, (get, _) in self.run.saved().items()}}

    def load_meta(self, meta: dict) -> None:
        if int(meta["seed"]) != self.config.seed:
            raise ValueError(
                f"the checkpoint in {self.workdir} was made with seed {meta['seed']}, "
                f"the config says {self.config.seed}"
            )
        for key, (_, put) in self.run.saved().items():
            put(meta.get(key))

    def state_digest(self) -> str:
        """A hash of the host-side run state (metric history without timings, every saved piece but
        the loop's own). Every process of a multi-process run computes it from gathered results,
        so equal digests mean the processes agree."""
        history = [
            {k: v for k, v in m.items() if not (k.startswith("time/") or "per_s" in k or k.endswith("time_s"))}
            for m in self.run.state.history
        ]
        pieces = {key: get() for key, (get, _) in self.run.saved().items() if key != "loop"}
        payload = json.dumps([history, pieces], sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def save(self, step: int, meta: dict | None = None) -> None:
        if self._saved_step == step:
            return
        self.checkpointer.save(step, self.run.trainer.state_dict(), meta or self.meta())
        self._saved_step = step

    def check_preempted(self) -> None:
        """Between phases before the update, a SIGTERM abandons the iteration (its state is the last one)."""
        if self.preempted:
            raise Preempted()

    def close(self) -> None:
        self.checkpointer.close()

    def _announce_preemption(self) -> None:
        if self.main:
            print(f"SIGTERM: saved the state before iteration {self.run.state.iteration}; exiting", flush=True)

    def _on_sigterm(self, signum, frame) -> None:
        self.preempted = True


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
