"""`generate`: batched sampling with a jitted prefill and an in-graph `lax.while_loop` decode.

One call samples continuations for every prompt at once:

1. host: prompts are left-padded into a `(batch, length)` bucket (powers of two) and
   placed on the mesh as global arrays, batch sharded over `(data, fsdp)`;
2. prefill program: one forward pass over the prompts fills a fresh KV cache
   (`prompt bucket + new-token bucket` slots) and returns the last position's logits;
3. decode program: a `lax.while_loop` that samples a token per row, records it and its
   log-prob, and feeds it back through the model, writing the (donated) cache in place.
   It stops when every row has hit a stop token or `max_new_tokens` is reached.

Parameters are arguments of both programs, never constants baked into them, so a
training step can update them without recompiling. Compiled programs are kept per
shape bucket (`GenerationStats.compile_s` is 0 for a call that reused them).
Randomness: row i of a call with seed s draws from `fold_in(fold_in(key(s), i), step)`,
independent of the other rows and of the bucket. Outputs are replicated, so every
process of a multi-process run reads the full result.

The decode program returns the cache it updated in place (its input buffer), so a
later turn could be appended to it (`KVCache.end_index` marks the next free slot);
`generate` frees it and, on CPU, hands the memory back to the OS (`host_memory`).
The mesh and rules come from the policy, so a sampling layout other than training's
only needs a policy placed that way.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from spade_jax.models.policy import Policy
from spade_jax.models.sharding import activation_sharding, logical_to_spec
from spade_jax.models.transformer import KVCache
from spade_jax.sampling.batching import (
    MIN_NEW_TOKENS_BUCKET,
    MIN_PROMPT_BUCKET,
    PromptBatch,
    bucket,
    pad_prompts,
)
from spade_jax.sampling.host_memory import release_freed_memory
from spade_jax.sampling.tokens import select_tokens, token_logprobs


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """Where the time of one `generate` call went (seconds) and which bucket it used."""

    compile_s: float  # building programs for a new bucket (0 when they were cached)
    prefill_s: float
    decode_s: float
    steps: int  # tokens emitted per row by the decode loop before it stopped
    bucket: tuple[int, int, int]  # (batch, prompt length, new tokens) after rounding up

    @property
    def run_s(self) -> float:
        """Wall time of prefill and decode, without compilation."""
        return self.prefill_s + self.decode_s


@dataclasses.dataclass(frozen=True)
class Generation:
    """Sampled continuations of a batch of prompts; row i belongs to prompt i.

    `tokens[i, :lengths[i]]` are the generated ids (the stop token included when
    `finished[i]`); the rest of the row is the pad id with log-prob 0.
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
class _Programs:
    prefill: jax.stages.Compiled
    decode: jax.stages.Compiled


_PROGRAMS: dict[tuple, _Programs] = {}  # one entry per compiled bucket, never evicted


def generate(
    policy: Policy,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    stop_token_ids: Sequence[int] | None = None,
) -> Generation:
    """Samples up to `max_new_tokens` tokens after each prompt (lists of token ids).

    temperature 0 is greedy decoding. `top_k` 0 and `top_p` 1 disable truncation.
    `stop_token_ids` defaults to the tokenizer's end-of-sequence ids (none without a
    tokenizer); a row stops after emitting any of them. Every process of a
    multi-process run must call this with the same arguments; all get the full result.
    """
    cfg = policy.config
    check_sampling_args(max_new_tokens, temperature, top_p, top_k)
    tokenizer = policy.tokenizer
    if stop_token_ids is None:
        stop_token_ids = list(tokenizer.eos_token_ids) if tokenizer is not None else []
    pad_id = int(tokenizer.pad_id) if tokenizer is not None else 0
    mesh, rules = policy.mesh, policy.rules

    B = bucket(len(prompts), 1, batch_shards(mesh, rules))
    T = bucket(max((len(p) for p in prompts), default=1), MIN_PROMPT_BUCKET)
    N = bucket(max_new_tokens, MIN_NEW_TOKENS_BUCKET)
    longest = max((len(p) for p in prompts), default=0) + max_new_tokens
    if longest > cfg.max_position_embeddings:
        raise ValueError(
            f"prompt + max_new_tokens = {longest} tokens exceeds the model's "
            f"max_position_embeddings ({cfg.max_position_embeddings}); shorten the prompt or max_new_tokens"
        )
    batch = pad_prompts(prompts, batch=B, length=T, pad_id=pad_id, vocab_size=cfg.vocab_size)
    stops = np.full((bucket(len(stop_token_ids), 4),), -1, np.int32)
    stops[: len(stop_token_ids)] = np.asarray(stop_token_ids, np.int32)
    truncate = top_k > 0 or top_p < 1

    graphdef, state = nnx.split(policy.model)
    host = _host_inputs(batch, stops, seed, max_new_tokens, temperature, top_p, top_k, pad_id)
    args = place_inputs(host, mesh, rules)

    programs, compile_s = _programs(graphdef, state, args, mesh, rules, N, truncate)

    start = time.perf_counter()
    logits_BV, cache = programs.prefill(state, args["tokens_BT"], args["positions_BT"], args["segment_ids_BT"])
    jax.block_until_ready(logits_BV)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    out, cache = programs.decode(state, cache, logits_BV, *(args[name] for name in _DECODE_INPUTS))
    out = jax.device_get(out)
    decode_s = time.perf_counter() - start
    for buffer in jax.tree.leaves(cache):  # freed now, so that the trim below returns its memory
        buffer.delete()
    release_freed_memory(mesh.devices.flat)

    tokens_BN, logprobs_BN, lengths_B, finished_B, steps = out
    rows, n = batch.num_rows, max_new_tokens
    return Generation(
        tokens=np.asarray(tokens_BN[:rows, :n], np.int32),
        logprobs=np.asarray(logprobs_BN[:rows, :n], np.float32),
        lengths=np.asarray(lengths_B[:rows], np.int32),
        finished=np.asarray(finished_B[:rows], bool),
        stats=GenerationStats(compile_s, prefill_s, decode_s, int(steps), (B, T, N)),
    )


_DECODE_INPUTS = (
    "prompt_lengths_B",
    "done_B",
    "row_ids_B",
    "stops_S",
    "seed",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "pad_id",
)


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


def _host_inputs(batch: PromptBatch, stops, seed, max_new_tokens, temperature, top_p, top_k, pad_id):
    B = batch.shape[0]
    done_B = np.arange(B) >= batch.num_rows
    return {
        "tokens_BT": batch.tokens_BT,
        "positions_BT": batch.positions_BT,
        "segment_ids_BT": batch.segment_ids_BT,
        "prompt_lengths_B": batch.lengths_B,
        "done_B": done_B,
        "row_ids_B": np.arange(B, dtype=np.int32),
        "stops_S": stops,
        "seed": np.asarray(int(seed) % 2**32, np.uint32),
        "max_new_tokens": np.asarray(max_new_tokens, np.int32),
        "temperature": np.asarray(temperature, np.float32),
        "top_p": np.asarray(top_p, np.float32),
        "top_k": np.asarray(top_k, np.int32),
        "pad_id": np.asarray(pad_id, np.int32),
    }


def place_inputs(host: dict, mesh, rules) -> dict:
    """Global arrays built from the (identical on every process) host arrays; batch-leading ones sharded."""
    placed = {}
    for name, value in host.items():
        axes = ("batch",) + (None,) * (value.ndim - 1) if name.endswith(("_B", "_BT")) else (None,) * value.ndim
        sharding = NamedSharding(mesh, logical_to_spec(axes, value.shape, mesh, rules))
        placed[name] = jax.make_array_from_callback(value.shape, sharding, lambda index, v=value: v[index])
    return placed


def _key(graphdef, state, args, mesh, rules, N, truncate) -> tuple:
    params = tuple((x.shape, x.dtype, x.sharding) for x in jax.tree.leaves(state))
    inputs = tuple((name, x.shape, x.sharding) for name, x in args.items())
    return (graphdef, params, inputs, mesh, rules, N, truncate)


def _programs(graphdef, state, args, mesh, rules, N, truncate) -> tuple[_Programs, float]:
    """The programs of this bucket and the seconds spent compiling them (0 when cached)."""
    key = _key(graphdef, state, args, mesh, rules, N, truncate)
    if key in _PROGRAMS:
        return _PROGRAMS[key], 0.0
    start = time.perf_counter()
    B, T = args["tokens_BT"].shape
    replicated = NamedSharding(mesh, PartitionSpec())
    prefill = jax.jit(
        _prefill, static_argnames=("graphdef", "cache_length", "mesh", "rules")
    ).lower(
        state, args["tokens_BT"], args["positions_BT"], args["segment_ids_BT"],
        graphdef=graphdef, cache_length=T + N, mesh=mesh, rules=rules,
    ).compile()
    logits_BV, cache = prefill.out_info
    decode = jax.jit(
        _decode,
        static_argnames=("graphdef", "num_new", "truncate", "mesh", "rules"),
        donate_argnames=("cache",),
        out_shardings=(replicated, jax.tree.map(lambda x: x.sharding, cache)),
    ).lower(
        state, cache, logits_BV, *(args[name] for name in _DECODE_INPUTS),
        graphdef=graphdef, num_new=N, truncate=truncate, mesh=mesh, rules=rules,
    ).compile()
    _PROGRAMS[key] = _Programs(prefill, decode)
    return _PROGRAMS[key], time.perf_counter() - start


def _prefill(state, tokens_BT, positions_BT, segment_ids_BT, *, graphdef, cache_length, mesh, rules):
    """Prompt forward pass into a fresh cache; logits of each row's last prompt token."""
    model = nnx.merge(graphdef, state)
    with activation_sharding(mesh, rules):
        cache = KVCache.init(model.config, tokens_BT.shape[0], cache_length)
        hidden_BTD, cache = model.hidden_and_cache(tokens_BT, positions_BT, segment_ids_BT, cache, cache_is_empty=True)
        logits_BV = model.logits_from_hidden(hidden_BTD[:, -1:])[:, 0]
    return logits_BV, cache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _DecodeLoop:
    """The carry of the decode `lax.while_loop`."""

    step: jax.Array  # int32 scalar: tokens recorded per row so far, the column the next one goes to
    cache: KVCache
    last_B: jax.Array  # int32: each row's latest token, the next step's model input
    tokens_BN: jax.Array  # int32: recorded tokens, pad id where a row was done
    logprobs_BN: jax.Array  # float32: their log-probs, 0 where a row was done
    lengths_B: jax.Array  # int32: tokens recorded while the row was active
    done_B: jax.Array  # bool: the row has emitted a stop token (or is a padding row)


def _decode(
    state, cache, logits_BV, prompt_lengths_B, done_B, row_ids_B, stops_S, seed,
    max_new_tokens, temperature, top_p, top_k, pad_id,
    *, graphdef, num_new, truncate, mesh, rules,
):
    """The in-graph decode loop.

    Returns `(tokens_BN, logprobs_BN, lengths_B, finished_B, steps)` and the cache, which aliases
    the donated input cache so that the loop updates it in place.
    """
    model = nnx.merge(graphdef, state)
    B = logits_BV.shape[0]
    base_key = jax.random.key(seed)
    row_keys_B = jax.vmap(lambda r: jax.random.fold_in(base_key, r))(row_ids_B)

    def choose(logits_BV, step):
        step_keys_B = jax.vmap(lambda k: jax.random.fold_in(k, step))(row_keys_B)
        tokens_B = select_tokens(logits_BV, step_keys_B, temperature, top_k, top_p, truncate=truncate)
        return tokens_B, token_logprobs(logits_BV, tokens_B)

    def record(loop: _DecodeLoop, step, tokens_B, logprobs_B) -> _DecodeLoop:
        """`loop` with the tokens chosen at `step` (and their log-probs) written for the active rows."""
        active_B = ~loop.done_B
        tokens_BN = jax.lax.dynamic_update_slice(
            loop.tokens_BN, jnp.where(active_B, tokens_B, pad_id)[:, None], (0, step)
        )
        logprobs_BN = jax.lax.dynamic_update_slice(
            loop.logprobs_BN, jnp.where(active_B, logprobs_B, 0.0)[:, None], (0, step)
        )
        lengths_B = loop.lengths_B + active_B.astype(jnp.int32)
        hit_stop_B = jnp.any(tokens_B[:, None] == stops_S[None, :], axis=-1)
        return dataclasses.replace(
            loop, tokens_BN=tokens_BN, logprobs_BN=logprobs_BN, lengths_B=lengths_B,
            done_B=loop.done_B | (active_B & hit_stop_B),
        )

    with activation_sharding(mesh, rules):
        tokens_BN = jnp.full((B, num_new), pad_id, jnp.int32)
        logprobs_BN = jnp.zeros((B, num_new), jnp.float32)
        lengths_B = jnp.zeros((B,), jnp.int32)
        tokens_B, logprobs_B = choose(logits_BV, 0)
        loop = _DecodeLoop(
            step=jnp.int32(1), cache=cache, last_B=tokens_B,
            tokens_BN=tokens_BN, logprobs_BN=logprobs_BN, lengths_B=lengths_B, done_B=done_B,
        )
        loop = record(loop, 0, tokens_B, logprobs_B)

        def cond(loop: _DecodeLoop):
            return (loop.step < max_new_tokens) & ~jnp.all(loop.done_B)

        def body(loop: _DecodeLoop) -> _DecodeLoop:
            positions_B1 = (prompt_lengths_B + loop.step - 1)[:, None]
            logits_B1V, cache = model(loop.last_B[:, None], positions_B1, jnp.ones_like(positions_B1), loop.cache)
            tokens_B, logprobs_B = choose(logits_B1V[:, 0], loop.step)
            advanced = dataclasses.replace(loop, step=loop.step + 1, cache=cache, last_B=tokens_B)
            return record(advanced, loop.step, tokens_B, logprobs_B)

        loop = jax.lax.while_loop(cond, body, loop)
    return (loop.tokens_BN, loop.logprobs_BN, loop.lengths_B, loop.done_B, loop.step), loop.cache
