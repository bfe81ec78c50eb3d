"""`RowEngine`: a decode batch whose rows keep their KV cache between calls.

A row holds one conversation (an episode, or one prompt) from slot 0 of its cache.
The caller hands a row the conversation's tokens (`submit`); the engine appends what
the cache does not hold yet and decodes the reply, and the next turn only appends the
new tokens (the observation and the next assistant header), never the prefix again.
The last token of a submission, and the last sampled token of a reply, stay pending:
the first decode step feeds it, so a row either decodes or waits, with one program
for both.

`step` runs one *chunk*: the pending appends (one program over the rows that append,
gathered out of the batch and scattered back), then an in-graph `lax.while_loop` decode
over every row that leaves when `exit_after` rows have finished their reply (stop
token or length limit), when no row is active, or after `max_new_tokens` steps. Rows
that finished are handed back at once, so the caller can step their environments and
refill them while the others keep decoding (continuous batching); a row never waits
for the longest reply of a turn.

Shapes are bucketed (`stepped_bucket`: powers of two, then steps): the row count is
fixed per engine; an append pass writes up to `MAX_FRESH_TOKENS` tokens into each of some
empty rows, or up to `MAX_APPEND_TOKENS` onto each of some rows' histories (a longer
append takes several passes); the cache holds the longest row's need (`cache_bucket`),
resized (a copy) when that bucket changes. The programs compiled
are counted per kind (`compiled`), bounded by the bucket counts.

With `kv_cache="paged"` (`sampling/paged_cache.py`) the cache is a pool of fixed-size pages
per layer instead: a row takes pages as it grows and returns them when released, the pool
grows by whole pages (doubling) and never resizes rows, a program reads each row through its
page table (padded to `cache_bucket`'s steps, in pages), and appends and decode steps write
only the new slots. Under a mesh each batch shard holds its own rows' pages (a block of the
pool's page axis), so every paged program's batch puts each row in its shard's segment. Its
decode chunks run on the active rows alone, gathered into a power-of-two bucket per shard (few
buckets: each is one more decode program per cache bucket), and a chunk ends early once every
shard's active rows fit half its segment, so rows that finished their reply stop costing
compute (compaction).

Sampling settings are per row: `submit` may give a reply its own temperature, top_p and
top_k (the engine's are the default), so replies with different settings decode in one
chunk, each drawing what it would draw beside rows of its own settings; and it may restrict
a reply to a set of tokens (`allowed_tokens`: constrained decoding, a token at a time). A
chunk compiles the top-k/top-p filter and the token mask in only when one of its rows asks
for them (four programs per shape at most).

`generate_on_rows` is the one-reply-per-prompt call on an engine (the demo, the benchmarks,
`chat.complete_chats`): prompts in, a `Generation` (tokens, log-probs, lengths, which replies
ended on a stop token) out.

Randomness: the token a row draws at reply index i of turn t of stream s (the caller's
episode index, or a request's seed) comes from `fold_in(fold_in(fold_in(key(seed), s), t), i)`,
so sampled replies do not depend on which row an episode got, on when it ran or on what the
other rows sample with.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from spade_jax.models.sharding import activation_sharding, logical_to_spec
from spade_jax.sampling.batching import bucket
from spade_jax.sampling.host_memory import release_freed_memory
from spade_jax.sampling.paged_attention import resolve as resolve_attention
from spade_jax.sampling.paged_cache import (
    PageTable, forward_pages, grow_pool, init_pools, new_slots_to_pages, pages_for, pool_shardings, rows_from_pages,
)
from spade_jax.sampling.tokens import select_tokens, token_logprobs

MIN_CACHE_BUCKET = 128
CACHE_STEP = 256  # bucket steps (`stepped_bucket`): cache slots,
APPEND_STEP = 32  # tokens of an append onto a history,
FRESH_STEP = 64  # tokens of an append into an empty row,
ROWS_STEP = 4  # and rows of an append pass
MAX_APPEND_TOKENS = 128  # tokens per row per pass onto a history: a longer append takes several passes
MAX_FRESH_TOKENS = 1024  # tokens per row per pass into an empty row (a plain causal prefill)
MIN_APPEND_TOKENS = 16
KV_CACHES = ("contiguous", "paged")
DEFAULT_KV_CACHE = "contiguous"
PAGE_SIZE = 64  # slots per page of the paged cache
_KEY_AXES = ("batch", "kv_heads", "head_dim", "cache_length")
_VALUE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """Where the time of one `generate_on_rows` call went (seconds) and which bucket it used."""

    compile_s: float  # building programs for new shapes (0 when every program was cached)
    prefill_s: float  # writing the prompts into the cache (the engine's append passes)
    decode_s: float
    steps: int  # decode loop iterations, every chunk's together
    bucket: tuple[int, int, int]  # (rows, the largest cache bucket in slots, decode steps per chunk)

    @property
    def run_s(self) -> float:
        """Wall time of prefill and decode, without compilation."""
        return self.prefill_s + self.decode_s


@dataclasses.dataclass(frozen=True)
class Generation:
    """Sampled continuations of a batch of prompts; row i belongs to prompt i.

    `tokens[i, :lengths[i]]` are the generated ids (the stop token included when
    `finished[i]`); the rest of the row is the pad id with log-prob 0. Also what a
    `play_episodes(sample=...)` function returns.
    """

    tokens: np.ndarray  # (B, N) int32
    logprobs: np.ndarray  # (B, N) float32, log-prob under the unmodified policy (temperature 1)
    lengths: np.ndarray  # (B,) int32
    finished: np.ndarray  # (B,) bool: the row ended on a stop token
    stats: GenerationStats

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def row_tokens(self, i: int) -> list[int]:
        return self.tokens[i, : self.lengths[i]].tolist()


@dataclasses.dataclass(frozen=True)
class Reply:
    """A finished reply of one row: its tokens (the stop token included when `stopped`) and log-probs."""

    row: int
    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32, under the unmodified policy (temperature 1)
    stopped: bool  # ended on a stop token (else on its length limit)


@dataclasses.dataclass
class EngineStats:
    """Where an engine's time went (seconds) and how much it did."""

    compile_s: float = 0.0
    append_s: float = 0.0
    decode_s: float = 0.0
    resize_s: float = 0.0
    chunks: int = 0
    append_passes: int = 0
    decode_steps: int = 0  # loop iterations, every row computed at each
    generated_tokens: int = 0
    appended_tokens: int = 0
    max_cache_length: int = 0  # the largest cache bucket used, in slots per row
    pool_pages: int = 0  # paged cache: the largest pool, in pages per layer
    compiled: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def device_s(self) -> float:
        """Seconds the host waited on engine programs (the device was busy for at least as long)."""
        return self.append_s + self.decode_s + self.resize_s


_PROGRAMS: dict[tuple, jax.stages.Compiled] = {}


def check_sampling_args(max_new_tokens, temperature, top_p, top_k) -> None:
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if int(top_k) < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")


def batch_shards(mesh, rules) -> int:
    """Number of devices the batch axis is split over when it divides evenly."""
    return int(np.prod([mesh.shape[a] for a in dict(rules).get("batch", ())]))


def place_inputs(host: dict, mesh, rules) -> dict:
    """Global arrays built from the (identical on every process) host arrays; batch-leading ones sharded."""
    placed = {}
    for name, value in host.items():
        axes = ("batch",) + (None,) * (value.ndim - 1) if name.endswith(("_B", "_BT")) else (None,) * value.ndim
        sharding = NamedSharding(mesh, logical_to_spec(axes, value.shape, mesh, rules))
        placed[name] = jax.make_array_from_callback(value.shape, sharding, lambda index, v=value: v[index])
    return placed


def stepped_bucket(n: int, step: int, multiple: int = 1) -> int:
    """A power of two up to `step`, then a multiple of `step` (each a multiple of `multiple`).

    Finer than powers of two where padding costs most: every decode step reads the whole
    cache of every row, and an append pass computes every padded row and token. Each bucket
    is one more compiled program, so the steps stay coarse."""
    if n <= step:
        return bucket(n, 1, multiple)
    return bucket(-(-n // step) * step, 1, multiple) if multiple > step else -(-n // step) * step


def cache_bucket(slots: int) -> int:
    """Cache length for `slots`: at least `MIN_CACHE_BUCKET`, then `stepped_bucket` by `CACHE_STEP`."""
    return stepped_bucket(max(slots, MIN_CACHE_BUCKET), CACHE_STEP)


class RowEngine:
    """`rows` decode rows over `policy`, each with a KV cache kept across `submit`/`step` calls.

    `temperature`, `top_p` and `top_k` are every reply's default (`submit` may set a reply's
    own); `max_new_tokens` bounds one reply (a row's `limit` may be lower). `stats` (shared with the caller when given) accumulates timings.
    `kv_cache` is "contiguous" (one cache row per row) or "paged" (`page_size` slots a page;
    `cache_tokens` sizes the pool up front, else it starts at `MIN_CACHE_BUCKET` slots a row and
    grows; `paged_attention` picks `paged_attention.paged_attention`'s implementation). Both
    give the same replies. Every process of a multi-process run must make the same calls.
    """

    def __init__(self, policy, rows: int, *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, stop_token_ids: Sequence[int] | None = None,
                 stats: EngineStats | None = None, kv_cache: str = DEFAULT_KV_CACHE, page_size: int = PAGE_SIZE,
                 cache_tokens: int | None = None, paged_attention: str = "auto"):
        check_sampling_args(max_new_tokens, temperature, top_p, top_k)
        if kv_cache not in KV_CACHES:
            raise ValueError(f"unknown kv_cache {kv_cache!r}; choose one of {KV_CACHES}")
        self.kv_cache = kv_cache
        self.paged_attention = resolve_attention(paged_attention) if kv_cache == "paged" else None
        self.policy = policy
        tokenizer = policy.tokenizer
        if stop_token_ids is None:
            stop_token_ids = list(tokenizer.eos_token_ids) if tokenizer is not None else []
        self.pad_id = int(tokenizer.pad_id) if tokenizer is not None else 0
        self.rows = bucket(rows, 1, batch_shards(policy.mesh, policy.rules))
        self.max_new_tokens = int(max_new_tokens)
        self.num_steps = bucket(max_new_tokens, 16)
        self.defaults = (float(temperature), float(top_p), int(top_k))
        stops = np.full((bucket(len(stop_token_ids), 4),), -1, np.int32)
        stops[: len(stop_token_ids)] = np.asarray(stop_token_ids, np.int32)
        self._scalars = {
            "stops_S": stops, "seed": np.asarray(int(seed) % 2**32, np.uint32),
            "pad_id": np.asarray(self.pad_id, np.int32),
        }
        self.stats = stats if stats is not None else EngineStats()
        R = self.rows
        self.history: list[list[int]] = [[] for _ in range(R)]  # tokens in the cache, then the pending one
        self.lengths = np.zeros(R, np.int32)  # slots written: len(history) - 1 once a row holds anything
        self.active = np.zeros(R, bool)
        self.reply_len = np.zeros(R, np.int32)
        self.limit = np.zeros(R, np.int32)
        self.stream = np.zeros(R, np.uint32)
        self.turn = np.zeros(R, np.uint32)
        self.temperature = np.full(R, temperature, np.float32)  # the reply's sampling settings
        self.top_p = np.full(R, top_p, np.float32)
        self.top_k = np.full(R, top_k, np.int32)
        self._reply_logprobs: list[list[float]] = [[] for _ in range(R)]  # the reply's tokens end `history`
        self._appends: dict[int, list[int]] = {}
        self._allowed: dict[int, np.ndarray] = {}  # row -> the tokens its reply may draw (V,) bool
        self._cache = None  # contiguous: per-layer (k_BKHS, v_BKSH); paged: per-layer pools
        self._pages = None
        if kv_cache == "paged":
            shards = batch_shards(policy.mesh, policy.rules)
            initial = pages_for(cache_tokens, page_size) if cache_tokens else R * pages_for(MIN_CACHE_BUCKET, page_size)
            self._pages = PageTable(R, page_size, shards * (1 + -(-initial // shards)), shards)
        self._graphdef, self._state = nnx.split(policy.model)
        params = tuple((x.shape, x.dtype, x.sharding) for x in jax.tree.leaves(self._state))
        layout = (page_size, self.paged_attention) if kv_cache == "paged" else None
        self._signature = (self._graphdef, params, policy.mesh, policy.rules, layout)  # what else a program depends on

    # ---- rows

    def free_rows(self) -> list[int]:
        """Rows holding nothing (never used, or released)."""
        return [r for r in range(self.rows) if not self.history[r]]

    def release(self, row: int) -> None:
        """Forgets the row's conversation; its slots are overwritten by the next one."""
        if self.active[row]:
            raise ValueError(f"row {row} is still decoding")
        self.history[row] = []
        self.lengths[row] = 0
        self._appends.pop(row, None)
        self._allowed.pop(row, None)
        if self._pages is not None:
            self._pages.release(row)

    def submit(self, row: int, tokens: Sequence[int], *, stream: int, turn: int, limit: int | None = None,
               temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
               allowed_tokens: Sequence[int] | None = None) -> None:
        """Starts a reply after `tokens`, the row's whole conversation so far.

        On a row in use, `tokens` must extend what the row holds (its earlier tokens and the
        reply it sampled); only the new tokens are computed. `limit` caps the reply's length
        (default `max_new_tokens`); `temperature`, `top_p` and `top_k` are this reply's (default:
        the engine's). `allowed_tokens`: the only tokens the reply may draw (the stop tokens
        only if listed; log-probs stay the unmodified policy's). The work runs at the next `step`.
        """
        tokens = [int(t) for t in tokens]
        held = self.history[row]
        if self.active[row]:
            raise ValueError(f"row {row} is still decoding")
        if not tokens or len(tokens) < len(held) or tokens[: len(held)] != held:
            raise ValueError(f"row {row}: the submitted tokens do not extend the {len(held)} tokens it holds")
        limit = self.max_new_tokens if limit is None else int(limit)
        if not 1 <= limit <= self.max_new_tokens:
            raise ValueError(f"limit must be in [1, {self.max_new_tokens}], got {limit}")
        settings = tuple(d if v is None else v for v, d in zip((temperature, top_p, top_k), self.defaults))
        check_sampling_args(limit, *settings)
        vocab = self.policy.config.vocab_size
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise ValueError(f"row {row}: token ids outside [0, {vocab})")
        if allowed_tokens is not None:
            allowed = np.asarray(allowed_tokens, np.int64)
            if allowed.size == 0 or allowed.min() < 0 or allowed.max() >= vocab:
                raise ValueError(f"row {row}: allowed_tokens must be a non-empty set of ids in [0, {vocab})")
        if len(tokens) + limit > self.policy.config.max_position_embeddings:
            raise ValueError(f"row {row}: {len(tokens)} tokens + a {limit}-token reply exceed the model's "
                             f"max_position_embeddings ({self.policy.config.max_position_embeddings})")
        self.history[row] = tokens
        new = tokens[self.lengths[row] : -1]
        if new:
            self._appends[row] = new
        self.active[row] = True
        self.reply_len[row] = 0
        self.limit[row] = limit
        self.stream[row] = stream % 2**32
        self.turn[row] = turn % 2**32
        self.temperature[row], self.top_p[row], self.top_k[row] = settings
        self._allowed.pop(row, None)
        if allowed_tokens is not None:
            self._allowed[row] = np.zeros(vocab, bool)
            self._allowed[row][allowed] = True
        self._reply_logprobs[row] = []

    @property
    def num_active(self) -> int:
        return int(self.active.sum())

    def close(self) -> None:
        """Frees the cache now (and, on CPU, hands its memory back to the OS); the engine is done."""
        for buffer in jax.tree.leaves(self._cache):
            buffer.delete()
        self._cache = None
        release_freed_memory(self.policy.mesh.devices.flat)

    # ---- one chunk

    def step(self, exit_after: int = 1) -> list[Reply]:
        """Runs the pending appends and one decode chunk; returns the replies that finished in it.

        The chunk ends once `exit_after` rows finished a reply (or none is active, or after
        `max_new_tokens` steps); rows still mid-reply carry on at the next `step`.
        """
        if not self.active.any():
            return []
        after_append = self.lengths.copy()
        for row, new in self._appends.items():
            after_append[row] += len(new)
        need = np.where(self.active, after_append + self.limit - self.reply_len, after_append + 1)
        exit_after = max(1, min(int(exit_after), self.num_active))
        if self._pages is not None:
            self._reserve_pages(need)
            while self._appends:
                self._run_paged_append_pass()
            return self._run_paged_decode(exit_after)
        self._fit_cache(cache_bucket(int(need.max()) + 1))  # + the slot a row that finished writes while idle
        while self._appends:
            self._run_append_pass()
        return self._run_decode(exit_after)

    def _fit_cache(self, length: int) -> None:
        cfg = self.policy.config
        self.stats.max_cache_length = max(self.stats.max_cache_length, length)
        if self._cache is None:
            self._cache = self._program("init", (length,), lambda: jax.jit(
                _init_cache, static_argnames=("config", "rows", "length", "mesh", "rules"),
                out_shardings=self._cache_shardings(length),
            ).lower(config=cfg, rows=self.rows, length=length, mesh=self.policy.mesh, rules=self.policy.rules))()
            return
        current = self.cache_length
        if current == length:
            return
        k_sharding, v_sharding = self._cache_shardings(length)[0]
        resize = self._program("resize", (current, length), lambda: jax.jit(
            _resize, static_argnames=("length",), out_shardings=(k_sharding, v_sharding),
        ).lower(self._cache[0], length=length))
        start = time.perf_counter()
        resized = []
        for layer in self._cache:  # one layer at a time: the old and new caches are never both whole
            resized.append(jax.block_until_ready(resize(layer)))
            for buffer in layer:
                buffer.delete()
        self._cache = resized
        release_freed_memory(self.policy.mesh.devices.flat)
        self.stats.resize_s += time.perf_counter() - start

    def _plan_append_pass(self):
        """The next append pass: whether its rows are empty (`fresh`), the rows, the bucketed tokens
        per row `T`, and each row's piece of its pending tokens."""
        fresh = sorted(r for r in self._appends if self.lengths[r] == 0)
        rows = fresh or sorted(self._appends)
        limit = MAX_FRESH_TOKENS if fresh else MAX_APPEND_TOKENS
        longest = max(MIN_APPEND_TOKENS, *(len(self._appends[r]) for r in rows))
        T = min(limit, stepped_bucket(longest, FRESH_STEP if fresh else APPEND_STEP))
        return fresh, rows, T, [self._appends[r][:T] for r in rows]

    def _run_append_pass(self) -> None:
        """Writes the next pending tokens of a group of rows: the rows that hold nothing yet (a
        plain causal prefill, up to `MAX_FRESH_TOKENS` each), else every row with an append (up
        to `MAX_APPEND_TOKENS` each, attending to the row's history)."""
        fresh, rows, T, pieces = self._plan_append_pass()
        A = min(self.rows, stepped_bucket(len(rows), ROWS_STEP, batch_shards(self.policy.mesh, self.policy.rules)))
        rows_A = np.full(A, rows[0], np.int32)  # padding entries repeat a row and write nothing
        rows_A[: len(rows)] = rows
        tokens_AT = np.full((A, T), self.pad_id, np.int32)
        lengths_A = np.zeros(A, np.int32)
        for i, piece in enumerate(pieces):
            tokens_AT[i, : len(piece)] = piece
            lengths_A[i] = len(piece)
        starts_A = self.lengths[rows_A].copy()
        if (starts_A + lengths_A > self.cache_length).any():
            raise AssertionError("an append pass would write past the cache; the cache was sized too small")
        host = {"rows_A": rows_A, "tokens_AT": tokens_AT, "starts_A": starts_A, "lengths_A": lengths_A}
        args = place_inputs(host, self.policy.mesh, self.policy.rules)
        inputs = [args[name] for name in ("tokens_AT", "starts_A", "lengths_A", "rows_A")]
        append = self._program("append", (A, T, self.cache_length, not fresh), lambda: jax.jit(
            _append, static_argnames=("graphdef", "with_history", "mesh", "rules"), donate_argnums=(1,),
            out_shardings=self._cache_shardings(self.cache_length),
        ).lower(self._state, self._cache, *inputs, graphdef=self._graphdef, with_history=not fresh,
                mesh=self.policy.mesh, rules=self.policy.rules))
        self._apply_append(append, inputs, rows, pieces)

    def _apply_append(self, append, inputs, rows, pieces) -> None:
        """Runs one compiled append pass and moves each row's appended piece from pending to cached."""
        start = time.perf_counter()
        self._cache = jax.block_until_ready(append(self._state, self._cache, *inputs))
        self.stats.append_s += time.perf_counter() - start
        self.stats.append_passes += 1
        for row, piece in zip(rows, pieces):
            self.lengths[row] += len(piece)
            self.stats.appended_tokens += len(piece)
            rest = self._appends.pop(row)[len(piece):]
            if rest:
                self._appends[row] = rest

    def _run_decode(self, exit_after: int) -> list[Reply]:
        if (np.where(self.active, self.lengths + self.limit - self.reply_len, self.lengths + 1)
                > self.cache_length).any():
            raise AssertionError("a decode chunk could write past the cache; the cache was sized too small")
        host = {
            "last_B": np.asarray([h[-1] if h else self.pad_id for h in self.history], np.int32),
            "lengths_B": self.lengths.copy(), "active_B": self.active.copy(), "reply_len_B": self.reply_len.copy(),
            "limit_B": self.limit.copy(), "stream_B": self.stream.copy(), "turn_B": self.turn.copy(),
            **self.settings_B(np.arange(self.rows)), **self._scalars, "exit_after": np.asarray(exit_after, np.int32),
            "shrink_at": np.asarray(0, np.int32),
        }
        return self._run_chunk("decode", (self.cache_length,), np.arange(self.rows), host,
                               self._cache_shardings(self.cache_length))

    def settings_B(self, rows_B: np.ndarray) -> dict:
        """The decode program's per-row sampling inputs for batch rows `rows_B` (-1: padding, the defaults)."""
        real_B = rows_B >= 0
        return {name: np.where(real_B, values[np.maximum(rows_B, 0)], default).astype(values.dtype)
                for name, values, default in zip(("temperature_B", "top_p_B", "top_k_B"),
                                                 (self.temperature, self.top_p, self.top_k), self.defaults)}

    def _run_chunk(self, kind: str, shape: tuple, rows_B: np.ndarray, host: dict, cache_shardings) -> list[Reply]:
        """Runs one decode program over the batch rows `rows_B` (-1: padding) and records its replies.
        The top-k/top-p filter and the token mask are compiled in when an active row of the chunk
        asks for them."""
        on = rows_B[rows_B >= 0]
        on = on[self.active[on]]
        truncate = bool(((self.top_k[on] > 0) | (self.top_p[on] < 1)).any())
        masked = any(int(r) in self._allowed for r in on)
        if masked:
            everything = np.ones(self.policy.config.vocab_size, bool)
            host = {**host, "allowed_BV": np.stack([self._allowed.get(int(r), everything) for r in rows_B])}
        args = place_inputs(host, self.policy.mesh, self.policy.rules)
        inputs = [args.get(n) for n in _DECODE_INPUTS]
        replicated = NamedSharding(self.policy.mesh, PartitionSpec())
        decode = self._program(kind, (*shape, self.num_steps, truncate, masked), lambda: jax.jit(
            _decode, static_argnames=("graphdef", "num_steps", "truncate", "attention", "mesh", "rules"),
            donate_argnums=(1,), out_shardings=(replicated, cache_shardings),
        ).lower(self._state, self._cache, *inputs, graphdef=self._graphdef, num_steps=self.num_steps,
                truncate=truncate, attention=self.paged_attention, mesh=self.policy.mesh, rules=self.policy.rules))
        start = time.perf_counter()
        out, self._cache = decode(self._state, self._cache, *inputs)
        tokens_BN, logprobs_BN, count_B, finished_B, stopped_B, steps = jax.device_get(out)
        self.stats.decode_s += time.perf_counter() - start
        self.stats.chunks += 1
        self.stats.decode_steps += int(steps)
        self.stats.generated_tokens += int(count_B.sum())
        replies = []
        for i, row in enumerate(rows_B):
            if row < 0 or not self.active[row]:
                continue
            n = int(count_B[i])
            self._reply_logprobs[row] += logprobs_BN[i, :n].tolist()
            self.history[row] += tokens_BN[i, :n].tolist()
            self.lengths[row] += n
            self.reply_len[row] += n
            if finished_B[i]:
                self.active[row] = False
                reply = self.history[row][len(self.history[row]) - self.reply_len[row]:]
                replies.append(Reply(int(row), np.asarray(reply, np.int32),
                                     np.asarray(self._reply_logprobs[row], np.float32), bool(stopped_B[i])))
        return replies

    # ---- the paged cache

    def _reserve_pages(self, need: np.ndarray) -> None:
        """Hands every active row the pages its appends and reply can fill (`need` slots), growing
        the pool (doubling every shard's block, at least) when a shard's free pages do not suffice."""
        pages, active = self._pages, np.flatnonzero(self.active)
        missing_S = np.zeros(pages.shards, np.int64)
        for r in active:
            missing_S[pages.home(r)] += pages.missing(r, need[r])
        if self._cache is None or (missing_S > pages.free_S()).any():
            self._fit_pool(pages.grown_size(missing_S))
        for r in active:
            pages.reserve(r, int(need[r]))

    def _fit_pool(self, num: int) -> None:
        """Makes the pool `num` pages (at first: a zeroed one), every shard's block grown alike."""
        pages, cfg = self._pages, self.policy.config
        if self._cache is None:
            pages.grow_to(num)
            self._cache = self._program("init_pool", (num,), lambda: jax.jit(
                init_pools, static_argnames=("config", "num_pages", "page_size", "implementation"),
                out_shardings=self._pool_shardings(num),
            ).lower(config=cfg, num_pages=num, page_size=pages.page_size, implementation=self.paged_attention))()
            self.stats.pool_pages = max(self.stats.pool_pages, num)
            return
        grow = self._program("grow_pool", (pages.num_pages, num), lambda: jax.jit(
            grow_pool, static_argnames=("num_pages", "shards"), out_shardings=self._pool_shardings(num)[0],
        ).lower(self._cache[0], num_pages=num, shards=pages.shards))
        start = time.perf_counter()
        grown = []
        for pool in self._cache:  # one layer at a time: the old and new pools are never both whole
            grown.append(jax.block_until_ready(grow(pool)))
            for buffer in jax.tree.leaves(pool):
                buffer.delete()
        self._cache = grown
        pages.grow_to(num)
        release_freed_memory(self.policy.mesh.devices.flat)
        self.stats.resize_s += time.perf_counter() - start
        self.stats.pool_pages = max(self.stats.pool_pages, num)

    def _table_width(self, slots: int) -> int:
        """Page-table columns for rows of up to `slots` slots: `cache_bucket`'s steps, in pages."""
        width = pages_for(cache_bucket(slots), self._pages.page_size)
        self.stats.max_cache_length = max(self.stats.max_cache_length, width * self._pages.page_size)
        return width

    def _run_paged_append_pass(self) -> None:
        """`_run_append_pass` on the paged cache: the pass's rows, each in its shard's segment,
        read and write their own pages."""
        fresh, rows, T, pieces = self._plan_append_pass()
        pages = self._pages
        per_shard = min(pages.rows_per_shard, stepped_bucket(pages.rows_per_segment(rows), ROWS_STEP))
        rows_A = pages.batch(rows, per_shard)  # padding entries read and write the trash page only
        A = len(rows_A)
        piece_of = dict(zip(rows, pieces))
        tokens_AT = np.full((A, T), self.pad_id, np.int32)
        lengths_A = np.zeros(A, np.int32)
        starts_A = np.zeros(A, np.int32)
        for i, row in enumerate(rows_A):
            if row < 0:
                continue
            piece = piece_of[row]
            tokens_AT[i, : len(piece)] = piece
            lengths_A[i] = len(piece)
            starts_A[i] = self.lengths[row]
            if pages.missing(row, starts_A[i] + len(piece)):
                raise AssertionError("an append pass would write past a row's pages; too few were reserved")
        M = self._table_width(int((starts_A + T).max()))
        host = {"tokens_AT": tokens_AT, "starts_A": starts_A, "lengths_A": lengths_A,
                "page_table_AM": self._pages.table(rows_A, M)}
        args = place_inputs(host, self.policy.mesh, self.policy.rules)
        inputs = [args[name] for name in ("tokens_AT", "starts_A", "lengths_A", "page_table_AM")]
        P = self._pages.num_pages
        append = self._program("append_paged", (A, T, M, P, not fresh), lambda: jax.jit(
            _append_paged, static_argnames=("graphdef", "with_history", "attention", "mesh", "rules"),
            donate_argnums=(1,), out_shardings=self._pool_shardings(P),
        ).lower(self._state, self._cache, *inputs, graphdef=self._graphdef, with_history=not fresh,
                attention=self.paged_attention, mesh=self.policy.mesh, rules=self.policy.rules))
        self._apply_append(append, inputs, rows, pieces)

    def _run_paged_decode(self, exit_after: int) -> list[Reply]:
        """Decode chunks over the active rows only, gathered into a bucket of rows (compaction).

        Each row sits in its shard's segment of the batch (a bucket per shard). A chunk also ends
        once every shard's active rows fit a segment half its size; the next chunk then runs on the
        smaller bucket, until `exit_after` replies finished (or none is active).
        A token's key does not depend on the batch, so this changes no reply."""
        pages = self._pages
        fit = lambda n: min(pages.rows_per_shard, bucket(n, 1))  # noqa: E731  (rows per shard's segment)
        replies = []
        while len(replies) < exit_after and self.active.any():
            rows = np.flatnonzero(self.active)
            busiest = pages.rows_per_segment(rows)
            per_shard = fit(busiest)
            shrink_at = min(per_shard // 2, busiest - 1)
            while shrink_at > 0 and fit(shrink_at) > per_shard // 2:
                shrink_at -= 1
            rows_B = pages.batch(rows, per_shard)
            real_B = rows_B >= 0
            pick = lambda x, fill: np.where(real_B, x[np.maximum(rows_B, 0)], fill).astype(x.dtype)  # noqa: E731
            need_B = pick(self.lengths + self.limit - self.reply_len, 0)
            if any(pages.missing(r, n) for r, n in zip(rows_B, need_B) if r >= 0):
                raise AssertionError("a decode chunk could write past a row's pages; too few were reserved")
            M = self._table_width(int(need_B.max()) + 1)  # + the slot a row that finished writes while idle
            host = {
                "page_table_BM": self._pages.table(rows_B, M),
                "last_B": np.asarray([self.history[r][-1] if r >= 0 else self.pad_id for r in rows_B], np.int32),
                "lengths_B": pick(self.lengths, 0), "active_B": real_B.copy(), "reply_len_B": pick(self.reply_len, 0),
                "limit_B": pick(self.limit, 1), "stream_B": pick(self.stream, 0), "turn_B": pick(self.turn, 0),
                **self.settings_B(rows_B), **self._scalars, "exit_after": np.asarray(exit_after - len(replies), np.int32),
                "shrink_at": np.asarray(shrink_at, np.int32),
            }
            P = self._pages.num_pages
            replies += self._run_chunk("decode_paged", (len(rows_B), M, P), rows_B, host, self._pool_shardings(P))
        return sorted(replies, key=lambda reply: reply.row)

    def _pool_shardings(self, num_pages: int):
        return pool_shardings(self.policy.config, num_pages, self._pages.page_size, self.paged_attention,
                              self.policy.mesh, self.policy.rules)

    # ---- programs

    @property
    def cache_length(self) -> int:
        """Slots per row in the current cache bucket (the contiguous cache)."""
        return self._cache[0][0].shape[-1]

    def _cache_shardings(self, length: int):
        abstract = jax.eval_shape(lambda: _init_cache(self.policy.config, self.rows, length, None, None))
        mesh, rules = self.policy.mesh, self.policy.rules
        return [
            (NamedSharding(mesh, logical_to_spec(_KEY_AXES, k.shape, mesh, rules)),
             NamedSharding(mesh, logical_to_spec(_VALUE_AXES, v.shape, mesh, rules)))
            for k, v in abstract
        ]

    def _program(self, kind: str, shape: tuple, lower) -> jax.stages.Compiled:
        key = (kind, shape, self.rows, self._signature)
        if key not in _PROGRAMS:
            start = time.perf_counter()
            _PROGRAMS[key] = lower().compile()
            self.stats.compile_s += time.perf_counter() - start
            self.stats.compiled[kind] += 1
        return _PROGRAMS[key]


_DECODE_INPUTS = ("page_table_BM", "last_B", "lengths_B", "active_B", "reply_len_B", "limit_B", "stream_B", "turn_B",
                  "stops_S", "seed", "temperature_B", "top_p_B", "top_k_B", "allowed_BV", "pad_id", "exit_after",
                  "shrink_at")


def _init_cache(config, rows, length, mesh, rules):
    """Zeroed per-layer `(k_BKHS, v_BKSH)` pairs."""
    dtype = jnp.dtype(config.dtype)
    K, H = config.num_kv_heads, config.head_dim
    return [(jnp.zeros((rows, K, H, length), dtype), jnp.zeros((rows, K, length, H), dtype))
            for _ in range(config.num_layers)]


def _resize(layer, *, length):
    """One layer's `(k_BKHS, v_BKSH)` with `length` slots: cut at the end or padded with zeros."""
    def fit(x, axis):
        if x.shape[axis] >= length:
            return jax.lax.slice_in_dim(x, 0, length, axis=axis)
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, length - x.shape[axis])
        return jnp.pad(x, pad)

    k_BKHS, v_BKSH = layer
    return fit(k_BKHS, 3), fit(v_BKSH, 2)


def _append(state, cache, tokens_AT, starts_A, lengths_A, rows_A, *, graphdef, with_history, mesh, rules):
    """`Transformer.append_rows` over the engine's cache."""
    model = nnx.merge(graphdef, state)
    with activation_sharding(mesh, rules):
        return model.append_rows(tokens_AT, starts_A, lengths_A, rows_A, cache, with_history=with_history)


def _append_paged(state, pools, tokens_AT, starts_A, lengths_A, page_table_AM, *, graphdef, with_history, attention,
                  mesh, rules):
    """`forward_pages` over the rows of an append pass: only their new slots are written."""
    model = nnx.merge(graphdef, state)
    with activation_sharding(mesh, rules):
        _, pools = forward_pages(model, tokens_AT, starts_A, lengths_A, page_table_AM, pools,
                                 with_history=with_history, implementation=attention)
    return pools


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Chunk:
    """The carry of the decode `lax.while_loop`."""

    step: jax.Array  # int32: loop iterations so far, the column the next tokens go to
    cache: list
    last_B: jax.Array  # int32: the pending token each row feeds next
    lengths_B: jax.Array  # int32: slots written per row
    active_B: jax.Array  # bool: the row is decoding
    reply_len_B: jax.Array  # int32: tokens of the current reply so far
    tokens_BN: jax.Array  # int32: this chunk's tokens, from column 0 per row
    logprobs_BN: jax.Array  # float32
    count_B: jax.Array  # int32: tokens recorded this chunk
    finished_B: jax.Array  # bool: the reply ended in this chunk
    stopped_B: jax.Array  # bool: ... on a stop token


def _decode(state, cache, page_table_BM, last_B, lengths_B, active_B, reply_len_B, limit_B, stream_B, turn_B, stops_S,
            seed, temperature_B, top_p_B, top_k_B, allowed_BV, pad_id, exit_after, shrink_at, *, graphdef, num_steps,
            truncate,
            attention, mesh, rules):
    """Decodes every active row until `exit_after` replies finished, at most `shrink_at` rows are
    active (0: none; with `page_table_BM`, in every batch shard's segment), or `num_steps` steps.

    Each iteration feeds every row's pending token at its next slot (idle rows write a slot
    past their real ones, overwritten later or never read), samples the next token of the
    active rows (among `allowed_BV`'s tokens, when given) and records it. With `page_table_BM`
    the cache is the paged pools: the "xla"
    `attention` gathers the rows into contiguous caches for the chunk and writes the new slots
    back at its end (`paged_cache.rows_from_pages`); the kernel reads and writes the pages at
    every step. Returns `(tokens_BN, logprobs_BN, count_B, finished_B, stopped_B, steps)` and
    the cache, which aliases the donated input.
    """
    model = nnx.merge(graphdef, state)
    B = last_B.shape[0]
    base_key = jax.random.key(seed)

    def keys(reply_len_B):
        fold = jax.random.fold_in
        return jax.vmap(lambda s, t, i: fold(fold(fold(base_key, s), t), i))(stream_B, turn_B, reply_len_B)

    segments = batch_shards(mesh, rules) if page_table_BM is not None else 1

    def cond(c: _Chunk):
        busiest = jnp.max(jnp.sum(c.active_B.reshape(segments, -1), axis=1))
        return (c.step < num_steps) & (busiest > shrink_at) & (jnp.sum(c.finished_B) < exit_after)

    gathered = page_table_BM is not None and attention == "xla"

    def extend(c: _Chunk):
        if page_table_BM is None or gathered:
            return model.extend_rows(c.last_B[:, None], c.lengths_B, c.cache)
        return forward_pages(model, c.last_B[:, None], c.lengths_B, c.active_B.astype(jnp.int32), page_table_BM,
                             c.cache, with_history=True, implementation=attention)

    def body(c: _Chunk) -> _Chunk:
        hidden_B1D, cache = extend(c)
        logits_BV = model.logits_from_hidden(hidden_B1D)[:, 0]
        drawn_BV = logits_BV if allowed_BV is None else jnp.where(allowed_BV, logits_BV, -jnp.inf)
        tokens_B = select_tokens(drawn_BV, keys(c.reply_len_B), temperature_B, top_k_B, top_p_B, truncate=truncate)
        logprobs_B = token_logprobs(logits_BV, tokens_B)
        on_B = c.active_B
        grown_B = on_B.astype(jnp.int32)
        reply_len_B = c.reply_len_B + grown_B
        hit_stop_B = jnp.any(tokens_B[:, None] == stops_S[None, :], axis=-1)
        ended_B = on_B & (hit_stop_B | (reply_len_B >= limit_B))
        return _Chunk(
            step=c.step + 1, cache=cache, last_B=jnp.where(on_B, tokens_B, c.last_B),
            lengths_B=c.lengths_B + grown_B, active_B=on_B & ~ended_B, reply_len_B=reply_len_B,
            tokens_BN=jax.lax.dynamic_update_slice(c.tokens_BN, jnp.where(on_B, tokens_B, pad_id)[:, None], (0, c.step)),
            logprobs_BN=jax.lax.dynamic_update_slice(c.logprobs_BN, jnp.where(on_B, logprobs_B, 0.0)[:, None],
                                                     (0, c.step)),
            count_B=c.count_B + grown_B, finished_B=c.finished_B | ended_B, stopped_B=c.stopped_B | (on_B & hit_stop_B),
        )

    with activation_sharding(mesh, rules):
        chunk = _Chunk(
            step=jnp.int32(0), cache=rows_from_pages(cache, page_table_BM) if gathered else cache, last_B=last_B, lengths_B=lengths_B, active_B=active_B,
            reply_len_B=reply_len_B, tokens_BN=jnp.full((B, num_steps), pad_id, jnp.int32),
            logprobs_BN=jnp.zeros((B, num_steps), jnp.float32), count_B=jnp.zeros((B,), jnp.int32),
            finished_B=jnp.zeros((B,), bool), stopped_B=jnp.zeros((B,), bool),
        )
        chunk = jax.lax.while_loop(cond, body, chunk)
        new_cache = chunk.cache
        if gathered:
            new_cache = new_slots_to_pages(cache, chunk.cache, page_table_BM, lengths_B, chunk.count_B, num_steps)
    out = (chunk.tokens_BN, chunk.logprobs_BN, chunk.count_B, chunk.finished_B, chunk.stopped_B, chunk.step)
    return out, new_cache


def generate_on_rows(policy, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                     stop_token_ids: Sequence[int] | None = None, rows: int = 32,
                     refill_fraction: float = 0.25, limits: Sequence[int] | None = None,
                     kv_cache: str = DEFAULT_KV_CACHE, page_size: int = PAGE_SIZE) -> Generation:
    """Samples one reply of up to `max_new_tokens` tokens after each prompt (lists of token ids)
    on a `RowEngine`: `rows` prompts decode at once, a row takes the next prompt as soon as its
    reply ends.

    temperature 0 is greedy decoding; `top_k` 0 and `top_p` 1 disable truncation.
    `stop_token_ids` defaults to the tokenizer's end-of-sequence ids (none without a tokenizer);
    a reply ends after emitting one of them. Prompt i samples with stream i, so replies do not
    depend on `rows`. ``limits[i]`` caps prompt i's reply (`RowEngine.submit`'s ``limit``; None:
    ``max_new_tokens`` for every prompt). `kv_cache` and `page_size` choose the engine's cache
    (`RowEngine`). Every process of a multi-process run must make the same call; all get the
    full result.
    """
    if not prompts:
        raise ValueError("generate_on_rows needs at least one prompt; got an empty prompts list")
    if limits is not None and len(limits) != len(prompts):
        raise ValueError(f"{len(limits)} limits for {len(prompts)} prompts")
    vocab = policy.config.vocab_size
    for i, prompt in enumerate(prompts):
        ids = np.asarray(prompt, np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
    engine = RowEngine(policy, min(rows, len(prompts)), max_new_tokens=max_new_tokens, temperature=temperature,
                       top_p=top_p, top_k=top_k, seed=seed, stop_token_ids=stop_token_ids, kv_cache=kv_cache,
                       page_size=page_size)
    exit_after = max(1, int(np.ceil(refill_fraction * engine.rows)))
    waiting = collections.deque(enumerate(prompts))
    owner: dict[int, int] = {}
    replies: dict[int, Reply] = {}
    try:
        while waiting or engine.num_active:
            for row in engine.free_rows():
                if not waiting:
                    break
                owner[row], prompt = waiting.popleft()
                engine.submit(row, prompt, stream=owner[row], turn=0,
                              limit=None if limits is None else limits[owner[row]])
            for reply in engine.step(exit_after):
                replies[owner[reply.row]] = reply
                engine.release(reply.row)
    finally:
        engine.close()
    n = len(prompts)
    tokens = np.full((n, max_new_tokens), engine.pad_id, np.int32)
    logprobs = np.zeros((n, max_new_tokens), np.float32)
    for i, reply in replies.items():
        tokens[i, : len(reply.tokens)] = reply.tokens
        logprobs[i, : len(reply.tokens)] = reply.logprobs
    stats = engine.stats
    return Generation(
        tokens=tokens, logprobs=logprobs,
        lengths=np.asarray([len(replies[i].tokens) for i in range(n)], np.int32),
        finished=np.asarray([replies[i].stopped for i in range(n)], bool),
        stats=GenerationStats(stats.compile_s, stats.append_s, stats.decode_s, stats.decode_steps,
                              (engine.rows, stats.max_cache_length, engine.num_steps)),
    )
