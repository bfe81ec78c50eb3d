"""Continuous batching of requests on one `RowEngine`, driven by one scheduler thread.

Each reply (a request's choice) holds one engine row and is decoded in *segments* of at
most `segment` tokens: every `step` runs one segment on every busy row, then the rows
whose replies ended (a stop token, a stop string, `max_tokens`) are answered and freed and
the next queued requests take free rows before the next step. So a request waits at most
one segment for a row, streaming gets a delta per segment, and a disconnected client's
row is released at the next segment boundary.

Prefix reuse: a row whose reply ended stays *parked* with its conversation in the cache;
a later request whose prompt extends a parked row's tokens (the next turn of that chat,
when the client sent back the reply as it was tokenized) takes that row and only appends
the new tokens (reported as `usage.prompt_tokens_details.cached_tokens`). Parked rows
are evicted least recently used when a request needs a row.

Sampling: the engine samples all rows with one (temperature, top_p); a request with other
values waits until the rows drain, then the engine is rebuilt (its compiled programs are
reused). Seeds: segment k of choice i samples with the engine's key folded with stream
= the request's seed and turn = (i, k), so the same seed and request give the same
tokens whatever else is batched with it (up to float rounding between a reused prefix and
a fresh prefill); without a seed the stream is random.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import secrets
import threading
import time
from typing import Callable

from spade_jax.sampling.engine import EngineStats, Reply, RowEngine
from spade_jax.serve import tools as tools_lib
from spade_jax.serve.protocol import Request, Sampling, ServeError

SEGMENT_TOKENS = 16
_TURNS_PER_CHOICE = 2**16


@dataclasses.dataclass(eq=False)
class Job:
    """A submitted request and where its events go (`deliver`, called on the scheduler thread)."""

    request: Request
    deliver: Callable[[dict], None]
    stream_key: int
    cancelled: bool = False
    answered: bool = False  # its one terminal event ("done" or "error") was delivered
    open_choices: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclasses.dataclass(eq=False)
class _Choice:
    job: Job
    index: int
    row: int
    tokens: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    segment: int = 0
    sent_chars: int = 0
    sent_tokens: int = 0


def _stream_key(seed: int | None) -> int:
    if seed is None:
        return secrets.randbits(32)
    return (seed ^ (seed >> 32)) % 2**32


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """Characters at the end of `text` that may still become a marker (or finish a character)."""
    hold = len(text) - len(text.rstrip("\ufffd"))
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), hold, -1):
            if text.endswith(marker[:k]):
                hold = k
                break
    return hold


class Scheduler:
    """Owns the engine; `submit` queues a request (at most `max_queue` waiting), `shutdown` drains."""

    def __init__(self, policy, *, rows: int, max_queue: int, segment: int = SEGMENT_TOKENS):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.segment = int(segment)
        self.max_queue = int(max_queue)
        self._rows = int(rows)
        self._sampling = Sampling(1.0, 1.0)
        self.engine_stats = EngineStats()  # across the engines a sampling change rebuilds
        self.engine = self._new_engine(self._sampling)
        self._cond = threading.Condition()
        self._pending: collections.deque[Job] = collections.deque()
        self._choices: dict[int, _Choice] = {}  # row -> the reply decoding on it
        self._parked: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU order
        self._stopping = False
        self._deadline = float("inf")
        self.counts = collections.Counter()
        self._thread = threading.Thread(target=self._run, name="spade-serve-scheduler", daemon=True)

    @property
    def rows(self) -> int:
        return self.engine.rows

    def _new_engine(self, sampling: Sampling) -> RowEngine:
        return RowEngine(self.policy, self._rows, max_new_tokens=self.segment, temperature=sampling.temperature,
                         top_p=sampling.top_p, seed=0, stats=self.engine_stats)

    # ---- the request side (event-loop thread)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: Request, deliver: Callable[[dict], None]) -> Job:
        """Queues `request`; 503 when the queue is full or the server is shutting down."""
        job = Job(request, deliver, _stream_key(request.seed))
        with self._cond:
            if self._stopping:
                raise ServeError(503, "the server is shutting down", kind="server_shutting_down")
            if len(self._pending) >= self.max_queue:
                self.counts["refused_queue_full"] += 1
                raise ServeError(503, f"the request queue is full ({self.max_queue} waiting); retry later",
                                 kind="server_overloaded")
            self._pending.append(job)
            self.counts["submitted"] += 1
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: the job gets no more events; its rows free at the next segment."""
        with self._cond:
            job.cancelled = True
            self._cond.notify()

    def status(self) -> dict:
        with self._cond:
            stats = self.engine_stats
            return {"queued": len(self._pending), "decoding": len(self._choices), "rows": self.rows,
                    "parked": len(self._parked), **self.counts, "compile_s": round(stats.compile_s, 3),
                    "append_s": round(stats.append_s, 3), "decode_s": round(stats.decode_s, 3),
                    "decode_steps": stats.decode_steps, "generated_tokens": stats.generated_tokens}

    def shutdown(self, drain_s: float) -> None:
        """Refuses new requests, fails the queued ones, lets the decoding ones finish for up to
        `drain_s` seconds and fails the rest; returns once every job is answered."""
        with self._cond:
            self._stopping = True
            self._deadline = min(self._deadline, time.monotonic() + drain_s)
            while self._pending:
                self._answer(self._pending.popleft(), _error(503, "the server shut down before the request ran"))
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    # ---- the scheduler thread

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # a scheduler bug: every request is answered, later ones get 503
            logging.exception("the scheduler stopped")
            with self._cond:
                self._stopping = True
                for job in [*self._pending, *(c.job for c in self._choices.values())]:
                    self._answer(job, _error(500, "the scheduler stopped; see the server's log"))
                self._pending.clear()
                self._choices.clear()
        finally:
            self.engine.close()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._choices or self._stopping):
                    self._cond.wait()
                if self._stopping and not self._choices and not self._pending:
                    return
                if self._stopping and time.monotonic() > self._deadline:
                    self._fail_decoding(503, "the server shut down before the reply finished")
                    continue
                self._admit()
            if self._choices:
                self._step()

    def _step(self) -> None:
        try:
            replies = self.engine.step(exit_after=self.engine.num_active)
        except Exception as err:  # an engine failure fails its requests, never the server
            logging.exception("engine step failed")
            with self._cond:
                self._fail_decoding(500, f"generation failed: {type(err).__name__}: {err}")
            return
        with self._cond:
            for reply in replies:
                self._advance(self._choices[reply.row], reply)

    def _admit(self) -> None:
        while self._pending:
            job = self._pending[0]
            if job.cancelled:
                self._pending.popleft()
                self.counts["cancelled_queued"] += 1
                continue
            if job.request.sampling != self._sampling:
                if self._choices:
                    return  # FIFO: it waits for the rows to drain, and so does everything behind it
                self.engine.close()
                self._parked.clear()
                self._sampling = job.request.sampling
                self.engine = self._new_engine(self._sampling)
            rows = self._take_rows(job.request)
            if rows is None:
                return
            self._pending.popleft()
            job.open_choices = len(rows)
            for index, (row, cached) in enumerate(rows):
                job.cached_tokens += cached
                choice = _Choice(job, index, row)
                try:
                    self._submit_segment(choice, list(job.request.prompt_tokens))
                except ValueError as err:
                    self.engine.release(row)
                    self._answer(job, _error(400, str(err)))
                    break
                self._choices[row] = choice

    def _take_rows(self, request: Request) -> list[tuple[int, int]] | None:
        """`(row, cached slots)` for each choice, or None until enough rows free up. The first choice
        takes the parked row holding the longest prefix of the prompt, if any."""
        prompt = list(request.prompt_tokens)
        free = self.engine.free_rows()
        if len(free) + len(self._parked) < request.n:
            return None
        best, best_len = None, 0
        for row in self._parked:
            held = self.engine.history[row]
            if best_len < len(held) <= len(prompt) and prompt[: len(held)] == held:
                best, best_len = row, len(held)
        taken = []
        if best is not None:
            del self._parked[best]
            taken.append((best, int(self.engine.lengths[best])))
            self.counts["prefix_reused"] += 1
        while len(taken) < request.n:
            if free:
                taken.append((free.pop(0), 0))
            else:
                row, _ = self._parked.popitem(last=False)
                self.engine.release(row)
                taken.append((row, 0))
        return taken

    def _submit_segment(self, choice: _Choice, tokens: list[int]) -> None:
        limit = min(self.segment, choice.job.request.max_tokens - len(choice.tokens))
        self.engine.submit(choice.row, tokens, stream=choice.job.stream_key,
                           turn=choice.index * _TURNS_PER_CHOICE + choice.segment, limit=limit)

    def _advance(self, choice: _Choice, reply: Reply) -> None:
        job, request = choice.job, choice.job.request
        choice.tokens += reply.tokens.tolist()
        choice.logprobs += reply.logprobs.tolist()
        if job.cancelled or job.answered:
            self.counts["rows_dropped" if job.answered else "rows_cancelled"] += 1
            self._free(choice, park=False)
            return
        visible = choice.tokens[:-1] if reply.stopped else choice.tokens
        text = self.tokenizer.decode(visible)
        cuts = [i for i in (text.find(s) for s in request.stop) if i >= 0]
        reason = None
        if cuts:
            text, reason = text[: min(cuts)], "stop"
            visible = visible[: self._tokens_covering(visible, len(text))]
        elif reply.stopped:
            reason = "stop"
        elif len(choice.tokens) >= request.max_tokens:
            reason = "length"
        if reason is None:
            shown = text
            if request.tools and tools_lib.TOOL_CALL_OPEN in shown:
                shown = shown[: shown.index(tools_lib.TOOL_CALL_OPEN)]
            markers = request.stop + ((tools_lib.TOOL_CALL_OPEN,) if request.tools else ())
            safe = len(shown) - _held_back(shown, markers)
            if request.stream and (safe > choice.sent_chars or len(visible) > choice.sent_tokens):
                self._delta(choice, text[choice.sent_chars: max(safe, choice.sent_chars)], visible)
                choice.sent_chars = max(safe, choice.sent_chars)
            choice.segment += 1
            try:
                self._submit_segment(choice, list(self.engine.history[choice.row]))
            except ValueError as err:
                self._free(choice, park=False)
                self._answer(job, _error(500, f"generation failed: {err}"))
            return
        content, calls = tools_lib.split_tool_calls(text, request.tools) if request.tools else (text, [])
        shown = text[: text.index(tools_lib.TOOL_CALL_OPEN)] if calls else text
        if request.stream:
            self._delta(choice, shown[choice.sent_chars:], visible)
        job.deliver({"type": "finish", "index": choice.index, "reason": "tool_calls" if calls else reason,
                     "text": text, "content": content, "tool_calls": calls, "tokens": list(choice.tokens),
                     "logprobs": self._logprobs(visible, choice.logprobs) if request.logprobs else None})
        job.completion_tokens += len(choice.tokens)
        job.open_choices -= 1
        self._free(choice, park=not cuts)
        if job.open_choices == 0:
            prompt = len(request.prompt_tokens)
            self._answer(job, {"type": "done", "usage": {
                "prompt_tokens": prompt, "completion_tokens": job.completion_tokens,
                "total_tokens": prompt + job.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}})

    def _delta(self, choice: _Choice, text: str, visible: list[int]) -> None:
        new = visible[choice.sent_tokens:]
        logprobs = self._logprobs(new, choice.logprobs[choice.sent_tokens:]) if choice.job.request.logprobs else None
        choice.sent_tokens = len(visible)
        choice.job.deliver({"type": "delta", "index": choice.index, "text": text, "logprobs": logprobs})

    def _logprobs(self, tokens: list[int], logprobs: list[float]) -> list[tuple[str, float]]:
        return [(self.tokenizer.decode([t], skip_special_tokens=False), float(lp)) for t, lp in zip(tokens, logprobs)]

    def _tokens_covering(self, tokens: list[int], chars: int) -> int:
        """The fewest leading tokens whose text reaches `chars` characters."""
        for k in range(len(tokens) + 1):
            if len(self.tokenizer.decode(tokens[:k])) >= chars:
                return k
        return len(tokens)

    def _free(self, choice: _Choice, *, park: bool) -> None:
        del self._choices[choice.row]
        if park:
            self._parked[choice.row] = None
        else:
            self.engine.release(choice.row)

    def _fail_decoding(self, status: int, message: str) -> None:
        """Answers every decoding job with the error and forgets every row (a new engine: between
        steps a row waits on its next segment, which only a step could end)."""
        for choice in self._choices.values():
            self._answer(choice.job, _error(status, message))
        self._choices.clear()
        self._parked.clear()
        self.engine.close()
        self.engine = self._new_engine(self._sampling)

    def _answer(self, job: Job, event: dict) -> None:
        """The job's one terminal event (later ones are dropped: a request is answered once)."""
        if job.answered:
            return
        job.answered = True
        self.counts["answered_" + event["type"]] += 1
        if not job.cancelled:
            job.deliver(event)


def _error(status: int, message: str) -> dict:
    return {"type": "error", "error": ServeError(status, message)}
