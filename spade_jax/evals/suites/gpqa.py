"""GPQA from its own CSV (`gpqa:PATH`, e.g. gpqa_diamond.csv): four-way multiple choice, answered
with a letter.

The file is the one the GPQA authors publish (https://github.com/idavidrein/gpqa, dataset.zip,
password in that README; or the gated https://huggingface.co/datasets/Idavidrein/gpqa). Its
terms ask that examples never appear in plain text online, so it is never committed here;
the tests use invented items in the same format. Columns read: ``Question``, ``Correct
Answer``, ``Incorrect Answer 1`` .. ``Incorrect Answer 3`` (required); ``Record ID`` (the item
id, else the row number); ``Subdomain`` (the item's group, else ``High-level domain``, else
``gpqa``). Other columns are ignored, so the main, extended and diamond files all load.

Choices are shuffled per item with a fixed seed derived from the item (its Record ID, else
its question) and ``eval.seed``: the same seed, the same order, in every process. They are
shown as ``A) ...`` to ``D) ...`` under the question, with the instruction to end with
``Answer: X``.

Answer parsing is strict. The reply's answer is the letter of the LAST of these in the text:
``\\boxed{X}`` (``X`` alone, optionally wrapped in ``\\text{}``/``\\textbf{}``/``\\mathrm{}``
and/or parentheses), or ``Answer: X`` (``answer`` in any case, optionally ``final answer``,
markdown ``**``/``*`` around either part, ``X`` optionally in parentheses). When the reply has
neither, its last non-empty line counts if it is nothing but the letter, or if it repeats one
choice line as listed (``D) Nitrogen`` when D is Nitrogen; a letter with other text is no
answer). Around the letter, parentheses (or a closing one alone, as the listing writes
``D)``), ``**``, ``$`` and one trailing period are allowed everywhere. ``X`` must be one of A-D in upper case; a
last marker holding anything else (``\\boxed{E}``, ``Answer: 42``, ``Answer: B or C``) is no
answer. Score 1 iff the parsed letter is the correct one; ``details`` holds the parsed
letter (None when there was none) and the correct one. An item's ``reference`` is its `Key`.
"""

from __future__ import annotations

import csv
import dataclasses
import random
import re
from pathlib import Path
from typing import NamedTuple, Sequence

from spade_jax.evals.registry import register
from spade_jax.evals.suite import Context, GenerationSettings, Item, Score, SuiteUnavailable, spread, stable_seed
from spade_jax.evals.suites._files import data_path, suite_name

LETTERS = "ABCD"
WHERE = ("the GPQA CSV, e.g. gpqa_diamond.csv from dataset.zip of https://github.com/idavidrein/gpqa "
         "(password in its README) or https://huggingface.co/datasets/Idavidrein/gpqa")
REQUIRED = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
TEMPLATE = ("Answer the following multiple choice question. The last line of your response should be of the "
            "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by "
            "step before answering.\n\n{question}\n\n{choices}")

# \boxed{X}: the content is checked separately (it may hold \text{...})
_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_ANSWER = re.compile(r"(?:\*\*|\*)?\b(?:final\s+)?answer\s*(?:\*\*|\*)?\s*:\s*(?:\*\*|\*)?\s*"
                     r"(\(\s*[^\s()]*\s*\)|[^\s*]+(?:\s+(?:or|and)\s+\S+)?)", re.IGNORECASE)
_WRAPPERS = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\s*\{(.*)\}$")
_CHOICE_LINE = re.compile(r"^[*$\s]*\(?([A-D])\)\s+(.+?)[*$\s.]*$")


class Key(NamedTuple):
    """An item's answer key: the correct letter and the choices in the order shown."""

    correct: str
    choices: tuple[str, ...]


def _letter_of(raw: str) -> str | None:
    """The letter ``raw`` holds and nothing else (parentheses, bold, a trailing period allowed)."""
    text = raw.strip()
    for _ in range(3):
        inner = _WRAPPERS.match(text)
        text = inner.group(1).strip() if inner else text
        text = text.strip("*$").strip()
        text = text[:-1].strip() if text.endswith(".") else text
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1].strip()
        elif text.endswith(")") and "(" not in text:
            text = text[:-1].strip()
    return text if len(text) == 1 and text in LETTERS else None


def parse_letter(reply: str, choices: Sequence[str] = ()) -> str | None:
    """The letter a reply answers with, by the strict rules of the module docstring, or None.
    ``choices``: the choices as shown, A first (a last line that repeats one counts)."""
    marks = [(m.start(), m.group(1)) for m in _BOXED.finditer(reply)]
    marks += [(m.start(), m.group(1)) for m in _ANSWER.finditer(reply)]
    if marks:
        return _letter_of(max(marks)[1])
    lines = [line for line in reply.splitlines() if line.strip()]
    if not lines:
        return None
    echoed = _CHOICE_LINE.match(lines[-1])
    if echoed and choices and _same_text(echoed.group(2), choices[LETTERS.index(echoed.group(1))]):
        return echoed.group(1)
    return _letter_of(lines[-1])


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()).rstrip(".").casefold() == " ".join(b.split()).rstrip(".").casefold()


def load_questions(path: Path) -> list[dict]:
    """Every row of the CSV as ``{"id", "group", "question", "correct", "incorrect"}``, in file order."""
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
        if missing:
            raise SuiteUnavailable(f"{path} lacks the column(s) {', '.join(missing)}; gpqa needs {WHERE}")
        rows = []
        for number, row in enumerate(reader, 1):
            texts = [(row.get(c) or "").strip() for c in REQUIRED]
            if not all(texts):
                raise SuiteUnavailable(f"{path}: row {number} has an empty question or choice")
            record_id = (row.get("Record ID") or "").strip() or f"row{number}"
            group = (row.get("Subdomain") or "").strip() or (row.get("High-level domain") or "").strip() or "gpqa"
            rows.append({"id": record_id, "group": group, "question": texts[0], "correct": texts[1],
                         "incorrect": texts[2:]})
    return rows


def shuffled(question: dict, seed: int) -> tuple[list[str], str]:
    """The four choices in this item's fixed order for ``seed``, and the correct letter."""
    choices = [question["correct"], *question["incorrect"]]
    order = list(range(4))
    random.Random(stable_seed("gpqa", seed, question["id"], question["question"])).shuffle(order)
    return [choices[i] for i in order], LETTERS[order.index(0)]


@dataclasses.dataclass
class GpqaSuite:
    questions: list
    settings: GenerationSettings
    name: str
    shuffle_seed: int

    def items(self, limit, seed):
        items = []
        for index in spread([q["group"] for q in self.questions], limit, seed, "gpqa"):
            question = self.questions[index]
            choices, correct = shuffled(question, self.shuffle_seed)
            listing = "\n".join(f"{letter}) {choice}" for letter, choice in zip(LETTERS, choices))
            prompt = TEMPLATE.format(question=question["question"], choices=listing)
            items.append(Item(question["id"], group=question["group"], reference=Key(correct, tuple(choices)),
                              messages=({"role": "user", "content": prompt},)))
        return items

    def score(self, item: Item, reply, context: Context) -> Score:
        if not isinstance(reply, str):
            raise TypeError(f"{self.name} scores chat replies, got {type(reply).__name__}")
        key: Key = item.reference
        letter = parse_letter(reply, key.choices)
        correct = letter == key.correct
        return Score(1.0 if correct else 0.0, correct, {"parsed": letter, "correct": key.correct})


@register("gpqa", GenerationSettings(temperature=0.0, max_new_tokens=2048))
def make(argument: str, settings: GenerationSettings, eval_config) -> GpqaSuite:
    """GPQA (e.g. Diamond) from its local CSV: shuffled choices A-D, answered with a letter."""
    path = data_path("gpqa", argument, "a local CSV", WHERE, (".csv",))
    if path.is_dir():
        candidates = sorted(path.glob("*diamond*.csv")) or sorted(path.glob("*.csv"))
        path = candidates[0]
    questions = load_questions(path)
    if not questions:
        raise SuiteUnavailable(f"{path} holds no questions; gpqa needs {WHERE}")
    return GpqaSuite(questions, settings, suite_name("gpqa", path), int(getattr(eval_config, "seed", 0)))
