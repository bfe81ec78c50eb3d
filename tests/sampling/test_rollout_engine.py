"""The rollout engine: KV cache kept across turns, rows refilled, episodes equal to the lock-step engine."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from spade_jax.agent import AgentConfig, EpisodeRequest, play_episodes
from spade_jax.agent.rollout import RolloutStats
from spade_jax.envs import library
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.sampling.engine import MAX_APPEND_TOKENS, RowEngine, generate_on_rows
from spade_jax.sandbox import SandboxConfig, SandboxPool

SMALL = ModelConfig(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, family="qwen3", qk_norm=True,
)
STOP = 3


def _policy(devices: int, tokenizer=None, config=SMALL):
    shape = {1: (1, 1, 1), 8: (2, 2, 2)}[devices]
    return random_policy(config, tokenizer, seed=7, mesh=make_mesh(shape, jax.devices()[:devices]))


def _full_forward_logprobs(policy, tokens):
    """log softmax of a full forward pass over `tokens`: entry i scores token i+1."""
    logits = policy.logits(np.asarray(tokens, np.int32)[None])[0].astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _run(engine: RowEngine, exit_after: int = 1) -> dict:
    replies = {}
    while engine.num_active:
        for reply in engine.step(exit_after):
            replies[reply.row] = reply
    return replies


def _check_against_full_forward(policy, conversation, reply):
    full = _full_forward_logprobs(policy, conversation + reply.tokens.tolist())
    start = len(conversation)
    for i, token in enumerate(reply.tokens):
        scores = full[start + i - 1]
        assert token == int(np.argmax(scores))
        assert abs(reply.logprobs[i] - scores[token]) <= 1e-4


@pytest.mark.parametrize("devices", [1, 8])
def test_turns_appended_to_the_kept_cache_equal_a_full_prefill(devices):
    """Three turns per row: each later turn appends only its new tokens (some longer than one
    append pass), and every reply token and log-prob equals a full forward pass over the
    whole conversation."""
    policy = _policy(devices)
    rng = np.random.default_rng(0)
    engine = RowEngine(policy, 4, max_new_tokens=12, temperature=0.0, stop_token_ids=[STOP])
    conversations = [rng.integers(4, 128, n).tolist() for n in (5, 40, 90, 150)]
    for turn in range(3):
        for row, tokens in enumerate(conversations):
            engine.submit(row, tokens, stream=row, turn=turn)
        replies = _run(engine)
        for row in range(4):
            _check_against_full_forward(policy, conversations[row], replies[row])
            conversations[row] = conversations[row] + replies[row].tokens.tolist() + rng.integers(
                4, 128, [3, MAX_APPEND_TOKENS + 7, 20, 1][(row + turn) % 4]).tolist()
    appended = engine.stats.appended_tokens
    assert appended < sum(len(c) for c in conversations)  # no turn was prefilled again from its start


def test_a_refilled_row_forgets_its_previous_conversation():
    """Rows of mixed lengths retire and take new conversations (shorter and longer than
    what the row held); each new reply equals a fresh full forward pass."""
    policy = _policy(1)
    rng = np.random.default_rng(1)
    engine = RowEngine(policy, 3, max_new_tokens=10, temperature=0.0, stop_token_ids=[STOP])
    first = [rng.integers(4, 128, n).tolist() for n in (200, 7, 60)]
    for row, tokens in enumerate(first):
        engine.submit(row, tokens, stream=row, turn=0)
    _run(engine, exit_after=3)
    engine.release(0)
    engine.release(1)
    second = {0: rng.integers(4, 128, 9).tolist(), 1: rng.integers(4, 128, 300).tolist()}
    for row, tokens in second.items():
        engine.submit(row, tokens, stream=10 + row, turn=0)
    replies = _run(engine)
    for row, tokens in second.items():
        _check_against_full_forward(policy, tokens, replies[row])
    assert engine.free_rows() == list(range(3, engine.rows))  # 3 rows asked for, rounded up to a power of two


@pytest.mark.parametrize("kv_cache", ["contiguous", "paged"])
def test_a_row_that_fills_its_cache_bucket_keeps_its_last_slot(kv_cache):
    """Row 0's prompt and reply fill the smallest cache bucket exactly and it finishes while row 1
    still decodes: its idle writes must not land on its last real slot, which its next turn reads."""
    policy = _policy(1)
    rng = np.random.default_rng(0)
    engine = RowEngine(policy, 2, max_new_tokens=12, temperature=0.0, stop_token_ids=[], kv_cache=kv_cache,
                       page_size=16)
    first = rng.integers(4, 128, 125).tolist()  # 124 slots written, then a 4-token reply: 128 slots
    engine.submit(0, first, stream=0, turn=0, limit=4)
    engine.submit(1, rng.integers(4, 128, 5).tolist(), stream=1, turn=0, limit=12)
    reply = _run(engine, exit_after=2)[0]
    conversation = first + reply.tokens.tolist() + [7]
    engine.submit(0, conversation, stream=0, turn=1, limit=4)
    _check_against_full_forward(policy, conversation, _run(engine)[0])


MIXED = [dict(temperature=0.0), dict(temperature=1.9), dict(temperature=0.7, top_p=0.8), dict(temperature=1.0, top_k=5),
         dict(temperature=1.3, top_p=0.9, top_k=20), dict()]  # the last: the engine's defaults


@pytest.mark.parametrize("kv_cache", ["contiguous", "paged"])
def test_rows_with_different_sampling_settings_decode_together(kv_cache):
    """Six rows, each with its own (temperature, top_p, top_k), decode in one batch: every reply
    equals the one its settings draw in an engine of those settings alone (same stream and turn),
    and the mixed batch compiles at most the two decode programs (with and without the filter)."""
    policy = _policy(1)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(4, 128, n).tolist() for n in (5, 17, 9, 30, 12, 3)]
    paging = dict(kv_cache=kv_cache, page_size=16)
    mixed = RowEngine(policy, 8, max_new_tokens=12, temperature=0.5, stop_token_ids=[STOP], **paging)
    for row, (prompt, settings) in enumerate(zip(prompts, MIXED)):
        mixed.submit(row, prompt, stream=row, turn=3, **settings)
    together = _run(mixed, exit_after=8)
    assert mixed.stats.compiled["decode_paged" if kv_cache == "paged" else "decode"] <= 2
    for row, (prompt, settings) in enumerate(zip(prompts, MIXED)):
        alone = RowEngine(policy, 1, max_new_tokens=12, stop_token_ids=[STOP], **paging,
                          **{"temperature": 0.5, **settings})
        alone.submit(0, prompt, stream=row, turn=3)
        reply = _run(alone)[0]
        assert together[row].tokens.tolist() == reply.tokens.tolist(), (row, settings)
        np.testing.assert_allclose(together[row].logprobs, reply.logprobs, atol=1e-5)
    assert len({tuple(r.tokens.tolist()) for r in together.values()}) > 1


@pytest.mark.parametrize("kv_cache", ["contiguous", "paged"])
def test_a_reply_restricted_to_some_tokens_draws_only_those(kv_cache):
    """Row 0 may draw only three tokens (constrained decoding); row 1, unrestricted, draws what it
    draws alone, and row 0's log-probs stay the unmodified policy's (a full forward pass)."""
    policy = _policy(1)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(4, 128, 20).tolist(), rng.integers(4, 128, 11).tolist()]
    engine = RowEngine(policy, 2, max_new_tokens=10, temperature=1.5, stop_token_ids=[STOP], kv_cache=kv_cache,
                       page_size=16)
    engine.submit(0, prompts[0], stream=0, turn=0, allowed_tokens=[7, 50, 99])
    engine.submit(1, prompts[1], stream=1, turn=0)
    replies = _run(engine, exit_after=2)
    assert set(replies[0].tokens.tolist()) <= {7, 50, 99} and len(replies[0].tokens) == 10
    full = _full_forward_logprobs(policy, prompts[0] + replies[0].tokens.tolist())
    for i, token in enumerate(replies[0].tokens):
        assert abs(replies[0].logprobs[i] - full[len(prompts[0]) + i - 1][token]) <= 1e-4
    alone = RowEngine(policy, 1, max_new_tokens=10, temperature=1.5, stop_token_ids=[STOP], kv_cache=kv_cache,
                      page_size=16)
    alone.submit(0, prompts[1], stream=1, turn=0)
    assert _run(alone)[0].tokens.tolist() == replies[1].tokens.tolist()
    engine.submit(0, engine.history[0], stream=0, turn=1)  # the next reply is unrestricted again
    assert not set(_run(engine)[0].tokens.tolist()) <= {7, 50, 99}


def test_submit_refuses_what_the_row_cannot_take():
    policy = _policy(1)
    engine = RowEngine(policy, 2, max_new_tokens=8, temperature=0.0)
    engine.submit(0, [5, 6, 7], stream=0, turn=0)
    with pytest.raises(ValueError, match="still decoding"):
        engine.submit(0, [5, 6, 7, 8], stream=0, turn=1)
    _run(engine)
    with pytest.raises(ValueError, match="do not extend"):
        engine.submit(0, [9, 9, 9, 9, 9, 9], stream=0, turn=1)
    with pytest.raises(ValueError, match="limit must be"):
        engine.submit(1, [5], stream=1, turn=0, limit=9)
    with pytest.raises(ValueError, match="outside"):
        engine.submit(1, [500], stream=1, turn=0)
    with pytest.raises(ValueError, match="top_p"):
        engine.submit(1, [5], stream=1, turn=0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        engine.submit(1, [5], stream=1, turn=0, temperature=-1.0)
    with pytest.raises(ValueError, match="allowed_tokens"):
        engine.submit(1, [5], stream=1, turn=0, allowed_tokens=[128])


# ---------------------------------------------------------------------------- episodes

ENVS = ("shopping", "number_guess", "tallest", "grid_walk")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2)) as p:
        yield p


@pytest.fixture(scope="module")
def chat_policy(small_tokenizer):
    config = dataclasses.replace(SMALL, vocab_size=small_tokenizer.vocab_size, max_position_embeddings=4096)
    return _policy(1, small_tokenizer, config)


def _requests(n: int, hinted: bool = False):
    return [EpisodeRequest(i, library.load_source(ENVS[i % len(ENVS)]), 100 + i, hinted=hinted,
                           hint_from_solution=hinted) for i in range(n)]


def _same(a, b, logprob_tol=0.0):
    assert [t.end_reason for t in a] == [t.end_reason for t in b]
    assert [t.reward for t in a] == [t.reward for t in b]
    for x, y in zip(a, b):
        assert x.tokens.tolist() == y.tokens.tolist()
        assert x.loss_mask.tolist() == y.loss_mask.tolist()
        assert np.abs(x.sampler_logprobs - y.sampler_logprobs).max() <= logprob_tol
        assert x.messages == y.messages


@pytest.mark.parametrize("every_play_counts,overlap", [(True, False), (False, True)])
def test_greedy_episodes_equal_the_lockstep_engine(chat_policy, pool, every_play_counts, overlap):
    """Six episodes (two hinted) on three rows, so rows are refilled from the queue, equal lock-step
    turns (every turn a fresh engine over each live conversation, written from its first token). The random
    policy's replies mostly run to max_new_tokens: stepped anyway (`every_play_counts`, several
    turns), or each plain one ends its episode unstepped (the default; with the sandbox
    overlapped) while the hinted ones are stepped."""
    cfg = AgentConfig(max_turns=3, max_new_tokens=16, context_budget=1536, temperature=0.0, rows=3,
                      every_play_counts=every_play_counts)
    requests = _requests(4) + _requests(2, hinted=True)
    lockstep = play_episodes(chat_policy, pool, requests, cfg, sample=generate_on_rows)
    stats = RolloutStats()
    engine = play_episodes(chat_policy, pool, requests, dataclasses.replace(cfg, overlap_sandbox=overlap), stats=stats)
    _same(lockstep, engine, logprob_tol=1e-4)
    assert sum(t.loss_mask.sum() for t in engine) > 0
    assert 0 < stats.device_busy_fraction <= 1 and stats.engine.chunks > 1
    if every_play_counts:
        assert max(t.turns for t in engine) >= 2
        return
    stops = set(chat_policy.tokenizer.eos_token_ids)
    cut = [int(t.tokens[-1]) not in stops for t in engine]
    assert any(c and not t.hinted for t, c in zip(engine, cut))
    # plain plays end unstepped at the cut; hinted ones are stepped (the reference's hint phase)
    assert all(t.end_reason == "max_new_tokens" and t.reward == 0.0 for t, c in zip(engine, cut) if c and not t.hinted)
    assert all(t.end_reason != "max_new_tokens" for t in engine if t.hinted)


def test_sampled_episodes_depend_on_the_seed_not_on_the_schedule(chat_policy, pool):
    cfg = AgentConfig(max_turns=3, max_new_tokens=12, context_budget=1536, temperature=1.0, rows=8)
    requests = _requests(6)
    first = play_episodes(chat_policy, pool, requests, cfg, seed=3)
    rescheduled = dataclasses.replace(cfg, rows=2, refill_fraction=1.0, overlap_sandbox=False)
    _same(first, play_episodes(chat_policy, pool, requests, rescheduled, seed=3), logprob_tol=1e-5)
    paged = dataclasses.replace(cfg, rows=4, kv_cache="paged", page_size=16)  # pages, compacted decode chunks
    _same(first, play_episodes(chat_policy, pool, requests, paged, seed=3), logprob_tol=1e-4)
    other = play_episodes(chat_policy, pool, requests, cfg, seed=4)
    assert [t.tokens.tolist() for t in other] != [t.tokens.tolist() for t in first]


def test_no_compilation_after_warm_up(chat_policy, pool):
    """A second identical phase reuses every program: XLA compiles nothing."""
    cfg = AgentConfig(max_turns=2, max_new_tokens=12, context_budget=1536, temperature=0.0, rows=4)
    requests = _requests(5)
    play_episodes(chat_policy, pool, requests, cfg)
    compiles = []

    def listen(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    stats = RolloutStats()
    try:
        play_episodes(chat_policy, pool, requests, cfg, stats=stats)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == [] and sum(stats.engine.compiled.values()) == 0 and stats.engine.compile_s == 0
