"""Admit one environment program from the command line.

    python -m spade_jax.admission FILE [--json] [--seeds N] [--max-turns N]
                                  [--archive FILE ...] [--isolation auto|namespaces|rlimits]

FILE is a program or a model reply containing one (a fenced python block). Prints the stage
reached, the verdict, the reason, per-stage timings and the isolation in force.

Program text is data. The reason, the class name, the timing names and the isolation notes
can carry text the program chose (an exception message, say), so the human report shows
each of them through ``text.display_line``: one escaped line, bounded, with no newline,
carriage return or terminal escape of its own. The ``verdict:`` line is therefore the only
line that starts with ``verdict:``.

With ``--json`` stdout is exactly one JSON object, ASCII only, also on errors:

    {"file": FILE, <the AdmissionReport fields>, "internal_error": false}     a verdict
    {"file": FILE or null, "admitted": false, "error": "...", "internal_error": true}

Strings from the program arrive cleaned (the sandbox host passes every string a worker
sends through ``text.clean_text``: valid Unicode, no control characters). Nothing the
program prints reaches stdout: it runs in sandbox workers whose output is captured, and
while the admission runs the process's own stdout (file descriptor 1, inherited by the
sandbox host) points at stderr.

Exit status: 0 admitted, 1 rejected, 2 internal or usage error (bad arguments, an
unreadable file, isolation the kernel does not grant, a failed sandbox, any unexpected
exception).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from spade_jax.sandbox.records import ISOLATION_LEVELS
from spade_jax.text import clean_text, display_line

EXIT_ADMITTED, EXIT_REJECTED, EXIT_ERROR = 0, 1, 2
_FIELD_CHARS = 2000  # program-derived fields in the human report
_ERROR_CHARS = 4000


class _UsageError(Exception):
    """Bad command-line arguments (argparse's message)."""


class _ReadError(Exception):
    """FILE or an archive file cannot be read."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print and exit; --json needs one JSON object instead
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m spade_jax.admission",
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
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as err:
        raise _ReadError(f"cannot read {path}: {err.strerror or err}") from None


def _line(value, limit: int = _FIELD_CHARS) -> str:
    return display_line("" if value is None else str(value), limit)


def _human(report: dict, path: str) -> str:
    from spade_jax.admission.stages import STAGES

    stage = report["stage"]
    stage_no = f" ({STAGES.index(stage) + 1}/{len(STAGES)})" if stage in STAGES else ""
    iso = report.get("isolation") or {}
    timings = report.get("timings") or {}
    lines = [
        f"file:      {_line(path)}",
        f"verdict:   {'ADMITTED' if report['admitted'] is True else 'REJECTED'}",
        f"stage:     {_line(stage)}{stage_no}",
        f"reason:    {_line(report['reason'])}",
        f"class:     {_line(report.get('class_name') or '-')}",
        "timings:   " + ", ".join(f"{_line(k, 100)} {_seconds(v)}" for k, v in timings.items()),
        f"isolation: {_line(iso.get('method'), 100)}: "
        + (f"missing {_line(', '.join(iso.get('missing') or []), 400)}" if iso.get("missing")
           else "every protection in force"),
        "rlimits:   " + ", ".join(f"{_line(k, 100)}={_line(v, 100)}" for k, v in (iso.get("rlimits") or {}).items()),
    ]
    lines += [f"note:      {_line(note)}" for note in iso.get("notes") or []]
    return "\n".join(lines)


def _seconds(value) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.3f} s"
    return _line(value, 100)


@contextlib.contextmanager
def _stdout_to_stderr():
    """Points file descriptor 1 (and ``sys.stdout``) at stderr; children started inside inherit it."""
    sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no usable descriptors (an embedding host): the Python-level redirect still holds
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _error_object(path, message: str) -> dict:
    return {"file": path, "admitted": False, "error": clean_text(message, _ERROR_CHARS), "internal_error": True}


def _emit_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=True) + "\n")
    sys.stdout.flush()


def _run(args) -> dict:
    """The admission report of ``args.file`` as a dict; raises on anything that is not a verdict."""
    from spade_jax.admission.stages import AdmissionConfig, admit
    from spade_jax.sandbox.records import SandboxConfig

    text = _read(args.file)
    archive = [_read(path) for path in args.archive]
    config = AdmissionConfig(num_seeds=args.seeds, determinism_seeds=min(2, args.seeds), max_turns=args.max_turns,
                             sandbox=SandboxConfig(isolation=args.isolation))
    with _stdout_to_stderr():
        return admit(text, config, archive=archive).to_dict()


def _describe(err: BaseException) -> str:
    if isinstance(err, _UsageError):
        return f"usage: {err}"
    if isinstance(err, _ReadError):
        return str(err)
    if isinstance(err, KeyboardInterrupt):
        return "interrupted"
    try:
        from spade_jax.sandbox.isolation import IsolationUnavailable
        from spade_jax.sandbox.pool import SandboxError
    except Exception:  # noqa: BLE001  (the import itself may be what failed)
        IsolationUnavailable = SandboxError = ()  # noqa: N806  (isinstance(err, ()) is False)
    if isinstance(err, IsolationUnavailable):
        return f"isolation unavailable: {err}"
    if isinstance(err, SandboxError):
        return f"sandbox failed: {err}"
    return f"internal error: {type(err).__name__}: {err}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    path = None
    try:
        args = _parser().parse_args(argv)
        path, as_json = args.file, args.json
        if args.seeds < 1:
            raise _UsageError("--seeds must be at least 1")
        if args.max_turns is not None and args.max_turns < 1:
            raise _UsageError("--max-turns must be at least 1")
        report = _run(args)
        code = EXIT_ADMITTED if report["admitted"] is True else EXIT_REJECTED
        if as_json:
            _emit_json({"file": path, **report, "internal_error": False})
        else:
            sys.stdout.write(_human(report, path) + "\n")
            sys.stdout.flush()
        return code
    except (Exception, KeyboardInterrupt) as err:  # every failure is exit 2 with one clear message
        message = _describe(err)
        try:
            if as_json:
                _emit_json(_error_object(path, message))
            else:
                if isinstance(err, _UsageError):
                    sys.stderr.write(_parser().format_usage())
                sys.stderr.write(f"error: {display_line(message, _ERROR_CHARS)}\n")
        except Exception:  # noqa: BLE001  (a closed stdout/stderr: the exit status still says it)
            pass
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
