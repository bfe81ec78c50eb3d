"""Held-out evaluation: suites of benchmark items played by the policy with the agent's own
sampler, multi-turn engine and sandbox.

- `suite`: the interface a suite implements (items, how each is played, its score).
- `registry`: suites by name (``prefix[:argument]``); each module of `suites` is one suite.
- `runner`: plays and scores a suite (k samples, pass@k), writes per-item JSONL and a
  summary per suite, one table across suites; `EvalConfig`.
- ``python -m spade_jax.evals``: evaluates a run's checkpoint; the main job evaluates every
  ``eval.every`` iterations.
"""
