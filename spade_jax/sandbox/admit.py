"""Admit one environment program from the command line.

    python -m spade_jax.sandbox.admit FILE [--json] [--seeds N] [--max-turns N]
                                           [--archive FILE ...] [--isolation auto|namespaces|rlimits]

FILE is a program or a model reply containing one (a fenced python block). Prints the stage
reached, the verdict, the reason, per-stage timings and the isolation in force. With --json
stdout is exactly one JSON object (the AdmissionReport plus ``file``); nothing the program
prints can reach stdout (it runs in sandbox workers whose output is captured).
Exit status: 0 admitted, 1 rejected, 2 usage error (bad arguments, unreadable file) or the
sandbox cannot run with the requested isolation.
"""

from __future__ import annotations

import argparse
import json
import sys

from spade_jax.sandbox.admission import STAGES, AdmissionConfig, admit
from spade_jax.sandbox.isolation import IsolationUnavailable
from spade_jax.sandbox.records import ISOLATION_LEVELS, SandboxConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spade_jax.sandbox.admit",
                                     description="Run the staged sandbox admission on one environment program.")
    parser.add_argument("file", help="program source, or model text with a fenced python block")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds the stages use (default 3)")
    parser.add_argument("--max-turns", type=int, default=None, help="max_turns for the constructor "
                        "(default: the class's own)")
    parser.add_argument("--archive", nargs="*", default=[], help="programs to check novelty against")
    parser.add_argument("--isolation", choices=ISOLATION_LEVELS, default="auto")
    return parser


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _human(report: dict, path: str) -> str:
    stage_no = STAGES.index(report["stage"]) + 1
    iso = report["isolation"]
    lines = [
        f"file:      {path}",
        f"verdict:   {'ADMITTED' if report['admitted'] else 'REJECTED'}",
        f"stage:     {report['stage']} ({stage_no}/{len(STAGES)})",
        f"reason:    {report['reason']}",
        f"class:     {report['class_name'] or '-'}",
        "timings:   " + ", ".join(f"{k} {v:.3f} s" for k, v in report["timings"].items()),
        f"isolation: {iso['method']}: network {iso['network']}, filesystem {iso['filesystem']}, "
        f"pid namespace {'yes' if iso['pid_namespace'] else 'no'}, "
        f"per-episode uid {'yes' if iso['per_episode_uid'] else 'no'}",
        "rlimits:   " + ", ".join(f"{k}={v}" for k, v in iso["rlimits"].items()),
    ]
    lines += [f"note:      {note}" for note in iso["notes"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.seeds < 1:
        print("error: --seeds must be at least 1", file=sys.stderr)
        return 2
    try:
        text = _read(args.file)
        archive = [_read(path) for path in args.archive]
    except OSError as err:
        print(f"error: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    config = AdmissionConfig(num_seeds=args.seeds, determinism_seeds=min(2, args.seeds), max_turns=args.max_turns,
                             sandbox=SandboxConfig(isolation=args.isolation))
    try:
        report = admit(text, config, archive=archive).to_dict()
    except IsolationUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"file": args.file, **report}))
    else:
        print(_human(report, args.file))
    return 0 if report["admitted"] else 1


if __name__ == "__main__":
    sys.exit(main())
