"""The demo and the benchmarks decode the tokens they decoded on `sampling.sampler.generate`.

`generate` (one prefill and one in-graph decode loop per call; removed in 66e45dc) served
`spade_jax/demo.py`, `bench/sampler_vs_hf.py`, the designer prompts of
`experiments/bootstrap/tiny_bootstrap.py` and `experiments/bootstrap/designer_repeats.py`, and the
lock-step turns of `bench/rollout.py`, until they moved onto the rollout engine (`generate_on_rows`, issue 49). Each case below is one of those calls (its
settings, prompt lengths and stop tokens) on a 2-layer model whose weights are drawn by numpy, so
they do not depend on JAX's initialisers; the golden tokens are what `generate` returned at
commit b45368a, greedy. Every greedy step's top two logits differ by at least 0.035 here, far
beyond float32 rounding, so a mismatch is a change of behaviour, not of arithmetic.

Sampled replies cannot match by construction: `generate` drew row i's token j from
`fold_in(fold_in(key(seed), i), j)`, the engine draws from `(seed, stream, turn, index)`; the
distribution of the engine's draws is checked in `tests/sampling/test_sampling.py`.
"""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest
from flax import nnx

from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.sampling import generate_on_rows

CONFIG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8)
TOKENIZER = types.SimpleNamespace(eos_token_ids=(5, 7), pad_id=3)  # what the decoders read of a tokenizer


def _prompts(seed: int, lengths) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(8, CONFIG.vocab_size, n).tolist() for n in lengths]


# name: (the call's arguments, golden tokens per prompt, their log-prob sums, which rows ended on a stop token)
CASES = {
    # spade_jax/demo.py --temperature=0 (its top_p stays 0.95); the tokenizer's stop tokens
    "demo": (
        dict(prompts=_prompts(1, [9, 14, 11, 20, 6, 17, 12, 8]), max_new_tokens=24, temperature=0.0, top_p=0.95,
             seed=0),
        [[90, 94, 75, 39, 8, 25, 76, 95, 66, 49, 40, 65, 25, 79, 70, 6, 65, 65, 24, 19, 1, 40, 57, 25],
         [42, 4, 24, 17, 58, 55, 10, 25, 84, 77, 93, 36, 19, 27, 65, 42, 4, 79, 80, 42, 4, 24, 23, 83],
         [10, 93, 38, 90, 32, 14, 47, 79, 79, 79, 79, 79, 38, 6, 1, 30, 37, 10, 2, 24, 19, 14, 54, 54],
         [76, 93, 79, 94, 76, 75, 25, 30, 72, 0, 10, 31, 30, 49, 85, 67, 73, 72, 27, 44, 76, 10, 79, 84],
         [40, 47, 36, 17, 25, 76, 54, 12, 90, 24, 79, 83, 49, 25, 23, 63, 30, 24, 62, 36, 86, 79, 40, 90],
         [80, 4, 79, 67, 57, 65, 49, 66, 23, 78, 11, 76, 27, 10, 79, 26, 77, 83, 80, 30, 49, 84, 38, 19],
         [78, 4, 49, 80, 76, 7],
         [24, 25, 25, 31, 79, 55, 3, 30, 85, 61, 79, 55, 3, 61, 9, 14, 94, 73, 25, 4, 79, 6, 94, 33]],
        [-3.8654, -7.5434, -5.4224, -4.4464, -5.9229, -3.449, -1.5091, -6.0436],
        [False, False, False, False, False, False, True, False],
    ),
    # bench/sampler_vs_hf.py: greedy, prompts of one length, no stop tokens
    "sampler_vs_hf": (
        dict(prompts=_prompts(2, [16, 16, 16]), max_new_tokens=20, temperature=0.0, stop_token_ids=[]),
        [[76, 19, 30, 76, 38, 83, 1, 39, 30, 25, 40, 25, 2, 77, 3, 65, 36, 83, 47, 25],
         [67, 49, 24, 15, 53, 49, 77, 6, 14, 23, 79, 1, 27, 30, 61, 84, 49, 49, 49, 59],
         [79, 94, 42, 72, 79, 84, 59, 66, 49, 36, 76, 30, 25, 11, 25, 4, 1, 72, 49, 50]],
        [-3.1404, -3.3322, -5.9174],
        [False, False, False],
    ),
    # experiments/bootstrap/tiny_bootstrap.py and designer_repeats.py at temperature 0: designer prompts
    "designer": (
        dict(prompts=_prompts(3, [41, 57, 33, 60, 48, 38]), max_new_tokens=40, temperature=0.0, top_p=1.0, top_k=0,
             seed=0),
        [[92, 70, 77, 79, 67, 4, 79, 84, 6, 80, 92, 93, 86, 85, 2, 30, 29, 76, 11, 30, 49, 23, 5],
         [77, 48, 19, 5],
         [70, 67, 73, 5],
         [3, 36, 10, 68, 61, 30, 77, 49, 49, 62, 30, 19, 79, 84, 79, 75, 61, 36, 14, 93, 25, 67, 53, 1, 54, 25, 66,
          73, 19, 19, 86, 26, 10, 79, 25, 4, 6, 80, 40, 25],
         [7],
         [79, 86, 30, 86, 30, 76, 55, 85, 30, 0, 1, 48, 30, 3, 6, 9, 42, 68, 25, 22, 5]],
        [-6.0537, -0.0261, -0.3073, -9.4188, -0.0954, -4.0429],
        [True, True, True, False, True, True],
    ),
    # bench/rollout.py --engines=lockstep at temperature 0: one turn's whole conversations
    "lockstep": (
        dict(prompts=_prompts(4, [70, 95, 120, 83, 101]), max_new_tokens=16, temperature=0.0, top_p=1.0, top_k=0,
             seed=12345),
        [[36, 79, 51, 57, 49, 53, 49, 49, 53, 48, 79, 42, 65, 14, 28, 30],
         [3, 42, 11, 54, 85, 42, 79, 80, 72, 65, 66, 42, 66, 67, 55, 94],
         [68, 77, 4, 61, 29, 79, 25, 5],
         [19, 75, 64, 47, 26, 14, 67, 84, 86, 67, 6, 49, 54, 70, 14, 4],
         [65, 66, 84, 76, 36, 12, 6, 44, 76, 1, 0, 1, 15, 28, 25, 73]],
        [-4.6864, -2.0494, -1.2447, -3.2217, -3.7613],
        [False, False, True, False, False],
    ),
}


@pytest.fixture(scope="module")
def policy():
    """`CONFIG` with weights from numpy: standard normals times 2 (norm scales 1)."""
    policy = random_policy(CONFIG, TOKENIZER, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    rng = np.random.default_rng(0)
    state = nnx.state(policy.model)

    def draw(x):
        value = np.ones(x.shape) if x.ndim == 1 else 2.0 * rng.standard_normal(x.shape)
        return jax.device_put(value.astype(x.dtype), x.sharding)

    nnx.replace_by_pure_dict(state, jax.tree.map(draw, nnx.to_pure_dict(state)))
    nnx.update(policy.model, state)
    return policy


def test_the_golden_tokens_are_this_models_greedy_tokens(policy):
    """A full forward pass's argmax gives each golden token (every case's rows in one batch, padded
    at the end): a failure here means the model or its weights changed (record the goldens again),
    not the decoder."""
    rows = [(prompt, reply) for call, tokens, _, _ in CASES.values() for prompt, reply in zip(call["prompts"], tokens)]
    T = max(len(prompt) + len(reply) for prompt, reply in rows)
    tokens_BT = np.zeros((len(rows), T), np.int32)
    segments_BT = np.zeros((len(rows), T), np.int32)
    for i, (prompt, reply) in enumerate(rows):
        tokens_BT[i, : len(prompt) + len(reply)] = prompt + reply
        segments_BT[i, : len(prompt) + len(reply)] = 1
    argmax_BT = np.argmax(policy.logits(tokens_BT, segments_BT), -1)
    for i, (prompt, reply) in enumerate(rows):
        assert argmax_BT[i, len(prompt) - 1: len(prompt) + len(reply) - 1].tolist() == reply, i


@pytest.mark.parametrize("name", CASES)
def test_each_caller_decodes_the_tokens_generate_gave(policy, name):
    call, tokens, logprob_sums, finished = CASES[name]
    generation = generate_on_rows(policy, **call)
    assert [generation.row_tokens(i) for i in range(len(tokens))] == tokens
    assert generation.finished.tolist() == finished
    assert generation.tokens.shape == (len(tokens), call["max_new_tokens"])
    for i, reply in enumerate(tokens):
        assert (generation.tokens[i, len(reply):] == TOKENIZER.pad_id).all()
        assert (generation.logprobs[i, len(reply):] == 0).all()
    np.testing.assert_allclose(generation.logprobs.sum(1), logprob_sums, atol=2e-3)
