"""EnvironmentMemory: records, replay updates, eviction order, exemplars, lossless state, and the
refusal of a state saved with a retired setting. The reference's rules, case by case:
tests/conformance/test_conformance_memory.py."""
import json

import numpy as np
import pytest

from spade_jax.designer.memory import RETIRED_SETTINGS, EnvironmentMemory


CODE = "class GuessEnv:\n    def reset(self, seed=None):\n        return 'guess', {}\n"


def _add(mem, win_rate, regret, iteration=0, skill="logical deduction", **kw):
    return mem.add(CODE, skill, iteration=iteration, win_rate=win_rate, mean_plain=win_rate,
                   mean_hinted=win_rate + regret, regret=regret, designer_reward=0.5, **kw)


def test_add_fields_ids_and_validation():
    mem = EnvironmentMemory()
    env_id, evicted = mem.add(CODE, "optimization", iteration=3, doc_id="doc-7", win_rate=0.25,
                              mean_plain=0.25, mean_hinted=float("nan"), regret=np.float32(0.5),
                              designer_reward=0.8, admission={"stages": ["import", "reset"], "ok": True})
    assert (env_id, evicted) == ("env-000000", [])
    rec = mem.get(env_id)
    assert (rec.skill, rec.doc_id, rec.win_rate, rec.regret) == ("optimization", "doc-7", 0.25, 0.5)
    assert rec.mean_hinted is None  # NaN (no hinted episodes) is stored as None
    assert (rec.iteration_added, rec.last_played, rec.times_replayed) == (3, 3, 0)
    assert rec.admission == {"stages": ["import", "reset"], "ok": True}
    assert mem.add_seed(CODE, "spatial reasoning", name="maze") == "seed-maze"
    assert mem.get("seed-maze").is_seed and not mem.get("seed-maze").measured
    assert _add(mem, 0.5, 0.1)[0] == "env-000002"
    with pytest.raises(ValueError, match="already in the memory"):
        mem.add_seed(CODE, "spatial reasoning", name="maze")
    with pytest.raises(ValueError, match="JSON-serialisable"):
        mem.add(CODE, "x", iteration=0, admission={"f": object()})
    with pytest.raises(ValueError, match="non-empty"):
        mem.add("  ", "x", iteration=0)
    with pytest.raises(KeyError, match="not in the memory"):
        mem.get("nope")


def test_update_on_replay_keeps_the_first_measurement():
    mem = EnvironmentMemory()
    env_id, _ = _add(mem, 0.5, 0.1, iteration=1)
    rec = mem.update(env_id, iteration=4, win_rate=0.75, mean_plain=0.7, mean_hinted=0.9, regret=0.2,
                     plain_wins=[1, 0])
    assert (rec.win_rate, rec.mean_plain, rec.regret) == (0.5, 0.5, 0.1)  # the reference writes a record once
    assert rec.designer_reward == 0.5 and rec.recent_plain == [1, 0]  # not given: kept
    assert (rec.times_replayed, rec.last_played, mem.iteration) == (1, 4, 4)
    mem.update(env_id, iteration=5, win_rate=0.5, mean_plain=0.5, mean_hinted=0.5, regret=0.0,
               designer_reward=0.1)
    assert (rec.times_replayed, rec.designer_reward) == (2, 0.1)
    seed = mem.get(mem.add_seed(CODE, "optimization", name="s"))
    mem.update(seed.env_id, iteration=6, win_rate=0.25, mean_plain=0.25, mean_hinted=None, regret=0.0)
    assert seed.win_rate == 0.25  # a seed's first play measures it


def test_eviction_is_first_in_first_out():
    mem = EnvironmentMemory(capacity=3)
    a, _ = _add(mem, 0.5, 0.9, iteration=0)
    b, _ = _add(mem, 0.5, 0.1, iteration=0)
    _add(mem, 0.5, 0.2, iteration=1)
    mem.update(a, iteration=3, win_rate=0.5, mean_plain=0.5, mean_hinted=0.9, regret=0.4)  # played: still first
    _, evicted = _add(mem, 0.5, 0.05, iteration=3)
    assert evicted == [a]
    _, evicted = _add(mem, 0.5, 0.0, iteration=3)
    assert evicted == [b] and len(mem) == 3


def _exemplar_memory():
    mem = EnvironmentMemory()
    for name, wr, rg in [("p1", 0.5, 0.3), ("p2", 0.3, 0.2), ("p3", 0.7, 0.1), ("p4", 0.2, 0.05),
                         ("p5", 0.6, 0.0), ("easy", 1.0, 0.0), ("hard", 0.0, 0.0), ("mid", 0.88, 0.4)]:
        _add(mem, wr, rg, env_id=name)
    return mem


def test_exemplars_follow_reference_criteria():
    mem = _exemplar_memory()
    seen = set()
    for seed in range(30):
        ex = mem.exemplars(seed)
        assert [e.kind for e in ex] == ["positive", "positive", "negative"]
        pos = [e.env_id for e in ex[:2]]
        assert set(pos) <= {"p1", "p2", "p3", "p4", "p5"}  # the band, top max(3 * 2, 10) by regret
        assert all(e.label == "good difficulty" for e in ex[:2])
        neg = ex[2]
        assert neg.label == {"easy": "too easy", "hard": "too hard"}[neg.env_id]
        seen.add(tuple(pos))
    assert len(seen) > 1  # varied across prompts
    assert mem.exemplars(7) == mem.exemplars(np.random.default_rng(7))  # seed or Generator


def test_exemplars_when_not_enough_qualify():
    assert EnvironmentMemory().exemplars(0) == []
    mem = EnvironmentMemory()
    _add(mem, 0.5, 0.3, env_id="p1")
    mem.add_seed(CODE, "pattern recognition", name="s")  # unmeasured: never shown
    _add(mem, 0.88, 0.4, env_id="mid")  # outside the band and not a negative: never shown
    ex = mem.exemplars(0, n_positive=3, n_negative=1)
    assert [(e.env_id, e.label) for e in ex] == [("p1", "good difficulty")]
    _add(mem, 0.95, 0.0, env_id="easy")
    ex = mem.exemplars(0, n_positive=1, n_negative=2)  # only one negative exists
    assert [e.env_id for e in ex] == ["p1", "easy"]


def test_designer_prompts_cut_exemplar_code_to_the_prompt_size():
    from spade_jax.designer.corpus import Document
    from spade_jax.designer.prompts import PromptConfig, slot_messages

    mem = EnvironmentMemory()
    long_code = "\n".join(f"x{i} = {i}" for i in range(10))
    mem.add(long_code, "optimization", iteration=0, win_rate=0.5, mean_plain=0.5,
            mean_hinted=0.6, regret=0.1, env_id="opt")
    doc = Document(doc_id="d", text="a short document", n_words=3, truncated=False)
    prompt = PromptConfig(exemplars_positive=1, exemplars_negative=0, exemplar_max_chars=20)
    user = slot_messages(mem, np.random.default_rng(0), "optimization", "easy", doc, prompt)[1]["content"]
    assert "x0 = 0\nx1 = 1\nx2 = 2\n```" in user and "x3" not in user  # the first 20 characters
    none = slot_messages(mem, np.random.default_rng(0), "optimization", "easy", doc,
                         PromptConfig(exemplars_positive=0, exemplars_negative=0))[1]["content"]
    assert "x0 = 0" not in none


def test_state_round_trip_is_lossless():
    mem = EnvironmentMemory(capacity=4)
    mem.add_seed(CODE, "causal inference", name="fork", admission={"note": "seed"})
    for i, (wr, rg) in enumerate([(0.1 + 0.2, 1 / 3), (0.5, 0.1), (0.95, 2 ** -40), (0.0, 0.0)]):
        _add(mem, wr, rg, iteration=i + 1, doc_id=f"doc-{i}", admission={"times": [1.5, i]})
    mem.update("env-000002", iteration=6, win_rate=0.4, mean_plain=0.4, mean_hinted=None,
               regret=0.123456789012345)
    state = mem.to_state()
    restored = EnvironmentMemory.from_state(json.loads(json.dumps(state, allow_nan=False)))
    assert restored.to_state() == state
    assert restored.records() == mem.records()
    assert [r.env_id for r in restored.records()] == [r.env_id for r in mem.records()]
    assert restored.get("env-000001").win_rate == 0.1 + 0.2
    assert restored.exemplars(3) == mem.exemplars(3)
    assert _add(restored, 0.5, 0.2, iteration=7) == _add(mem, 0.5, 0.2, iteration=7)
    assert restored.to_state() == mem.to_state()
    with pytest.raises(ValueError, match="version"):
        EnvironmentMemory.from_state({"version": 99})


def test_a_state_saved_with_a_retired_setting_loads_only_at_todays_rule():
    mem = EnvironmentMemory()
    _add(mem, 0.5, 0.1)
    state = json.loads(json.dumps(mem.to_state()))
    state.update({name: list(rule) if isinstance(rule, tuple) else rule for name, (rule, _) in RETIRED_SETTINGS.items()})
    assert EnvironmentMemory.from_state(state).records() == mem.records()  # saved at today's rules: loads
    state["eviction"] = "regret_staleness"
    with pytest.raises(ValueError, match=r"eviction='regret_staleness'.*retired after commit"):
        EnvironmentMemory.from_state(state)
