"""Continuous batching of requests on one `RowEngine`, driven by one scheduler thread.

Each reply (a request's choice) holds one engine row and is decoded in *segments* of at
most `segment` tokens: every `step` runs one segment on every busy row, then the rows
whose replies ended (a stop token, a stop string, `max_tokens`) are answered and freed and
the queued replies take free rows, first come first served, before the next step. A reply
takes a row alone (a request's `n` replies need not start together), and every row samples
with its own request's settings, so while a row is free a request waits at most the one
segment in flight, whatever the others ask; when every row decodes, it waits for the first
to free. Streaming gets a delta per segment, and a disconnected client's row is released at
the next segment boundary.

Prefix reuse: a row whose reply ended stays *parked* with its conversation in the cache;
a later request whose prompt extends a parked row's tokens (the next turn of that chat,
when the client sent back the reply as it was tokenized) takes that row and only appends
the new tokens (reported as `usage.prompt_tokens_details.cached_tokens`). Parked rows
are evicted least recently used when a request needs a row.

Forced tool calls (`tool_choice` "required" or a named function) decode as `forced` lays out:
the server writes the call's fixed tokens, the model picks the name a token at a time among the
candidates' branches (a one-token segment each) and writes the arguments in ordinary segments,
read as JSON after each; the reply is always one parseable call. Stop strings do not cut it.

Sampling: each row samples with its request's (temperature, top_p, top_k) (`RowEngine`'s
per-row settings). Seeds: segment k of choice i samples with the engine's key folded with
stream = the request's seed and turn = (i, k), so the same seed and request give the same
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
from spade_jax.serve import forced as forced_lib
from spade_jax.serve import tools as tools_lib
from spade_jax.serve.protocol import Request, ServeError

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
    started: int = 0  # choices that took a row
    finished: int = 0  # choices answered
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclasses.dataclass(eq=False)
class _Call:
    """Where a forced call stands: the name tokens drawn or written so far, then the name, then
    where its arguments begin in the reply's text."""

    plan: forced_lib.Plan
    chosen: tuple[int, ...] = ()
    name: str | None = None
    args_at: int | None = None


@dataclasses.dataclass(eq=False)
class _Choice:
    job: Job
    index: int
    row: int
    call: _Call | None = None  # a forced tool call
    tokens: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)  # None for the tokens the server wrote
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
        self.engine_stats = EngineStats()  # across the engines a failure rebuilds
        self.engine = self._new_engine()
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

    def _new_engine(self) -> RowEngine:
        return RowEngine(self.policy, self._rows, max_new_tokens=self.segment, seed=0, stats=self.engine_stats)

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
        """Queued replies take rows, first come first served, until no row is left."""
        while self._pending:
            job = self._pending[0]
            if job.cancelled:
                self._pending.popleft()
                self.counts["cancelled_queued" if job.started == 0 else "cancelled_starting"] += 1
                continue
            while job.started < job.request.n:
                taken = self._take_row(job.request, reuse=job.started == 0)
                if taken is None:
                    return
                row, cached = taken
                job.cached_tokens += cached
                request = job.request
                call = _Call(forced_lib.Plan.build(self.tokenizer, request.forced)) if request.forced else None
                choice = _Choice(job, job.started, row, call)
                job.started += 1
                self._choices[row] = choice
                try:
                    submitted = self._submit_next(choice, list(request.prompt_tokens))
                except ValueError as err:
                    self._free(choice, park=False)
                    self._answer(job, _error(400, str(err)))
                    break
                if not submitted:
                    self._finish_call(choice, stopped=False, reason="length")
            self._pending.popleft()

    def _take_row(self, request: Request, reuse: bool) -> tuple[int, int] | None:
        """`(row, cached slots)` for one choice, or None while every row decodes. With `reuse`, the
        parked row holding the longest prefix of the prompt, if any; then a free row; then the
        least recently used parked row, evicted."""
        if reuse:
            prompt = list(request.prompt_tokens)
            best, best_len = None, 0
            for row in self._parked:
                held = self.engine.history[row]
                if best_len < len(held) <= len(prompt) and prompt[: len(held)] == held:
                    best, best_len = row, len(held)
            if best is not None:
                del self._parked[best]
                self.counts["prefix_reused"] += 1
                return best, int(self.engine.lengths[best])
        free = self.engine.free_rows()
        if free:
            return free[0], 0
        if self._parked:
            row, _ = self._parked.popitem(last=False)
            self.engine.release(row)
            return row, 0
        return None

    def _submit_next(self, choice: _Choice, held: list[int]) -> bool:
        """Submits the choice's next segment after `held` (the row's conversation so far). A forced
        call first gets the tokens the server writes, and draws its name a token at a time among the
        branches; False (nothing submitted) when `max_tokens` leaves no room for a drawn token."""
        request, allowed = choice.job.request, None
        if choice.call is not None:
            written, allowed = self._call_tokens(choice)
            if len(choice.tokens) + len(written) >= request.max_tokens:
                return False
            choice.tokens += written
            choice.logprobs += [None] * len(written)
            held = held + written
            if choice.call.name is not None and choice.call.args_at is None:
                choice.call.args_at = len(self.tokenizer.decode(choice.tokens)) - 1  # at the "{" just written
        limit = 1 if allowed else min(self.segment, request.max_tokens - len(choice.tokens))
        sampling = request.sampling
        self.engine.submit(choice.row, held, stream=choice.job.stream_key,
                           turn=choice.index * _TURNS_PER_CHOICE + choice.segment, limit=limit,
                           temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                           allowed_tokens=allowed)
        return True

    def _call_tokens(self, choice: _Choice) -> tuple[list[int], list[int] | None]:
        """`(written, allowed)`: the tokens the server writes next into a forced call (its head first;
        the name's tokens where the candidates do not branch; once the name is whole, the tail
        that opens the arguments) and, while the name is open, the branches the model draws among."""
        call, plan = choice.call, choice.call.plan
        written = [] if choice.tokens else list(plan.head)
        while call.name is None:
            call.name = plan.name(call.chosen)
            if call.name is not None:
                return written + list(plan.tail), None
            branches = plan.branches(call.chosen)
            if len(branches) > 1:
                return written, branches
            call.chosen += (branches[0],)
            written.append(branches[0])
        return written, None

    def _advance(self, choice: _Choice, reply: Reply) -> None:
        job, request = choice.job, choice.job.request
        choice.tokens += reply.tokens.tolist()
        choice.logprobs += reply.logprobs.tolist()
        if job.cancelled or job.answered:
            self.counts["rows_dropped" if job.answered else "rows_cancelled"] += 1
            self._free(choice, park=False)
            return
        if choice.call is not None:
            self._advance_call(choice, reply)
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
            self._continue(choice)
            return
        content, calls = tools_lib.split_tool_calls(text, request.tools) if request.tools else (text, [])
        shown = text[: text.index(tools_lib.TOOL_CALL_OPEN)] if calls else text
        if request.stream:
            self._delta(choice, shown[choice.sent_chars:], visible)
        self._finish(choice, visible, text, content, calls, "tool_calls" if calls else reason, park=not cuts)

    def _continue(self, choice: _Choice) -> None:
        """The choice's next segment; a forced call with no room left for one is finished."""
        choice.segment += 1
        try:
            submitted = self._submit_next(choice, list(self.engine.history[choice.row]))
        except ValueError as err:
            self._free(choice, park=False)
            self._answer(choice.job, _error(500, f"generation failed: {err}"))
            return
        if not submitted:
            self._finish_call(choice, stopped=False, reason="length")

    def _advance_call(self, choice: _Choice, reply: Reply) -> None:
        """A forced call after a segment: its name grows by the drawn token, or its arguments are read."""
        call = choice.call
        if call.name is None:
            call.chosen += tuple(reply.tokens.tolist())
        else:
            scan = forced_lib.scan_object(self.tokenizer.decode(choice.tokens)[call.args_at:])
            if scan.end is not None or scan.broken or reply.stopped:
                self._finish_call(choice, reply.stopped, "tool_calls")
                return
        if len(choice.tokens) >= choice.job.request.max_tokens:
            self._finish_call(choice, stopped=False, reason="length")
            return
        self._continue(choice)

    def _finish_call(self, choice: _Choice, stopped: bool, reason: str) -> None:
        """Answers a forced choice with its call: the name drawn (cut short: the first candidate it
        begins) and the arguments the model wrote, through their closing brace or closed
        (`forced.scan_object`); "{}" when they never began."""
        call = choice.call
        visible = choice.tokens[:-1] if stopped else choice.tokens
        text = self.tokenizer.decode(visible)
        arguments = "{}"
        if call.args_at is not None:
            scan = forced_lib.scan_object(text[call.args_at:])
            arguments = scan.closed
            if scan.end is not None:
                visible = visible[: self._tokens_covering(visible, call.args_at + scan.end)]
                text = self.tokenizer.decode(visible)
        name = call.name or call.plan.first_under(call.chosen)
        if choice.job.request.stream and choice.job.request.logprobs:
            self._delta(choice, "", visible)
        self._finish(choice, visible, text, None, [tools_lib.openai_call(name, arguments)], reason, park=False)

    def _finish(self, choice: _Choice, visible: list[int], text: str, content: str | None, calls: list[dict],
                reason: str, *, park: bool) -> None:
        """Delivers the choice's finished reply, frees its row and answers the job after its last choice."""
        job, request = choice.job, choice.job.request
        job.deliver({"type": "finish", "index": choice.index, "reason": reason,
                     "text": text, "content": content, "tool_calls": calls, "tokens": list(choice.tokens),
                     "logprobs": self._logprobs(visible, choice.logprobs) if request.logprobs else None})
        job.completion_tokens += len(choice.tokens)
        job.finished += 1
        self._free(choice, park=park)
        if job.finished == request.n:
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

    def _logprobs(self, tokens: list[int], logprobs: list) -> list[tuple[str, float]]:
        """`(token text, log-prob)` of the drawn tokens (those the server wrote have none)."""
        return [(self.tokenizer.decode([t], skip_special_tokens=False), float(lp))
                for t, lp in zip(tokens, logprobs) if lp is not None]

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
        self.engine = self._new_engine()

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
