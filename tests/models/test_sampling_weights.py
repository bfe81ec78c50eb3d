"""The sampling weights: a bfloat16 copy of the float32 masters, refreshed by each update, and
how far its log-probs drift from the trainer's (the TIS ratio the update corrects)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.models.sampling_weights import SamplingWeights, resolve_sampling_dtype
from spade_jax.rl.batch import TrainSequence, pack
from spade_jax.rl.train import OptimConfig, Trainer
from spade_jax.sampling import generate_on_rows
from spade_jax.selfplay import loop
from tests.selfplay.test_selfplay import _tiny_policy, tiny_selfplay_config

CFG = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, family="qwen3", qk_norm=True)


def _leaves(model) -> dict:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model))}


def _batch(seed=0, rows=4, length=24):
    rng = np.random.default_rng(seed)
    mask = np.arange(length) >= length // 2
    seqs = [TrainSequence(rng.integers(0, CFG.vocab_size, length), mask, np.where(mask, -5.0, 0.0), float(a))
            for a in rng.normal(size=rows)]
    return pack(seqs, row_length=32, row_multiple=2)


def test_auto_is_bfloat16_on_accelerators_and_the_masters_themselves_on_cpu():
    assert resolve_sampling_dtype("auto", "gpu") == jnp.bfloat16 == resolve_sampling_dtype("auto", "tpu")
    assert resolve_sampling_dtype("auto", "cpu") is None
    assert resolve_sampling_dtype("float32", "gpu") == jnp.float32
    with pytest.raises(ValueError, match="sampling dtype"):
        resolve_sampling_dtype("float16")
    policy = random_policy(CFG)
    assert SamplingWeights(policy, "auto").policy is policy  # no copy: nothing to cast on CPU
    assert SamplingWeights(policy, "float32").policy is policy
    assert SamplingWeights(policy, None).policy is policy and Trainer(policy).sampling_policy is policy


def test_the_bfloat16_copy_is_sharded_like_the_masters_and_follows_every_update():
    policy = random_policy(CFG, mesh=make_mesh((2, 2, 2), jax.devices()))
    trainer = Trainer(policy, OptimConfig(lr=1e-2), sampling_dtype="bfloat16")
    sampler = trainer.sampling_policy
    assert sampler is not policy and sampler.model is not policy.model
    masters, copy = _leaves(policy.model), _leaves(sampler.model)
    assert masters.keys() == copy.keys()
    for name, master in masters.items():
        assert master.dtype == jnp.float32
        # matrices in bfloat16; the norm scales, read in float32, keep the masters' values
        assert copy[name].dtype == (jnp.bfloat16 if master.ndim >= 2 else jnp.float32), name
        assert copy[name].sharding == master.sharding, name
        np.testing.assert_array_equal(np.asarray(copy[name]), np.asarray(master.astype(copy[name].dtype)))
    before = np.asarray(copy["['embed_VD'].value"], np.float32)
    trainer.sampling.release()  # as the update does: the copy's memory is free until the refresh
    assert all(leaf.is_deleted() for leaf in _leaves(sampler.model).values())
    assert not any(leaf.is_deleted() for leaf in _leaves(policy.model).values())
    trainer.update(_batch())
    assert trainer.sampling_policy is sampler  # refreshed in place: holders of the policy see the new weights
    masters, copy = _leaves(policy.model), _leaves(sampler.model)
    assert not np.array_equal(before, np.asarray(copy["['embed_VD'].value"], np.float32))
    for name, master in masters.items():
        assert master.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(copy[name]), np.asarray(master.astype(copy[name].dtype)))


def test_the_update_reads_the_float32_masters_whatever_the_sampling_dtype():
    trained = {}
    for dtype in ("float32", "bfloat16"):
        trainer = Trainer(random_policy(CFG, seed=3), OptimConfig(lr=1e-2), sampling_dtype=dtype)
        metrics = trainer.update(_batch(seed=1))
        trained[dtype] = (jax.tree.map(np.asarray, trainer.params), metrics["loss"])
    (f32_params, f32_loss), (bf16_params, bf16_loss) = trained["float32"], trained["bfloat16"]
    assert f32_loss == bf16_loss
    jax.tree.map(np.testing.assert_array_equal, f32_params, bf16_params)
    assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(bf16_params))


def logprob_mismatch(trainer: Trainer, prompts, *, max_new_tokens: int, seed: int = 0) -> dict:
    """Samples a reply per prompt with the trainer's sampling policy (`generate_on_rows`, temperature 1)
    and recomputes its log-probs with the trainer: |logp_sampler - logp_trainer| and the TIS ratio
    exp(logp_trainer - logp_sampler) over every reply token."""
    generation = generate_on_rows(trainer.sampling_policy, prompts, max_new_tokens=max_new_tokens, seed=seed,
                                  stop_token_ids=[])
    seqs = []
    for prompt, tokens, logprobs in zip(prompts, generation.tokens, generation.logprobs):
        n = len(prompt)
        mask = np.arange(n + len(tokens)) >= n
        seqs.append(TrainSequence(np.concatenate([prompt, tokens]), mask, np.r_[np.zeros(n), logprobs], 1.0))
    batch = pack(seqs, row_length=max(len(s.tokens) for s in seqs), row_multiple=trainer.data_parallel)
    mask_RT = batch.target_mask_RT.astype(bool)
    sampler_N, trainer_N = batch.sampler_logprobs_RT[mask_RT], trainer.logprobs(batch)[mask_RT]
    gap_N, ratio_N = np.abs(sampler_N - trainer_N), np.exp(trainer_N - sampler_N)
    return dict(tokens=int(mask_RT.sum()), mean_abs=float(gap_N.mean()), max_abs=float(gap_N.max()),
                ratio_min=float(ratio_N.min()), ratio_max=float(ratio_N.max()), ratio_std=float(ratio_N.std()))


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_bfloat16_sampling_log_probs_stay_close_to_the_trainers(compute_dtype):
    cfg = CFG.replace(dtype=compute_dtype)
    prompts = [list(np.random.default_rng(i).integers(0, cfg.vocab_size, 8 + 4 * i)) for i in range(4)]
    found = {}
    for sampling in ("float32", "bfloat16"):
        trainer = Trainer(random_policy(cfg, seed=1), sampling_dtype=sampling)
        found[sampling] = logprob_mismatch(trainer, prompts, max_new_tokens=32)
        print(f"compute {compute_dtype}, sampling {sampling}: {found[sampling]}")
    f32, bf16 = found["float32"], found["bfloat16"]
    assert f32["tokens"] == bf16["tokens"] == 4 * 32
    if compute_dtype == "float32":
        assert f32["max_abs"] < 1e-4  # the same weights in the same arithmetic: rounding order only
        assert 1e-4 < bf16["mean_abs"] < 1e-2 and bf16["max_abs"] < 5e-2  # measured: see the report
        assert 0.95 < bf16["ratio_min"] and bf16["ratio_max"] < 1.05
    else:
        # bfloat16 compute casts every matrix at use: the copy changes nothing the sampler computes
        assert bf16 == f32


def test_self_play_samples_every_stage_with_the_trainers_sampling_policy(tmp_path, small_tokenizer):
    c = tiny_selfplay_config()
    c.model.sampling_dtype = "bfloat16"
    run = loop.SelfPlay(c, str(tmp_path), policy=_tiny_policy(c, small_tokenizer))
    try:
        assert run.sampler is run.trainer.sampling_policy is run.context.policy
        assert run.sampler.model.embed_VD[...].dtype == jnp.bfloat16
        assert run.policy.model.embed_VD[...].dtype == jnp.float32
    finally:
        run.close()
