"""Conformance of the designer memory with the reference (spade-rl/spade, issue 32).

Each rule of spade/core/env_memory.py and of its use (orchestrator.py `_augment_prompt_with_memory`,
slime/spade_rollout.py's memory write) is checked on hand-built records with hand-computed
expected exemplar sets; the last tests reach this code's earlier behaviour through its named
options. Draws are checked over many seeds: the set of records ever drawn is the pool.
"""
import numpy as np
import pytest

from spade_jax.designer.corpus import Document
from spade_jax.designer.memory import EnvironmentMemory
from spade_jax.designer.prompts import PromptConfig, slot_exemplars, slot_messages

SKILL = "logical deduction"
OTHER = "spatial reasoning"
SEEDS = range(300)


def _code(name: str) -> str:
    return f"class {name.capitalize()}Env:\n    pass\n"


def _add(mem, name, win_rate, regret, skill=SKILL, iteration=0):
    mem.add(_code(name), skill, iteration=iteration, env_id=name, win_rate=win_rate, mean_plain=win_rate,
            mean_hinted=win_rate + regret, regret=regret)


def _drawn(mem, kind, n_positive=2, n_negative=1, skill=SKILL, seeds=SEEDS):
    """Every record drawn as ``kind`` over ``seeds``, and the draws (tuples of ids, in order)."""
    draws = [tuple(e.env_id for e in mem.exemplars(seed, n_positive=n_positive, n_negative=n_negative, skill=skill)
                   if e.kind == kind) for seed in seeds]
    return {i for d in draws for i in d}, draws


def _band_memory(**options):
    """14 in-band records b00..b13 with regret 1.3, 1.2, ..., 0.0 and two out-of-band ones
    with higher regret (never positives)."""
    mem = EnvironmentMemory(**options)
    for k in range(14):
        _add(mem, f"b{k:02d}", 0.5, round(1.3 - 0.1 * k, 2))
    _add(mem, "edge_hi", 0.86, 5.0)
    _add(mem, "edge_lo", 0.14, 5.0)
    return mem


# ----------------------------------------------------------------- the reference's rules


def test_positives_come_from_the_top_max_3n_10_by_regret_in_the_win_rate_band():
    # env_memory.py:90-99: band [0.15, 0.85] (inclusive), pool = top max(3n, 10) by regret
    mem = _band_memory()
    pool_n2, draws = _drawn(mem, "positive", n_positive=2)
    assert pool_n2 == {f"b{k:02d}" for k in range(10)}  # max(6, 10) = 10
    assert all(len(d) == 2 for d in draws)
    pool_n4, _ = _drawn(mem, "positive", n_positive=4)
    assert pool_n4 == {f"b{k:02d}" for k in range(12)}  # max(12, 10) = 12
    mem = EnvironmentMemory()
    _add(mem, "at_lo", 0.15, 0.0)
    _add(mem, "at_hi", 0.85, 0.0)
    assert _drawn(mem, "positive")[0] == {"at_lo", "at_hi"}  # the bounds are in the band


def test_no_positive_when_no_record_is_in_the_band():
    # env_memory.py:93-94: no candidate, no positive (no fallback to unmeasured or borderline records)
    mem = EnvironmentMemory()
    mem.add_seed(_code("seed"), SKILL, name="s")
    _add(mem, "borderline", 0.88, 0.4)
    _add(mem, "easy", 0.95, 0.0)
    for seed in range(20):
        ex = mem.exemplars(seed, n_positive=2, n_negative=1, skill=SKILL)
        assert [(e.env_id, e.kind, e.label) for e in ex] == [("easy", "negative", "too easy")]


def test_the_negative_is_uniform_over_every_record_outside_0_1_to_0_9():
    # env_memory.py:117-123: win rate > 0.9 or < 0.1, drawn uniformly (regret plays no part)
    mem = EnvironmentMemory()
    for name, wr, rg in [("n0", 1.0, 0.9), ("n1", 0.95, 0.5), ("n2", 0.0, 0.1), ("n3", 0.05, 0.0),
                         ("n4", 0.92, -0.3), ("edge_lo", 0.1, 2.0), ("edge_hi", 0.9, 2.0), ("mid", 0.5, 0.2)]:
        _add(mem, name, wr, rg)
    pool, draws = _drawn(mem, "negative", seeds=range(1000))
    assert pool == {"n0", "n1", "n2", "n3", "n4"}  # 0.1 and 0.9 themselves are not negatives
    counts = [sum(d == (name,) for d in draws) for name in sorted(pool)]
    assert all(150 <= c <= 250 for c in counts), counts  # 1000 / 5 = 200 each
    labels = {e.env_id: e.label for s in range(50) for e in mem.exemplars(s, skill=SKILL) if e.kind == "negative"}
    assert labels == {"n0": "too easy", "n1": "too easy", "n2": "too hard", "n3": "too hard", "n4": "too easy"}


def test_a_slot_sees_only_records_of_its_own_skill():
    # orchestrator.py:1213,1224 pass the slot's skill; env_memory.py:87-88,114-115 filter by it
    mem = EnvironmentMemory()
    _add(mem, "mine", 0.5, 0.1)
    _add(mem, "mine_easy", 1.0, 0.0)
    _add(mem, "theirs", 0.5, 0.9, skill=OTHER)
    _add(mem, "theirs_hard", 0.0, 0.9, skill=OTHER)
    for seed in range(20):
        ex = mem.exemplars(seed, n_positive=2, n_negative=1, skill=SKILL)
        assert [(e.env_id, e.kind) for e in ex] == [("mine", "positive"), ("mine_easy", "negative")]
    doc = Document(doc_id="d", text="a document", n_words=2, truncated=False)
    user = slot_messages(mem, np.random.default_rng(0), SKILL, "easy", doc, PromptConfig())[1]["content"]
    assert "class MineEnv" in user and "mine_easy" in user and "Theirs" not in user and "theirs" not in user


def test_exemplar_code_is_cut_to_its_first_2000_characters():
    # env_memory.py:60: code_snippet = game_code[:2000], shown as it is
    code = "".join(f"value_{i:03d} = {i} * 2  # a line of forty characters...\n" for i in range(100))
    assert len(code) > 4000 and code.count("\n") == 100
    mem = EnvironmentMemory()
    mem.add(code, SKILL, iteration=0, env_id="long", win_rate=0.5, mean_plain=0.5, mean_hinted=0.6, regret=0.1)
    (ex,) = slot_exemplars(mem, np.random.default_rng(0), PromptConfig(exemplars_negative=0), SKILL)
    assert ex.code == code[:2000] and len(ex.code) == 2000
    user = slot_messages(mem, np.random.default_rng(0), SKILL, "easy", None, PromptConfig())[1]["content"]
    assert f"```python\n{code[:2000]}\n```" in user and "truncated" not in user


def test_eviction_is_first_in_first_out():
    # env_memory.py:72-74: records = records[-max_size:], whatever their regret or plays
    mem = EnvironmentMemory(capacity=3)
    _add(mem, "a", 0.5, 0.9, iteration=0)
    _add(mem, "b", 0.5, 0.0, iteration=1)
    _add(mem, "c", 0.5, 0.0, iteration=2)
    mem.update("a", iteration=3, win_rate=0.5, mean_plain=0.5, mean_hinted=1.4, regret=0.9)
    _, evicted = mem.add(_code("d"), SKILL, iteration=3, env_id="d", win_rate=0.5, mean_plain=0.5,
                         mean_hinted=0.5, regret=0.0)
    assert evicted == ["a"] and [r.env_id for r in mem.records()] == ["b", "c", "d"]
    _, evicted = mem.add(_code("e"), SKILL, iteration=3, env_id="e", win_rate=0.5, mean_plain=0.5,
                         mean_hinted=0.5, regret=0.0)
    assert evicted == ["b"] and "e" in mem


def test_record_statistics_are_the_regeneration_steps_with_unfloored_regret():
    # spade_rollout.py:722 win rate = share of plays with reward > 0; orchestrator.py:2046-2048
    # regret = mean R(hint) - mean R(no hint), unfloored; :2042-2043 hint failed -> regret 0
    from spade_jax.designer.memory import regeneration_statistics

    stats = regeneration_statistics([1.0, 0.5, 0.0, -0.2], [0.0, 0.2])
    assert stats == pytest.approx(dict(win_rate=0.5, mean_plain=0.325, mean_hinted=0.1, regret=-0.225))
    assert regeneration_statistics([0.25, 0.0], []) == dict(win_rate=0.5, mean_plain=0.125, mean_hinted=None,
                                                            regret=0.0)
    mem = EnvironmentMemory()
    mem.add(_code("r"), SKILL, iteration=4, env_id="r", **stats)
    assert mem.get("r").regret == pytest.approx(-0.225)  # stored unfloored
    # the reference writes a record once and never updates it: a replay keeps its statistics
    mem.update("r", iteration=5, win_rate=1.0, mean_plain=1.0, mean_hinted=1.0, regret=0.0, plain_wins=[1, 1],
               designer_reward=0.3)
    rec = mem.get("r")
    assert (rec.win_rate, rec.mean_plain, rec.mean_hinted) == (0.5, 0.325, 0.1) and rec.regret == pytest.approx(-0.225)
    assert (rec.times_replayed, rec.last_played, rec.recent_plain, rec.designer_reward) == (1, 5, [1, 1], 0.3)
    # a seed enters unmeasured; its first measurement is its one write
    mem.add_seed(_code("seed"), SKILL, name="s")
    mem.update("seed-s", iteration=5, **regeneration_statistics([1.0, 0.0], [1.0, 1.0]))
    mem.update("seed-s", iteration=6, **regeneration_statistics([1.0, 1.0], [1.0, 1.0]))
    assert (mem.get("seed-s").win_rate, mem.get("seed-s").regret) == (0.5, 0.5)


def test_a_negative_regret_ranks_below_zero_in_the_positive_pool():
    # candidates.sort(key=regret, reverse=True) with the regret unfloored (env_memory.py:97)
    mem = EnvironmentMemory()
    for k in range(10):
        _add(mem, f"z{k}", 0.5, 0.0)
    _add(mem, "neg", 0.5, -0.1)
    _add(mem, "pos", 0.5, 0.05)
    assert _drawn(mem, "positive")[0] == {"pos"} | {f"z{k}" for k in range(9)}  # top 10: z9 and neg left out


def test_drawn_positives_keep_the_draw_order():
    # random.sample returns its picks in the order drawn, not ranked by regret
    mem = EnvironmentMemory()
    _add(mem, "high", 0.5, 0.9)
    _add(mem, "low", 0.5, 0.1)
    _, draws = _drawn(mem, "positive")
    assert set(draws) == {("high", "low"), ("low", "high")}


def test_the_prompt_shows_two_positives_then_one_negative_after_the_request():
    # orchestrator.py:1204-1227: n=2 positives in a tagged block with skill, win rate and regret and
    # their code, appended after the whole request; then n=1 negative, one line, without code
    mem = EnvironmentMemory()
    _add(mem, "p1", 0.5, 0.3)
    _add(mem, "p2", 0.25, 0.2)
    _add(mem, "p3", 0.75, 0.1)
    _add(mem, "easy", 0.95, 0.0)
    doc = Document(doc_id="d", text="a document", n_words=2, truncated=False)
    for seed in range(10):
        user = slot_messages(mem, np.random.default_rng(seed), SKILL, "hard", doc, PromptConfig())[1]["content"]
        assert user.count("```python\n") == 2 and user.count("### Example ") == 2
        assert "### Example 3" not in user
        request = user.index("Write a new hard environment")
        first, second = user.index("### Example 1 ("), user.index("### Example 2 (")
        negative = user.index("- too easy (win_rate=0.95): environment easy")
        assert user.index("Ground the environment") < request < first < second < negative
        assert user.rstrip().endswith("environment easy") and "class EasyEnv" not in user
        assert "<EXAMPLE_ENVIRONMENTS>" in user[request:first] and "</EXAMPLE_ENVIRONMENTS>" in user[second:negative]
    user = slot_messages(mem, np.random.default_rng(0), SKILL, "hard", doc, PromptConfig())[1]["content"]
    headers = {line for line in user.splitlines() if line.startswith("### Example")}
    expected = {"(skill: logical deduction, win_rate: 0.50, regret: 0.30)",
                "(skill: logical deduction, win_rate: 0.25, regret: 0.20)",
                "(skill: logical deduction, win_rate: 0.75, regret: 0.10)"}
    assert {h.split(" ", 3)[3] for h in headers} <= expected and len(headers) == 2


def test_the_defaults_are_config_keys():
    from spade_jax.selfplay import config as config_lib

    c = config_lib.base_config()
    assert (tuple(c.memory.positive_win_range), tuple(c.memory.negative_win_bounds)) == ((0.15, 0.85), (0.1, 0.9))
    prompt = c.designer.prompt
    assert prompt.exemplar_max_chars == 2000


def test_without_a_skill_every_record_counts_as_the_reference():
    mem = EnvironmentMemory()
    _add(mem, "mine", 0.5, 0.1)
    _add(mem, "theirs", 0.5, 0.9, skill=OTHER)
    assert _drawn(mem, "positive", skill=None)[0] == {"mine", "theirs"}  # no skill: no filter
