"""Training the policy on self-play data: rewards, advantages, packed batches, the update.

- `rewards`: an episode's scalar reward, per-environment statistics (win rate, regret)
  and the designer's reward for the program that built an environment.
- `advantages`: both roles' advantages (the designer's rewards centred per skill, the
  agent's z-scored per environment), optionally regret-rank weighted.
- `batch`: `TrainSequence`s of both roles packed into fixed-shape rows of next-token
  targets (`TrainBatch`).
- `losses`: the token-level clipped policy-gradient loss (with truncated importance
  weights and a KL penalty) as sums and counts.
- `train`: `Trainer`, the one jitted optimizer step over a packed batch, updating the
  policy's parameters in place; also the supervised ("nll") objective of bootstrapping.

`rewards`, `advantages` and `batch` are host-side numpy; `losses` and `train` run in
jitted JAX. Shape suffixes follow the legend in `spade_jax.models`.
"""
