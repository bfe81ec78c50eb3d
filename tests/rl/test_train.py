"""The compiled update: packing, exact gradient accumulation, 1 device vs the 8-device mesh."""

import dataclasses

import jax
import numpy as np
import pytest

from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.rl.batch import TrainSequence, pack
from spade_jax.rl.train import LossConfig, OptimConfig, Trainer

CFG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
)


def _sequences(n=10, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(5, 20))
        mask = np.zeros(length, bool)
        mask[length // 2 :] = True
        out.append(
            TrainSequence(
                tokens=rng.integers(0, 64, length),
                loss_mask=mask,
                sampler_logprobs=np.where(mask, -4.0, 0.0),
                advantage=float(rng.normal()),
                weight=1.0 + (i % 3),
                role="designer" if i % 2 else "agent",
            )
        )
    return out


def test_pack_places_every_generated_token_once_with_next_token_targets():
    seqs = _sequences()
    batch = pack(seqs, row_length=32, row_multiple=4)
    assert batch.num_rows % 4 == 0 and batch.num_rows & (batch.num_rows - 1) == 0
    # every generated token except a sequence's first token is a target exactly once
    assert batch.target_mask_RT.sum() == sum(int(s.loss_mask[1:].sum()) for s in seqs)
    # a target is the next token in the same segment
    r, t = np.argwhere(batch.target_mask_RT)[0]
    assert batch.targets_RT[r, t] == batch.tokens_RT[r, t + 1]
    assert batch.segment_ids_RT[r, t] == batch.segment_ids_RT[r, t + 1]
    # positions restart at every segment
    starts = np.argwhere(batch.positions_RT == 0)
    for r, t in starts:
        if batch.segment_ids_RT[r, t]:
            assert t == 0 or batch.segment_ids_RT[r, t - 1] != batch.segment_ids_RT[r, t]
    assert set(np.unique(batch.weights_RT[batch.target_mask_RT])) <= {1.0, 2.0, 3.0}


def test_pack_cuts_overlong_sequences_and_reports_them():
    seq = TrainSequence(np.arange(50) % 64, np.ones(50, bool), np.zeros(50), advantage=1.0)
    batch = pack([seq], row_length=16)
    assert batch.truncated_sequences == 1 and batch.target_mask_RT.sum() == 15


def _run(mesh, micro_rows, steps=2):
    policy = random_policy(CFG, seed=1, mesh=mesh)
    # eps=1 makes Adam's step smooth in the gradient, so float-level gradient noise
    # between layouts cannot flip the sign of near-zero updates.
    trainer = Trainer(policy, OptimConfig(lr=1e-2, eps=1.0), LossConfig(micro_batch_rows=micro_rows))
    batch = pack(_sequences(), row_length=32, row_multiple=4)
    metrics = [trainer.update(batch) for _ in range(steps)]
    return policy.logits(batch.tokens_RT[:2]), metrics


def test_update_same_on_one_device_and_eight_device_mesh_and_under_accumulation():
    one = make_mesh((1, 1, 1), jax.devices()[:1])
    eight = make_mesh((2, 2, 2), jax.devices()[:8])
    ref_logits, ref_metrics = _run(one, 0)
    for mesh, micro in [(one, 2), (eight, 4)]:
        logits, metrics = _run(mesh, micro)
        np.testing.assert_allclose(logits, ref_logits, atol=2e-5)
        for k in ("loss", "grad_norm", "entropy", "tokens"):
            np.testing.assert_allclose(metrics[-1][k], ref_metrics[-1][k], rtol=1e-5)
    # the update moved the policy
    untouched = random_policy(CFG, seed=1, mesh=one).logits(pack(_sequences(), 32, 4).tokens_RT[:2])
    assert np.abs(untouched - ref_logits).max() > 1e-3


def test_nll_objective_lowers_loss_on_repeated_batch():
    policy = random_policy(CFG, seed=0)
    trainer = Trainer(policy, OptimConfig(lr=3e-3, weight_decay=0.0), LossConfig(objective="nll"))
    batch = pack(_sequences(4), row_length=32)
    first = trainer.update(batch)["nll"]
    for _ in range(20):
        last = trainer.update(batch)["nll"]
    assert last < 0.5 * first


def test_rows_not_divisible_by_data_parallel_is_a_clear_error():
    trainer = Trainer(random_policy(CFG, mesh=make_mesh((4, 1, 1), jax.devices()[:4])))
    batch = pack(_sequences(2), row_length=64, row_multiple=1)
    with pytest.raises(ValueError, match="data-parallel"):
        trainer.update(batch)


def test_query_blocked_attention_equals_full_attention_wherever_a_token_sees_a_key():
    from spade_jax.models.transformer import attention, causal_self_attention

    rng = np.random.default_rng(0)
    B, T, N, K, H = 2, 300, 4, 2, 8  # query blocks of 128, 128, 44
    q, k, v = (rng.standard_normal((B, T, n, H)).astype(np.float32) for n in (N, K, K))
    segments = np.zeros((B, T), np.int32)
    segments[0, :120], segments[0, 120:290] = 1, 2  # two packed sequences, then padding
    segments[1, :] = 1
    t = np.arange(T)
    mask = (t[:, None] >= t[None]) & (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0)
    full = np.asarray(attention(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask))
    blocked = np.asarray(jax.jit(causal_self_attention)(q, k, v, mask))
    real = segments > 0
    np.testing.assert_allclose(blocked[real], full[real], atol=1e-6)


def _long_sequences(n=7, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(40, 300))
        mask = np.zeros(length, bool)
        mask[length // 2 :] = True
        out.append(TrainSequence(rng.integers(0, 64, length), mask, np.where(mask, -4.0, 0.0), float(rng.normal())))
    return out


@pytest.mark.parametrize("objective, remat, chunk", [("pg", "dots", 64), ("nll", "full", 100)])
def test_remat_and_chunked_masked_head_leave_the_update_unchanged(objective, remat, chunk):
    """Rows of 320 tokens: several query blocks; head chunks of 64 with the later ones skipped
    (no masked target there in any row), or of 100 with a padded last chunk."""
    batch = pack(_long_sequences(), row_length=320, row_multiple=4)
    assert batch.target_mask_RT.sum(1).max() < 3 * 64  # some head chunks are skipped

    def run(remat, chunk):
        policy = random_policy(CFG, seed=1, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
        loss = LossConfig(objective=objective, remat=remat, logits_chunk=chunk)
        trainer = Trainer(policy, OptimConfig(lr=1e-2, eps=1.0), loss)
        anchor = trainer.logprobs(batch) if objective == "pg" else None
        return anchor, trainer.update(batch), trainer.params

    ref_anchor, ref_metrics, ref_params = run("none", 0)
    anchor, metrics, params = run(remat, chunk)
    if objective == "pg":
        np.testing.assert_allclose(anchor, ref_anchor, atol=2e-5)
    for k in ("loss", "grad_norm") + (("entropy", "clip_frac") if objective == "pg" else ("nll",)):
        np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-5, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), params, ref_params)


def test_unknown_remat_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="remat policy 'some'"):
        Trainer(random_policy(CFG), loss=LossConfig(remat="some"))


@pytest.mark.parametrize("devices", [1, 8])
def test_repeated_updates_of_one_shape_compile_once(devices):
    shape = (1, 1, 1) if devices == 1 else (2, 2, 2)
    trainer = Trainer(random_policy(CFG, seed=1, mesh=make_mesh(shape, jax.devices()[:devices])), OptimConfig(lr=1e-3))
    batch = pack(_sequences(), row_length=32, row_multiple=4)
    for _ in range(3):
        trainer.update(batch)
    assert trainer._update._cache_size() == 1


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2, 2)])
def test_kl_to_the_initial_policy_runs_and_is_zero_only_before_the_first_step(shape):
    mesh = make_mesh(shape, jax.devices()[:int(np.prod(shape))])
    policy = random_policy(CFG, seed=1, mesh=mesh)
    start = policy.logits(pack(_sequences(), 32, 4).tokens_RT[:2])
    trainer = Trainer(policy, OptimConfig(lr=1e-2), LossConfig(kl_coef=0.5, micro_batch_rows=2))
    batch = pack(_sequences(), row_length=32, row_multiple=4)
    kls = [trainer.update(batch)["ref_kl"] for _ in range(3)]
    assert kls[0] == 0.0 and kls[1] > 1e-3 and kls[2] > 1e-3  # the reference stays the initial policy
    assert np.abs(policy.logits(batch.tokens_RT[:2]) - start).max() > 1e-3


def test_zero_advantages_leave_the_policy_unchanged_and_nonzero_ones_move_it():
    """Guards the update tests above: without weight decay, only advantages move parameters."""
    def moved(advantage):
        policy = random_policy(CFG, seed=2)
        start = policy.logits(pack(_sequences(), 32, 4).tokens_RT[:2])
        sequences = [dataclasses.replace(s, advantage=advantage) for s in _sequences()]
        trainer = Trainer(policy, OptimConfig(lr=1e-2, weight_decay=0.0), LossConfig())
        trainer.update(pack(sequences, row_length=32, row_multiple=4))
        return np.abs(policy.logits(pack(_sequences(), 32, 4).tokens_RT[:2]) - start).max()

    assert moved(0.0) == 0.0 and moved(1.0) > 1e-3


def test_adam_moments_are_sharded_like_their_parameters():
    trainer = Trainer(random_policy(CFG, mesh=make_mesh((1, 8, 1), jax.devices()[:8])))
    params = jax.tree.leaves(trainer.params)
    adam = next(s for s in trainer.opt_state[1] if hasattr(s, "mu"))
    for moments in (adam.mu, adam.nu):
        for param, moment in zip(params, jax.tree.leaves(moments)):
            assert moment.sharding.spec == param.sharding.spec
    assert any(axis is not None for param in params for axis in param.sharding.spec)  # not vacuous
