"""Related systems: methods from other papers that run beside SPADE, not part of it.

- `calibration/`: solver-relative difficulty calibration (EvoEnv): the current agent plays each
  newly admitted program at its difficulty levels, and a program with no level in band is
  rejected (`config.calibration`).
- `procedures/`: procedure memory with preplay (ProPlay): the path of actions that won before,
  shown to the agent before an episode as soft guidance (`config.agent.procedure_memory`).
- `trajectories/`: tool-use trajectory synthesis (EnvFactory): SFT records and RL tasks from the
  verified tool-use environments of a run (`config.trajectories`; `python -m
  spade_jax.related.trajectories` as a command).

Each is off by default. A run reaches them only through the side-system registry
(`selfplay/components/`: an adapter each, with its config section); no other module of SPADE
imports them (`tools/import_cycles.py` checks it), so the algorithm reads without them.
"""
