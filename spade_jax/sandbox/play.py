"""Play an environment program interactively, through the same sandbox the trainer uses.

    python -m spade_jax.sandbox.play FILE --seed S [--max-turns N] [--isolation auto|namespaces|rlimits]

Each line read from stdin is one action (so it works with a pipe:
``printf '\\\\boxed{5}\\n' | python -m spade_jax.sandbox.play env.py --seed 0``). Lines
``:solution`` (show the env's reference actions) and ``:quit`` are commands. What the env
prints is shown after each turn, marked ``[env output]``. The program must pass the parse
stage (import policy) first. Exit status: 0 after playing, 1 when the program cannot be
started, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys

from spade_jax.sandbox.isolation import IsolationUnavailable
from spade_jax.sandbox.policy import PolicyError, check_program, extract_code
from spade_jax.sandbox.pool import SandboxPool
from spade_jax.sandbox.records import ISOLATION_LEVELS, EpisodeSpec, SandboxConfig, StepResult


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spade_jax.sandbox.play",
                                     description="Play an environment program in the sandbox, actions from stdin.")
    parser.add_argument("file")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--isolation", choices=ISOLATION_LEVELS, default="auto")
    return parser


def _show(result: StepResult, out) -> None:
    if result.error:
        print(f"--- error{' (timed out)' if result.timed_out else ''}: {result.error}", file=out)
        return
    print(f"--- turn {result.turn} | reward {result.reward:g} | terminated {result.terminated} | "
          f"truncated {result.truncated}", file=out)
    print(result.observation, file=out)


def _show_output(pool: SandboxPool, eid: int, out) -> None:
    printed = pool.output([eid])[0]
    if printed:
        print(f"[env output]\n{printed.rstrip()}", file=out)


def main(argv=None, stdin=None, stdout=None) -> int:
    args = _parser().parse_args(argv)
    stdin, out = stdin or sys.stdin, stdout or sys.stdout
    try:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            code = extract_code(f.read())
    except OSError as err:
        print(f"error: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    try:
        check_program(code)
    except PolicyError as err:
        print(f"rejected at parse: {err}", file=sys.stderr)
        return 1
    interactive = stdin.isatty()
    try:
        pool = SandboxPool(SandboxConfig(num_workers=1, isolation=args.isolation))
    except IsolationUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with pool:
        first = pool.start([EpisodeSpec(code, seed=args.seed, max_turns=args.max_turns)])[0]
        eid = first.episode_id
        if first.error:
            print(f"could not start the environment: {first.error}", file=sys.stderr)
            return 1
        print(f"{first.env_class} (seed {args.seed}, up to {first.turn_limit} turns)", file=out)
        print(first.observation, file=out)
        _show_output(pool, eid, out)
        result = first
        while not result.done and result.error is None:
            if interactive:
                print("> ", end="", file=out, flush=True)
            line = stdin.readline()
            if not line:
                break
            action = line.rstrip("\n")
            if action.strip() == ":quit":
                break
            if action.strip() == ":solution":
                sol = pool.solution_results([eid])[0]
                print(sol.solution if sol.solution is not None else f"(no solution: {sol.error})", file=out)
                continue
            result = pool.step([eid], [action])[0]
            _show(result, out)
            _show_output(pool, eid, out)
        if result.done and result.error is None:
            print(f"=== episode over: reward {result.reward:g}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
