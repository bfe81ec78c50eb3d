"""Designed environments out of the project: a run's admitted programs as an installable package.

    python -m spade_jax.envpack --workdir=RUN --out=DIR     # DIR/pyproject.toml, DIR/<name>/...
    pip install DIR                                         # then: import <name>; gymnasium.make(<name>.ENV_IDS[0])

- `source`: the run's admitted environments, read from its environment log, with their skill,
  document, declared and calibrated levels, win rates and regret.
- `write`: the package (pyproject.toml, the programs as JSON data files, `manifest.json`, a README);
  no file holds a literal special token of a shipped tokenizer.
- `manifest`: what a pack holds (`Manifest`, `PackedEnv`), read back by an installed pack.
- `runtime`: what an installed pack runs on: `Pack`, and `SandboxEpisode`, which plays a program
  through a `SandboxPool` (every reset and step in a sandbox worker, never in the caller).
- `gym_env`: a program as a Gymnasium environment (`ProgramEnv`, text spaces `ProgramText`).
- `openenv_env`: a pack as an OpenEnv environment server and client (`PackEnvironment`,
  `create_pack_app`, `PackEnvClient`).
- `pack_cli`: an installed pack's command line (`python -m <name> list | serve`).
- `__main__`: the command line that packs a run.

Entry layer: it reads a run (`selfplay.runlog`) and writes with `text.json_text`;
what an installed pack imports (`manifest`, `runtime`, `gym_env`, `openenv_env`) is standard
library, the sandbox, gymnasium and openenv-core, never JAX.
"""
