"""Benchmarks read from local files (aime, gpqa, lcb): loading, prompts, scoring, the sandboxed code
runs of LiveCodeBench, and one end-to-end run of each through the runner.

The fixtures under tests/evals/fixtures/eval_files/ are invented items in the published formats
(nothing of the real benchmarks is committed; GPQA's terms forbid it).
"""

import base64
import json
import pickle
import zlib
from pathlib import Path

import jax
import pytest

from spade_jax.evals import runner
from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import Context, GenerationSettings, SuiteUnavailable
from spade_jax.evals.suites import aime, gpqa, livecodebench
from spade_jax.models import ModelConfig, make_mesh, random_policy
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.sandbox.policy import check_program

FILES = Path(__file__).parent / "fixtures" / "eval_files"
AIME = FILES / "aime2099-I.jsonl"
GPQA = FILES / "gpqa_diamond_invented.csv"
LCB = FILES / "lcb_invented.jsonl"
CFG = runner.EvalConfig(seed=0)

SUM_OK = "Here you go:\n```python\nimport sys\nn = int(input())\nprint(sum(map(int, sys.stdin.read().split())))\n```\n"
SUM_WRONG = "```python\nn = int(input())\nprint(sum(map(int, input().split())) + 1)\n```"
PAIR_OK = """```python
class Solution:
    def twoIndices(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return (seen[target - x], i)
            seen[x] = i
```"""
HALVES_OK = "```py\nfrom sys import stdin\nn = int(stdin.readline())\nprint(n / 2)\n```"  # 2.0 passes for 2


def _chat(item) -> str:
    return item.messages[-1]["content"]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=2, call_timeout_s=1.5, load_timeout_s=5.0)) as p:
        yield p


# --- shared --------------------------------------------------------------------------------------


def test_the_registry_finds_the_three_file_suites():
    known = registered()
    assert {"aime", "gpqa", "lcb"} <= set(known)
    assert all(known[prefix].summary for prefix in ("aime", "gpqa", "lcb"))


@pytest.mark.parametrize("prefix", ["aime", "gpqa", "lcb"])
def test_a_missing_file_is_unavailable_with_one_line(prefix, tmp_path):
    for spec in (f"{prefix}:{tmp_path / 'nowhere.jsonl'}", prefix):
        with pytest.raises(SuiteUnavailable) as caught:
            make_suite(spec, None, CFG)
        message = str(caught.value)
        assert "\n" not in message and "https://" in message and message.startswith(("/", prefix))


def test_aime_without_math_verify_says_what_to_install(monkeypatch):
    real = aime.importlib.util.find_spec
    monkeypatch.setattr(aime.importlib.util, "find_spec",
                        lambda name, *a: None if name == "math_verify" else real(name, *a))
    with pytest.raises(SuiteUnavailable, match="pip install math-verify"):
        make_suite(f"aime:{AIME}", None, CFG)


# --- AIME ----------------------------------------------------------------------------------------


def test_aime_reads_every_key_spelling_and_groups_by_year():
    suite = make_suite(f"aime:{AIME}", None, CFG)
    items = suite.items(None, 0)
    assert suite.name == "aime2099-I"
    assert [i.reference for i in items] == ["19", "401", "720", "150", "45"]
    assert [i.group for i in items] == ["2099", "2024", "2023", "2022", "2099"]
    assert items[1].item_id == "aime2099-I/7" and items[2].item_id == "aime2099-I/2023-II-4"
    assert len({i.item_id for i in items}) == 5
    assert all(_chat(i).endswith("put your final answer within \\boxed{}.") for i in items)


def test_aime_same_seed_same_items():
    suite = make_suite(f"aime:{AIME}", None, CFG)
    assert suite.items(3, 1) == suite.items(3, 1)
    assert len(suite.items(3, 1)) == 3
    assert len({tuple(i.item_id for i in suite.items(2, seed)) for seed in range(8)}) > 1  # the seed picks


def test_aime_scores_the_right_answer_1_and_a_wrong_one_0():
    suite = make_suite(f"aime:{AIME}", None, CFG)
    items = {i.reference: i for i in suite.items(None, 0)}
    right = suite.score(items["401"], "7^4 = 2401, so the remainder is \\boxed{401}.", Context())
    assert right.value == 1.0 and right.solved and right.details["boxed"]
    assert suite.score(items["401"], "The remainder is \\boxed{402}.", Context()).value == 0.0
    assert suite.score(items["45"], "\\boxed{45}", Context()).solved  # "045" in the file
    assert suite.score(items["720"], "\\boxed{\\frac{1440}{2}}", Context()).solved
    nothing = suite.score(items["19"], "I do not know.", Context())
    assert nothing.value == 0.0 and not nothing.solved and nothing.details["extracted"] is None


# --- GPQA ----------------------------------------------------------------------------------------


def test_gpqa_reads_the_published_columns_and_groups_by_subdomain():
    suite = make_suite(f"gpqa:{GPQA}", None, CFG)
    items = suite.items(None, 0)
    assert suite.name == "gpqa_diamond_invented" and len(items) == 5
    assert [i.item_id for i in items] == [f"recINVENTED0{k}" for k in range(1, 6)]
    assert [i.group for i in items] == ["Atmospheric Chemistry", "Physics (general)", "Genetics",
                                        "Physics (general)", "Chemistry"]  # the last falls back to the domain
    text = _chat(items[3])
    assert '(Choose one, "exactly".)' in text and "Answer: $LETTER" in text
    letter = items[3].reference.correct
    assert f"\n{letter}) Pressure, p" in text  # the letter marks the correct choice
    assert sorted(line[:3] for line in text.splitlines()[-4:]) == ["A) ", "B) ", "C) ", "D) "]


def test_gpqa_same_seed_same_items_and_shuffles():
    one = make_suite(f"gpqa:{GPQA}", None, runner.EvalConfig(seed=5))
    two = make_suite(f"gpqa:{GPQA}", None, runner.EvalConfig(seed=5))
    assert one.items(None, 5) == two.items(None, 5)
    assert one.items(3, 5) == two.items(3, 5) and len(one.items(3, 5)) == 3
    orders = {tuple(_chat(i) for i in make_suite(f"gpqa:{GPQA}", None, runner.EvalConfig(seed=s)).items(None, s))
              for s in range(6)}
    assert len(orders) > 1  # the seed changes the shuffles
    letters = [i.reference.correct for s in range(6) for i in make_suite(f"gpqa:{GPQA}", None,
                                                                 runner.EvalConfig(seed=s)).items(None, s)]
    assert len(set(letters)) > 1  # the correct answer is not always in one place


def test_gpqa_scores_the_correct_letter_1_and_another_0():
    suite = make_suite(f"gpqa:{GPQA}", None, CFG)
    item = suite.items(None, 0)[0]
    right, wrong = item.reference.correct, next(letter for letter in "ABCD" if letter != item.reference.correct)
    assert suite.score(item, f"Nitrogen is most of it.\n\nAnswer: {right}", Context()).solved
    assert suite.score(item, f"\\boxed{{{right}}}", Context()).value == 1.0
    miss = suite.score(item, f"Answer: {wrong}", Context())
    assert miss.value == 0.0 and miss.details == {"parsed": wrong, "correct": right}
    assert suite.score(item, f"I am unsure, maybe {right}", Context()).details["parsed"] is None
    shown = dict(zip("ABCD", item.reference.choices))
    assert suite.score(item, f"Let me think.\n{right}) {shown[right]}", Context()).solved
    assert suite.score(item, f"{wrong}) {shown[wrong]}.", Context()).details["parsed"] == wrong
    assert suite.score(item, f"{right}) {shown[wrong]}", Context()).details["parsed"] is None  # letter and text disagree


@pytest.mark.parametrize("reply, letter", [
    ("Reasoning...\nAnswer: C", "C"), ("**Answer:** (D)", "D"), ("**Final Answer: B**", "B"), ("Answer:A.", "A"),
    ("so \\boxed{\\text{B}}", "B"), ("\\boxed{(C)}", "C"), ("long reasoning\n\n(B)", "B"), ("text\n**D**", "D"),
    ("Answer: A\nOn reflection, \\boxed{D}", "D"), ("\\boxed{A} ... Answer: B", "B"),
    ("The answer is B", None), ("Answer: B or C", None), ("Answer: 42", None), ("\\boxed{E}", None),
    ("Answer: b", None), ("\\boxed{B}\nAnswer: E", None), ("B is right", None), ("", None),
    ("Answer: D)", "D"), ("so\nC)", "C"), ("D) Nitrogen", None), ("Answer: (D", None),
])
def test_gpqa_parses_answers_strictly(reply, letter):
    assert gpqa.parse_letter(reply) == letter


# --- LiveCodeBench -------------------------------------------------------------------------------


def test_lcb_decodes_plain_and_compressed_test_lists():
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert livecodebench.decode_tests(packed) == livecodebench.decode_tests(json.dumps(tests)) == tests
    assert livecodebench.decode_tests(tests) == tests and livecodebench.decode_tests("") == []
    hostile = base64.b64encode(zlib.compress(pickle.dumps(Path("x")))).decode()
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        livecodebench.decode_tests(hostile)


def test_lcb_items_group_by_difficulty_and_ask_for_code():
    suite = make_suite(f"lcb:{LCB}", None, CFG)
    items = suite.items(None, 0)
    assert suite.name == "lcb_invented"
    assert [(i.item_id, i.group) for i in items] == [("inv001", "easy"), ("inv002", "medium"), ("inv003", "hard")]
    assert "def twoIndices(self, nums: List[int], target: int)" in _chat(items[1])
    assert "# YOUR CODE HERE" in _chat(items[0]) and "```python" in _chat(items[0])
    assert items[1].reference["func_name"] == "twoIndices" and items[0].reference["func_name"] is None
    assert suite.items(2, 3) == suite.items(2, 3) and len(suite.items(2, 3)) == 2
    assert len(livecodebench.load_tests(items[0].reference["file"], items[0].reference["offset"])) == 4


def test_lcb_extracts_the_last_python_block():
    reply = "```text\nsample\n```\n```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\n```"
    assert livecodebench.extract_python(reply) == "print(2)\n"
    assert livecodebench.extract_python("no code") is None
    assert livecodebench.extract_python("```python\nprint(1)\n") is None  # cut off: no closing fence


def test_lcb_comparison_is_livecodebench_s():
    same = livecodebench.canonical_output
    assert same("1.0  2\n") == same(" 1 2.00") and same("3\n\n") == same("3")
    assert same("-0") == same("0") and same("1e3") == same("1000")
    assert same("1 2") != same("1\n2") and same("abc") != same("ABC") and same("nan") != same("NaN")
    big = "123456789012345678901234567890123"
    assert same(big) != same(big[:-1] + "4")  # exact, no rounding to the decimal context


def test_lcb_generated_program_passes_the_environment_policy():
    code = livecodebench.prepare_code("import sys, math as m\nfrom sys import *\nprint(m.pi)\n")
    assert "__lcb_sys__" in code and "import sys" not in code and "import math as m" in code
    check_program(livecodebench.program_for(code, None))
    check_program(livecodebench.program_for(code, "f"))


def test_lcb_right_solutions_pass_and_wrong_ones_fail_in_the_sandbox(pool):
    suite = make_suite(f"lcb:{LCB}", None, CFG)
    total, pair, halves = suite.items(None, 0)
    context = Context(pool=pool)
    right = suite.score(total, SUM_OK, context)
    assert right.value == 1.0 and right.solved and right.details == {"passed": 4, "total": 4}
    wrong = suite.score(total, SUM_WRONG, context)
    assert wrong.value == 0.0 and not wrong.solved and wrong.details["first_failure"]["error"] == "wrong answer"
    assert suite.score(pair, PAIR_OK, context).solved  # a tuple counts as a list
    off = suite.score(pair, PAIR_OK.replace("return (seen[target - x], i)", "return [i, seen[target - x]]"), context)
    assert off.value == 0.0
    assert suite.score(halves, HALVES_OK, context).solved  # 2.0 == 2, 0.5 == 0.5
    partial = suite.score(halves, "```python\nn = int(input())\nprint(n // 2 if n % 2 == 0 else n / 2)\n```", context)
    assert partial.solved and partial.value == 1.0
    half = suite.score(halves, "```python\nprint(int(input()) // 2)\n```", context)
    assert 0.0 < half.value < 1.0 and not half.solved  # only the even inputs pass


def test_lcb_hostile_or_broken_solutions_fail_without_hurting_the_run(pool):
    suite = make_suite(f"lcb:{LCB}", None, CFG)
    total, pair, _ = suite.items(None, 0)
    context = Context(pool=pool)
    loop = suite.score(total, "```python\nwhile True:\n    pass\n```", context)
    assert loop.value == 0.0 and loop.details["first_failure"]["timed_out"] and loop.details["stopped"]["test"] == 0
    late = suite.score(total, "```python\nn = int(input())\na = list(map(int, input().split()))\n"
                              "while a[0] == 10**9:\n    pass\nprint(sum(a))\n```", context)
    assert late.value == 0.75 and not late.solved and late.details["stopped"]["test"] == 3  # the last test loops
    escape = suite.score(total, "```python\nimport os\nprint(os.listdir('/'))\n```", context)
    assert escape.value == 0.0 and "ImportError" in escape.details["first_failure"]["error"]
    at_load = suite.score(pair, "```python\nimport os\nclass Solution:\n    pass\n```", context)
    assert at_load.value == 0.0 and "ImportError" in at_load.details["error"]
    files = suite.score(total, "```python\nprint(open('/etc/passwd').read())\n```", context)
    assert files.value == 0.0 and "PermissionError" in files.details["first_failure"]["error"]
    assert suite.score(total, "```python\ndef f(:\n```", context).details["error"].startswith("syntax error")
    assert suite.score(total, "no code here", context).details["error"].startswith("no ```python")
    flood = suite.score(total, "```python\nwhile True:\n    print('x' * 100000)\n```", context)
    assert flood.value == 0.0
    reads = "```python\nimport sys\nprint(sum(map(int, open(0).read().split()[1:])))\nsys.exit(0)\n```"
    exits = suite.score(total, reads, context)
    assert exits.solved  # open(0) reads stdin; exit(0) ends the program normally
    assert suite.score(total, SUM_OK, context).solved  # the pool still works
    assert pool.stats()["live"] == 0


def test_lcb_scores_a_batch_side_by_side_as_it_scores_each_alone(pool):
    suite = make_suite(f"lcb:{LCB}", None, CFG)
    total, pair, halves = suite.items(None, 0)
    context = Context(pool=pool)
    cases = [(total, SUM_OK), (total, SUM_WRONG), (pair, PAIR_OK), (halves, "```python\nprint(int(input()) // 2)\n```"),
             (total, "no code"), (total, "```python\nwhile True:\n    pass\n```"), (halves, HALVES_OK)]
    together = suite.score_batch([i for i, _ in cases], [r for _, r in cases], context)
    alone = [suite.score(i, r, context) for i, r in cases]
    assert [(s.value, s.solved) for s in together] == [(s.value, s.solved) for s in alone]
    assert [s.solved for s in together] == [True, False, True, False, False, False, True]
    assert together[5].details["stopped"]["timed_out"] and pool.stats()["live"] == 0


def test_lcb_item_time_limit_is_kept_by_the_sandboxed_program(pool):
    suite = make_suite(f"lcb:{LCB}", None, CFG)
    total = suite.items(None, 0)[0]
    slow = livecodebench.prepare_code(
        "import datetime\nbegun = datetime.datetime.now()\n"
        "while (datetime.datetime.now() - begun).total_seconds() < 0.6:\n    pass\n"
        "n = int(input())\nprint(sum(map(int, input().split())))\n")
    tests = livecodebench.load_tests(total.reference["file"], total.reference["offset"])
    score = livecodebench.run_tests(pool, slow, None, tests, time_limit_s=1.0)
    stopped = score.details["stopped"]
    assert 1 <= stopped["test"] <= 2 and "item time limit of 1 s" in stopped["error"]
    assert score.details["passed"] == stopped["test"] and not score.solved


# --- end to end ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy(small_tokenizer):
    config = ModelConfig(vocab_size=small_tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16)
    return random_policy(config, small_tokenizer, seed=0, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))


def test_each_file_suite_runs_end_to_end_with_a_tiny_random_policy(policy, pool, tmp_path):
    from spade_jax.agent import AgentConfig

    cfg = runner.EvalConfig(limit=2, seed=1, batch_size=4)
    agent = AgentConfig(max_turns=1, max_new_tokens=8, context_budget=768)
    for spec in (f"aime:{AIME}", f"gpqa:{GPQA}", f"lcb:{LCB}"):
        suite = make_suite(spec, GenerationSettings(max_new_tokens=8), cfg)
        first = runner.run_suite(policy, pool, suite, cfg, agent, tmp_path / "a", progress=False, spec=spec)
        again = runner.run_suite(policy, pool, suite, cfg, agent, tmp_path / "b", progress=False, spec=spec)
        strip = {k: v for k, v in again.summary.items() if k != "wall_s"}
        assert strip == {k: v for k, v in first.summary.items() if k != "wall_s"}
        assert first.summary["items"] == 2 and 0.0 <= first.summary["score"] <= 1.0
        assert set(first.summary["groups"]) == {i.group for i in suite.items(2, 1)}
        rows = (tmp_path / "a" / f"{suite.name}.jsonl").read_text()
        assert rows == (tmp_path / "b" / f"{suite.name}.jsonl").read_text()
        assert len(rows.splitlines()) == 2
