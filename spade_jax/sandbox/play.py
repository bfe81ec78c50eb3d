"""Play an environment program interactively, through the same sandbox the trainer uses.

    python -m spade_jax.sandbox.play FILE --seed S [--max-turns N] [--isolation auto|namespaces|rlimits]

Each line read from stdin is one action (so it works with a pipe:
``printf '\\\\boxed{5}\\n' | python -m spade_jax.sandbox.play env.py --seed 0``). Lines
``:solution`` (show the env's reference actions) and ``:quit`` are commands. What the env
prints is shown after each turn, marked ``[env output]``. The program must pass the parse
stage (import policy) first.

Everything the program produces is data: observations, printed output and ``solution()``
text are shown through ``text.clean_text`` (lines stay lines, but lone surrogates, terminal
escapes, carriage returns and bidi controls become U+FFFD), error messages and the class
name through ``text.display_line`` (one escaped line each).

Exit status: 0 after playing, 1 when the program cannot be started (it fails the import
policy, or loading or ``reset`` fails), 2 on a usage error (bad arguments, an unreadable
file) or an internal one (isolation the kernel does not grant, a failed sandbox).
"""

from __future__ import annotations

import argparse
import sys

from spade_jax.sandbox.isolation import IsolationUnavailable
from spade_jax.sandbox.policy import PolicyError, check_program, extract_code
from spade_jax.sandbox.pool import SandboxError, SandboxPool
from spade_jax.sandbox.records import ISOLATION_LEVELS, EpisodeSpec, SandboxConfig, StepResult
from spade_jax.text import clean_text, display_line

_TEXT_CHARS = 1 << 16  # observations, printed output, solution text
_LINE_CHARS = 2000  # error messages and names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spade_jax.sandbox.play",
                                     description="Play an environment program in the sandbox, actions from stdin.")
    parser.add_argument("file")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--isolation", choices=ISOLATION_LEVELS, default="auto")
    return parser


def _text(value) -> str:
    """Program text that may span lines, safe for a terminal."""
    return clean_text("" if value is None else str(value), _TEXT_CHARS)


def _line(value) -> str:
    """Program text shown as one escaped line."""
    return display_line("" if value is None else str(value), _LINE_CHARS)


def _show(result: StepResult, out) -> None:
    if result.error:
        print(f"--- error{' (timed out)' if result.timed_out else ''}: {_line(result.error)}", file=out)
        return
    print(f"--- turn {result.turn} | reward {result.reward:g} | terminated {result.terminated} | "
          f"truncated {result.truncated}", file=out)
    print(_text(result.observation), file=out)


def _show_output(pool: SandboxPool, eid: int, out) -> None:
    printed = pool.output([eid])[0]
    if printed:
        print(f"[env output]\n{_text(printed).rstrip()}", file=out)


def main(argv=None, stdin=None, stdout=None) -> int:
    args = _parser().parse_args(argv)
    stdin, out = stdin or sys.stdin, stdout or sys.stdout
    try:
        return _play(args, stdin, out)
    except (IsolationUnavailable, SandboxError) as err:
        print(f"error: {_line(err)}", file=sys.stderr)
        return 2


def _play(args, stdin, out) -> int:
    try:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            code = extract_code(f.read())
    except OSError as err:
        print(f"error: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    try:
        check_program(code)
    except PolicyError as err:
        print(f"rejected at parse: {_line(err)}", file=sys.stderr)
        return 1
    interactive = stdin.isatty()
    pool = SandboxPool(SandboxConfig(num_workers=1, isolation=args.isolation))
    with pool:
        first = pool.start([EpisodeSpec(code, seed=args.seed, max_turns=args.max_turns)])[0]
        eid = first.episode_id
        if first.error:
            print(f"could not start the environment: {_line(first.error)}", file=sys.stderr)
            return 1
        print(f"{_line(first.env_class)} (seed {args.seed}, up to {first.turn_limit} turns)", file=out)
        print(_text(first.observation), file=out)
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
                print(_text(sol.solution) if sol.solution is not None else f"(no solution: {_line(sol.error)})",
                      file=out)
                continue
            result = pool.step([eid], [action])[0]
            _show(result, out)
            _show_output(pool, eid, out)
        if result.done and result.error is None:
            print(f"=== episode over: reward {result.reward:g}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
