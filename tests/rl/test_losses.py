"""Clipped PG loss, TIS, KL, masking and micro-batch exactness against hand-computed values."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.rl import losses as L

OLD = math.log(0.4)
LN = math.log


def _batch():
    """B=2, T=4. Row 0: A=+2, ratios 1.5, 0.5, 1.0, then padding. Row 1: A=-1, a masked
    prompt token holding garbage, then ratios 1.5, 0.5, 1.1."""
    old = jnp.full((2, 4), OLD)
    logp = jnp.array([[OLD + LN(1.5), OLD + LN(0.5), OLD, jnp.nan],
                      [-1e30, OLD + LN(1.5), OLD + LN(0.5), OLD + LN(1.1)]])
    mask = jnp.array([[1, 1, 1, 0], [0, 1, 1, 1]], jnp.float32)
    adv = jnp.array([2.0, -1.0])
    return logp, old, adv, mask


def test_clipping_on_both_sides_by_hand():
    logp, old, adv, mask = _batch()
    t = L.pg_loss_terms(logp, old, adv, mask)
    # row 0 (A=2): r=1.5 clipped high -> -2*1.28; r=0.5 -> -1; r=1 -> -2
    # row 1 (A=-1): r=1.5 -> 1.5; r=0.5 clipped low -> 0.8; r=1.1 -> 1.1
    assert float(t.loss_sum) == pytest.approx(-2.56 - 1.0 - 2.0 + 1.5 + 0.8 + 1.1, abs=1e-5)
    assert float(t.token_count) == 6
    m = t.metrics
    assert (float(m["clip_high_sum"]), float(m["clip_low_sum"]), float(m["clip_frac_sum"])) == (1, 1, 2)
    assert float(m["ratio_sum"]) == pytest.approx(6.1, abs=1e-5)
    assert float(m["ratio_min"]) == pytest.approx(0.5) and float(m["ratio_max"]) == pytest.approx(1.5)
    k3 = lambda r: r - 1 - math.log(r)  # noqa: E731
    assert float(m["approx_kl_sum"]) == pytest.approx(2 * k3(1.5) + 2 * k3(0.5) + k3(1.1), abs=1e-5)
    assert float(m["tis_sum"]) == 6 and float(m["tis_capped_sum"]) == 0


def test_gradients_zero_on_clipped_tokens_and_minus_a_ratio_elsewhere():
    logp, old, adv, mask = _batch()
    g = jax.grad(lambda lp: L.pg_loss_terms(lp, old, adv, mask).loss_sum)(logp)
    np.testing.assert_allclose(np.asarray(g), [[0.0, -1.0, -2.0, 0.0], [0.0, 1.5, 0.0, 1.1]],
                               atol=1e-5)
    assert np.isfinite(np.asarray(g)).all()


def test_per_token_advantages_and_sequence_weights():
    logp, old, adv, mask = _batch()
    per_seq = L.pg_loss_terms(logp, old, adv, mask)
    per_tok = L.pg_loss_terms(logp, old, jnp.broadcast_to(adv[:, None], (2, 4)), mask)
    assert float(per_tok.loss_sum) == pytest.approx(float(per_seq.loss_sum))
    w = L.pg_loss_terms(logp, old, adv, mask, weights_B=jnp.array([0.5, 2.0]))
    assert float(w.loss_sum) == pytest.approx(0.5 * -5.56 + 2.0 * 3.4, abs=1e-5)
    assert float(w.token_count) == 6  # weights scale the numerator only


def test_truncated_importance_sampling_weight():
    old = jnp.full((1, 3), OLD)
    sampler = old - jnp.log(jnp.array([[3.0, 0.5, 1.0]]))  # exp(old - sampler) = 3, .5, 1
    mask = jnp.ones((1, 3))
    adv = jnp.array([1.0])

    def f(lp):
        return L.pg_loss_terms(lp, old, adv, mask, sampler_logprobs_BT=sampler, tis_cap=2.0)

    t = f(old)
    assert float(t.loss_sum) == pytest.approx(-(2.0 + 0.5 + 1.0), abs=1e-6)
    assert float(t.metrics["tis_capped_sum"]) == 1
    assert float(t.metrics["tis_sum"]) == pytest.approx(3.5, abs=1e-6)
    g = jax.grad(lambda lp: f(lp).loss_sum)(old)
    np.testing.assert_allclose(np.asarray(g), [[-2.0, -0.5, -1.0]], atol=1e-6)
    assert float(L.pg_loss_terms(old, old, adv, mask).loss_sum) == pytest.approx(-3.0)


def test_k3_kl_term_value_and_gradient():
    logp = jnp.array([[OLD, OLD]])
    ref = jnp.array([[OLD + LN(2.0), OLD]])  # ref - logp = ln 2, then 0
    mask = jnp.ones((1, 2))
    adv = jnp.zeros((1,))

    def f(lp):
        return L.pg_loss_terms(lp, logp, adv, mask, ref_logprobs_BT=ref, kl_coef=0.1)

    t = f(logp)
    kl = 2.0 - math.log(2.0) - 1.0
    assert float(t.loss_sum) == pytest.approx(0.1 * kl, abs=1e-6)
    assert float(t.metrics["ref_kl_sum"]) == pytest.approx(kl, abs=1e-6)
    g = jax.grad(lambda lp: f(lp).loss_sum)(logp)  # d/dlogp = coef * (1 - exp(ref - logp))
    np.testing.assert_allclose(np.asarray(g), [[0.1 * (1 - 2.0), 0.0]], atol=1e-6)


def test_masked_tokens_change_nothing():
    logp, old, adv, mask = _batch()
    other = logp.at[0, 3].set(5.0).at[1, 0].set(-3.0)  # only masked positions differ
    a = L.pg_loss_terms(logp, old, adv, mask, sampler_logprobs_BT=old - 50.0 * (1 - mask),
                        ref_logprobs_BT=old, kl_coef=0.5)
    b = L.pg_loss_terms(other, old, adv, mask, ref_logprobs_BT=old, kl_coef=0.5)
    assert np.isfinite(float(a.loss_sum))
    assert float(a.loss_sum) == pytest.approx(float(b.loss_sum), abs=1e-5)


def _random_batch(seed, B=4, T=7):
    k = jax.random.split(jax.random.key(seed), 6)
    logp = -jax.random.uniform(k[0], (B, T), minval=0.1, maxval=3.0)
    old = logp + 0.3 * jax.random.normal(k[1], (B, T))
    sampler = old + 0.2 * jax.random.normal(k[2], (B, T))
    ref = logp + 0.1 * jax.random.normal(k[3], (B, T))
    adv = jax.random.normal(k[4], (B,))
    lengths = jnp.array([2, 7, 5, 3])
    mask = (jnp.arange(T)[None, :] < lengths[:, None]).astype(jnp.float32)
    weights = jnp.array([1.0, 0.5, 2.0, 1.0])
    return logp, old, sampler, ref, adv, mask, weights


def test_two_micro_batches_equal_one_big_batch():
    batch = _random_batch(0)

    @jax.jit
    def terms_and_grad(lp, old, sampler, ref, adv, mask, weights):
        def f(lp):
            t = L.pg_loss_terms(lp, old, adv, mask, sampler_logprobs_BT=sampler,
                                weights_B=weights, ref_logprobs_BT=ref, kl_coef=0.05)
            return t.loss_sum, t
        (_, t), g = jax.value_and_grad(f, has_aux=True)(lp)
        return t, g

    def run(rows):
        return terms_and_grad(*(x[rows] for x in batch))

    big, g_big = run(slice(0, 4))
    (t1, g1), (t2, g2) = run(slice(0, 1)), run(slice(1, 4))  # uneven: 2 and 15 tokens
    acc = L.accumulate(t1, t2)
    mb, ma = L.mean_metrics(big), L.mean_metrics(acc)
    assert set(mb) == set(ma)
    for k in mb:
        np.testing.assert_allclose(float(ma[k]), float(mb[k]), rtol=1e-6, err_msg=k)
    # gradient of the token mean: micro-batch gradients of loss_sum over the total count
    g_acc = np.concatenate([np.asarray(g1), np.asarray(g2)]) / float(acc.token_count)
    np.testing.assert_allclose(g_acc, np.asarray(g_big) / float(big.token_count), rtol=1e-5, atol=1e-7)

    naive = (float(L.mean_metrics(t1)["loss"]) + float(L.mean_metrics(t2)["loss"])) / 2
    assert abs(naive - float(mb["loss"])) > 1e-3  # averaging micro-batch means would be wrong

    # an accumulation loop may start from identity_terms: it changes no value, min or max
    start = L.accumulate(L.accumulate(L.identity_terms(t1), t1), t2)
    for k, v in acc._asdict().items():
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), start._asdict()[k], v)
    assert np.isinf(float(L.identity_terms(t1).metrics["ratio_min"]))


def test_jit_and_all_masked_batch():
    logp, old, sampler, ref, adv, mask, weights = _random_batch(1)
    f = jax.jit(lambda *a: L.mean_metrics(L.pg_loss_terms(*a, sampler_logprobs_BT=sampler)))
    out = f(logp, old, adv, mask)
    assert all(np.isfinite(float(v)) for v in out.values())
    empty = L.mean_metrics(L.pg_loss_terms(logp, old, adv, jnp.zeros_like(mask)))
    assert float(empty["loss"]) == 0.0 and float(empty["tokens"]) == 0.0


def test_token_logprobs_and_entropy_by_hand():
    logits = jnp.log(jnp.array([[[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]]))  # probs 1/6 2/6 3/6; uniform
    lp = L.token_logprobs(logits, jnp.array([[2, 0]]))
    np.testing.assert_allclose(np.asarray(lp), [[math.log(0.5), math.log(1 / 3)]], atol=1e-6)
    h = -(1 / 6 * math.log(1 / 6) + 1 / 3 * math.log(1 / 3) + 1 / 2 * math.log(1 / 2))
    np.testing.assert_allclose(np.asarray(L.entropy(logits)), [[h, math.log(3)]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(L.entropy(logits, jnp.array([[1, 0]]))), [[h, 0.0]], atol=1e-6)
    both = L.token_logprobs_and_entropy(logits, jnp.array([[2, 0]]))
    np.testing.assert_allclose(np.asarray(both[0]), np.asarray(lp), atol=1e-7)
    np.testing.assert_allclose(np.asarray(both[1]), [[h, math.log(3)]], atol=1e-6)
    # the entropy is a metric: no gradient flows through it
    g = jax.grad(lambda x: jnp.sum(L.token_logprobs_and_entropy(x, jnp.array([[2, 0]]))[1]))(logits)
    assert not np.any(np.asarray(g))


def test_logprobs_and_entropy_stable_in_bfloat16_with_huge_logits():
    logits = jnp.array([[[1e4, 0.0, -1e4]]], dtype=jnp.bfloat16)
    lp = L.token_logprobs(logits, jnp.array([[1]]))
    assert lp.dtype == jnp.float32 and float(lp[0, 0]) == pytest.approx(-1e4, rel=1e-2)
    ent = L.entropy(logits)
    assert ent.dtype == jnp.float32 and np.isfinite(float(ent[0, 0])) and float(ent[0, 0]) == pytest.approx(0.0, abs=1e-6)
