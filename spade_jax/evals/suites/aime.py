"""AIME from a local file (`aime:PATH`): each problem asked once, graded with math-verify.

PATH is a JSONL file (one problem per line), a ``.json`` file holding a list of problems, or a
directory of such files (e.g. ``aime2025-I.jsonl`` and ``aime2025-II.jsonl`` of
opencompass/AIME2025 side by side). Keys accepted, the first present wins:

* problem text: ``problem``, ``question``, ``Problem``, ``Question``
* answer: ``answer``, ``Answer``, ``expected_answer``, ``final_answer``; failing those, the last
  ``\\boxed{...}`` of ``solution`` / ``Solution`` (a worked solution as MATH-style sets store it)
* id: ``id``, ``ID``, ``problem_idx``, ``idx``, ``problem_id`` (else the line number), prefixed
  with the file's stem; a ``url`` is read only for the year
* year (the item's group): ``year`` / ``Year``, else a year 1983-2099 in the id, the url or the
  file name (``aime2025-I.jsonl`` -> 2025), else ``aime``

That covers, among others, opencompass/AIME2025 (question, answer), math-ai/aime25 and
MathArena/aime_2025 exported to JSONL (problem, answer, id / problem_idx),
HuggingFaceH4/aime_2024 and AI-MO/aimo-validation-aime (problem, answer, url/year),
Maxwell-Jia/AIME_2024 (ID, Problem, Answer) and di-zhang-fdu/AIME_1983_2024 (ID, Year,
Question, Answer). Parquet files are not read: export them with
``datasets.load_dataset(...).to_json(PATH)`` first.

Each item is one user message: the problem and "Please reason step by step, and put your
final answer within \\boxed{}." Scoring: ``math_verify.parse`` of the reply (its default
extraction: LaTeX and plain expressions, ``\\boxed{}`` and "final answer is" phrases first)
checked with ``math_verify.verify`` against the parsed answer; 1 when they agree, else 0.
``details`` holds the extracted answer and whether the reply had a ``\\boxed{}``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import threading
from pathlib import Path

from spade_jax.envs.contract import extract_boxed
from spade_jax.evals.registry import register
from spade_jax.evals.suite import Context, GenerationSettings, Item, Score, SuiteUnavailable, spread
from spade_jax.evals.suites._files import data_path, files_of, first_key, json_records, suite_name

SUFFIXES = (".jsonl", ".json")
WHERE = ("a JSONL of problem/answer records, e.g. aime2025-I.jsonl and aime2025-II.jsonl of "
         "https://huggingface.co/datasets/opencompass/AIME2025 in one directory")
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PROBLEM_KEYS = ("problem", "question", "Problem", "Question")
ANSWER_KEYS = ("answer", "Answer", "expected_answer", "final_answer")
SOLUTION_KEYS = ("solution", "Solution")
ID_KEYS = ("id", "ID", "problem_idx", "idx", "problem_id")
URL_KEYS = ("url", "link")
YEAR_KEYS = ("year", "Year")
_YEAR = re.compile(r"(?<!\d)(19[89]\d|20\d\d)(?!\d)")


def load_problems(path: Path) -> list[dict]:
    """Every problem under ``path`` as ``{"id", "year", "problem", "answer"}``, in file order."""
    problems, seen = [], set()
    for file in files_of(path, SUFFIXES):
        for number, record in json_records(file):
            problem, answer = first_key(record, PROBLEM_KEYS), first_key(record, ANSWER_KEYS)
            if answer is None:
                solution = first_key(record, SOLUTION_KEYS)
                answer = extract_boxed(solution) if isinstance(solution, str) else None
            if not isinstance(problem, str) or answer is None or str(answer).strip() == "":
                raise SuiteUnavailable(
                    f"{file}:{number} has no problem text or no answer (keys read: problem/question, "
                    f"answer/expected_answer/final_answer or a \\boxed{{}} in solution; found: {', '.join(record)})")
            raw_id = first_key(record, ID_KEYS)
            year = first_key(record, YEAR_KEYS)
            if year is None:
                found = _YEAR.search(f"{raw_id or ''} {first_key(record, URL_KEYS) or ''} {file.stem}")
                year = found.group(1) if found else "aime"
            item_id = f"{file.stem}/{raw_id if raw_id is not None else number}"
            while item_id in seen:
                item_id += "+"
            seen.add(item_id)
            problems.append({"id": item_id, "year": str(year), "problem": problem.strip(),
                             "answer": _answer_text(answer)})
    return problems


def _answer_text(answer) -> str:
    text = str(answer).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))  # "023" -> "23"
    return text


def verify_answer(answer: str, reply: str) -> tuple[bool, str | None]:
    """(whether math-verify finds ``reply``'s final answer equal to ``answer``, what it extracted)."""
    from math_verify import parse, verify

    # math-verify times out with SIGALRM, which only the main thread may arm
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(answer if answer.startswith("$") else f"${answer}$", parsing_timeout=timeout)
    predicted = parse(reply, parsing_timeout=timeout)
    if not gold or not predicted:
        return False, None
    return bool(verify(gold, predicted, timeout_seconds=timeout)), str(predicted[-1])


@dataclasses.dataclass
class AimeSuite:
    problems: list
    settings: GenerationSettings
    name: str

    def items(self, limit, seed):
        return [Item(p["id"], group=p["year"], reference=p["answer"],
                     messages=({"role": "user", "content": f"{p['problem']}\n\n{INSTRUCTION}"},))
                for p in (self.problems[i] for i in spread([p["year"] for p in self.problems], limit, seed, "aime"))]

    def score(self, item: Item, reply, context: Context) -> Score:
        if not isinstance(reply, str):
            raise TypeError(f"{self.name} scores chat replies, got {type(reply).__name__}")
        try:
            correct, extracted = verify_answer(item.reference, reply)
        except Exception as err:  # a reply math-verify cannot handle scores 0, it does not stop the run
            correct, extracted = False, f"error: {type(err).__name__}: {err}"[:200]
        return Score(1.0 if correct else 0.0, correct,
                     {"answer": item.reference, "extracted": extracted, "boxed": extract_boxed(reply) is not None})


@register("aime", GenerationSettings(temperature=0.0, max_new_tokens=4096))
def make(argument: str, settings: GenerationSettings, eval_config) -> AimeSuite:
    """AIME problems from a local JSONL (answer in \\boxed{}, graded with math-verify)."""
    path = data_path("aime", argument, "a local problem file", WHERE, SUFFIXES)
    if importlib.util.find_spec("math_verify") is None:
        raise SuiteUnavailable("aime grades with math-verify, which is not installed: pip install math-verify==0.9.0")
    problems = load_problems(path)
    if not problems:
        raise SuiteUnavailable(f"{path} holds no problems; aime needs {WHERE}")
    return AimeSuite(problems, settings, suite_name("aime", path))
