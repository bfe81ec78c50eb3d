"""The self-play run: its config, the loop, its state and checkpoint, and what it reports.

- `config`: the presets' base config, validation, and each stage's config view.
- `initial_policy`: the policy a run starts from (bootstrap, pretrained or random).
- `loop`: `SelfPlay`, the only module that knows the order of an iteration.
- `lifecycle`: the run around its iterations: resume, checkpoints, SIGTERM, the token budget.
- `components`: the side systems (calibration, procedure memory, trajectory synthesis,
  evaluation), each behind one small interface and registered in one line.
- `chrono`: the cadence test of periodic work and the per-phase timings.
- `scoring`: pure functions from an iteration's plays to statistics, rewards, advantages
  and training sequences.
- `state`, `checkpoint`, `distributed`: what survives between iterations, how it is saved
  (orbax), and how several JAX processes share the sandbox work.
- `runlog` (metrics and the environment log on disk), `console` (the summary line and
  progress), `gallery` and `plots` (the HTML report).
"""
