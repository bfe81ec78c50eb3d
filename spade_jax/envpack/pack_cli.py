"""An installed pack's command line (``python -m <pack>``).

    python -m <pack> list                      # the environments, their skill, levels and statistics
    python -m <pack> serve [--port 8000]       # every environment behind one OpenEnv server
"""

from __future__ import annotations

import argparse
import sys

from spade_jax.envpack.manifest import PackError
from spade_jax.envpack.runtime import Pack
from spade_jax.text import display_line


def _list(pack: Pack) -> int:
    def num(value):
        return "-" if value is None else f"{value:.2f}"

    print(f"{pack.name} {pack.manifest.version}: {len(pack.environments)} environment(s)")
    for env in pack.environments:
        print(f"  {env.gym_id}  skill={display_line(env.skill or '-', 80)}  levels={','.join(env.levels) or '-'}  "
              f"level={env.level or '-'}  win_rate={num(env.win_rate)}  regret={num(env.regret)}")
    return 0


def main(pack: Pack, argv=None) -> int:
    """``list`` the pack's environments, or ``serve`` them over OpenEnv (needs openenv-core and uvicorn)."""
    parser = argparse.ArgumentParser(prog=f"python -m {pack.name}",
                                     description="A spade_jax environment pack: list it, or serve it over OpenEnv.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the environments with their skill, levels and statistics")
    serve = commands.add_parser("serve", help="serve every environment behind one OpenEnv server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--env", default=None, help="the environment a reset without env_id plays (default: the first)")
    serve.add_argument("--max-sessions", type=int, default=8, help="concurrent OpenEnv sessions")
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list(pack)
    try:
        from spade_jax.envpack.openenv_env import serve_pack
    except ImportError as err:
        print(f"error: serving needs openenv-core ({err}); pip install 'openenv-core>=0.3'", file=sys.stderr)
        return 2
    try:
        serve_pack(pack, args.env, host=args.host, port=args.port, max_sessions=args.max_sessions)
    except PackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
