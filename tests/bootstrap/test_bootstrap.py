"""The tiny preset's bootstrap: its training data, tokenizer, a short training run and the cache.

The full-size bar (admission rate of designed programs, agent win rate) is measured by
experiments/bootstrap/tiny_bootstrap.py; here a very small configuration checks the mechanism.
"""

import dataclasses
import random

import numpy as np
import pytest

from spade_jax.admission import AdmissionConfig, admit_batch
from spade_jax.agent.conversation import Conversation
from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT, HINT_SEPARATOR, SOLUTION_HINT_PREFIX
from spade_jax.designer.corpus import Corpus, CorpusConfig
from spade_jax.designer.prompts import DESIGNER_SYSTEM_PROMPT, designer_answer
from spade_jax.envs import library
from spade_jax.models.tokenizer import IM_END, SentencePieceTokenizer, render_chatml
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.bootstrap import build as bootstrap
from spade_jax.bootstrap import data
from spade_jax.rl.batch import TrainSequence

TINY = bootstrap.BootstrapConfig(
    num_programs=12, agent_seeds=1, vocab_size=768, hidden_size=64, intermediate_size=128, num_layers=1,
    num_heads=2, head_dim=32, steps=8, warmup_steps=2, rows=1, micro_batch_rows=1, row_length=4096, lr=1e-2)
KEYS = [(env.name, difficulty) for env in library.SEED_ENVS[::6] for difficulty in ("easy", "hard")]


@pytest.fixture(scope="module")
def programs():
    return data.render_programs(KEYS, 12, random.Random(0), 0.5)


@pytest.fixture(scope="module")
def transcripts(programs):
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        return data.play_solutions(pool, [p.code for p in programs], [0, 1], [2, 3], max_turns=8,
                                   hint_mode="solution")


@pytest.fixture(scope="module")
def slots():
    prompt = dataclasses.replace(bootstrap.BootstrapConfig().prompt, exemplars_positive=1)
    memory = data.seeded_memory()
    for record in memory.records():  # measured in the win-rate band, so the prompts show them
        memory.update(record.env_id, iteration=0, win_rate=0.5, mean_plain=0.5, mean_hinted=0.5, regret=0.0)
    corpus = Corpus.from_config(CorpusConfig(max_words=prompt.doc_max_words))
    return data.designer_slots(12, memory, [corpus.document(i) for i in range(len(corpus))], prompt,
                               bootstrap.BootstrapConfig().envs, np.random.default_rng(0))


@pytest.fixture(scope="module")
def prompts(slots, programs):
    return [(slot.messages, program.code) for slot, program in zip(slots, programs)]


@pytest.fixture(scope="module")
def tokenizer(prompts, transcripts, tmp_path_factory):
    texts = data.chat_texts(prompts, transcripts)
    return SentencePieceTokenizer.train(texts, 768, tmp_path_factory.mktemp("tok") / "sp",
                                        user_defined_symbols=bootstrap.TOKENIZER_SYMBOLS,
                                        split_by_unicode_script=False, split_by_whitespace=False)


def test_programs_cycle_through_the_keys_and_are_deterministic(programs):
    assert [(p.name, p.difficulty) for p in programs] == KEYS * 2
    assert [p.code for p in data.render_programs(KEYS, 12, random.Random(0), 0.5)] == [p.code for p in programs]
    for p in programs:
        env = library.get(p.name)
        assert all(value in env.knobs[knob] for knob, value in p.knobs.items())


def test_designer_slots_are_iteration_zero_prompts_answered_with_a_seed_of_their_skill(slots):
    assert {s.skill for s in slots} == set(library.SKILLS)
    assert {s.difficulty for s in slots} == {"easy", "medium", "hard"}
    for slot in slots:
        user = slot.messages[1]["content"]
        assert f"Skill: {slot.skill}\nDifficulty: {slot.difficulty}" in user
        assert slot.env in bootstrap.BootstrapConfig().envs and library.get(slot.env).skill == slot.skill
        assert "[... truncated: first 40 of" in user  # a 40-word document excerpt
        # one exemplar from the seeded memory, its first 400 characters only
        block = user.split("```python\n", 1)[1].split("\n```", 1)[0]
        assert user.count("```python\n") == 1 and 300 < len(block) <= 400


def test_knobs_follow_the_difficulty_third_of_each_range():
    env = library.get("number_guess")  # MAX_NUMBER 4..1000
    rng = random.Random(0)
    easy = [data.knobs_for(env, "easy", rng)["MAX_NUMBER"] for _ in range(50)]
    hard = [data.knobs_for(env, "hard", rng)["MAX_NUMBER"] for _ in range(50)]
    assert max(easy) < 4 + 997 // 3 + 1 and min(hard) >= 4 + 2 * 997 // 3


def test_every_rendered_program_passes_admission_against_the_seed_sources(programs):
    archive = [library.load_source(env.name) for env in library.SEED_ENVS]
    reports = admit_batch([designer_answer(p.code) for p in programs], AdmissionConfig(), archive)
    assert [(r.stage, r.reason) for r in reports if not r.admitted] == []
    assert all(r.details["max_similarity"] < 0.85 for r in reports)


def test_hinted_transcripts_carry_the_whole_plan_on_seeds_disjoint_from_the_plain_ones(programs, transcripts):
    plain = [t for t in transcripts if t.hint is None]
    hinted = [t for t in transcripts if t.hint is not None]
    assert len(plain) >= len(programs) and len(hinted) >= len(programs)  # most plays fit 8 turns
    assert {t.seed for t in plain} == {0, 1} and {t.seed for t in hinted} == {2, 3}
    for t in hinted:
        plan = " ".join(f"{turn}) {action}" for turn, action in enumerate(t.actions, 1))
        assert t.hint == SOLUTION_HINT_PREFIX + plan and len(t.observations) == len(t.actions)
    # the seeds are different instances: some program's plain and hinted actions differ
    assert any(p.actions != h.actions for p in plain for h in hinted if p.program == h.program)
    with SandboxPool(SandboxConfig(num_workers=1)) as pool, pytest.raises(ValueError, match="overlap"):
        data.play_solutions(pool, [programs[0].code], [0, 1], [1], max_turns=8)


def test_a_hint_drill_relabels_every_action_value_and_its_plan_alike():
    hinted = data.Transcript(
        "p", 2, ("You buy 2 bread. Total?", "One bread costs 6 coins.", "Tea is at (3, 4)."),
        ('<tool_call>{"name": "price", "arguments": {"item": "bread", "qty": 12}}</tool_call>',
         '<tool_call>{"name": "locate", "arguments": {"city": "Tea", "item": "bread"}}</tool_call>',
         "<answer>bread 37</answer>"), hint="the original plan")
    words = data.action_words([hinted])
    assert words == ["Tea", "bread"]  # tool and key names are form, not values
    drill = data.hint_drill(hinted, ["rice", "milk", "Lima"], random.Random(0))
    assert drill.observations == hinted.observations and drill.seed == hinted.seed
    assert drill.hint == SOLUTION_HINT_PREFIX + " ".join(f"{k}) {a}" for k, a in enumerate(drill.actions, 1))
    first, second, answer = drill.actions
    item = first.split('"item": "')[1].split('"')[0]
    city = second.split('"city": "')[1].split('"')[0]
    qty = first.split('"qty": ')[1].split("}")[0]
    # the same value is relabelled the same way everywhere; two values never become one word
    assert second.endswith(f'"item": "{item}"}}}}</tool_call>') and answer.startswith(f"<answer>{item} ")
    assert item in {"rice", "milk", "Lima"} and city in {"rice", "milk", "Lima"} and item != city
    assert len(qty) == 2 and qty[0] != "0" and len(answer.split()[1].removesuffix("</answer>")) == 2
    assert first.startswith('<tool_call>{"name": "price", "arguments": {"item": "')
    assert second.startswith('<tool_call>{"name": "locate", "arguments": {"city": "')
    # capital letters are relabelled one by one, consistently
    boxed = data.Transcript("k", 3, ("Pack items.",), (r"\boxed{BCB}",), hint="x")
    letters = [data.hint_drill(boxed, [], random.Random(seed)).actions[0] for seed in range(20)]
    assert all(a[7] == a[9] and len(a) == len(r"\boxed{BCB}") for a in letters) and len(set(letters)) > 10
    with pytest.raises(ValueError, match="hinted"):
        data.hint_drill(dataclasses.replace(hinted, hint=None), words, random.Random(0))


def test_designer_answers_are_not_variants_of_an_exemplar_the_prompt_shows():
    prompt = dataclasses.replace(bootstrap.BootstrapConfig().prompt, exemplars_positive=3)
    corpus = Corpus.from_config(CorpusConfig(max_words=prompt.doc_max_words))
    envs = [env.name for env in library.SEED_ENVS]
    memory = data.seeded_memory()
    for record in memory.records():  # measured in the win-rate band, so the prompts show them
        memory.update(record.env_id, iteration=0, win_rate=0.5, mean_plain=0.5, mean_hinted=0.5, regret=0.0)
    slots = data.designer_slots(60, memory, [corpus.document(i) for i in range(len(corpus))],
                                prompt, envs, np.random.default_rng(0))

    def shown(name, slot):  # the exemplar block opens with the program's first line
        return "```python\n" + library.load_source(name).splitlines()[0] in slot.messages[1]["content"]

    avoided = 0
    for slot in slots:
        same_skill = [name for name in envs if library.get(name).skill == slot.skill]
        assert not shown(slot.env, slot) or all(shown(name, slot) for name in same_skill)
        avoided += any(shown(name, slot) for name in same_skill)
    assert avoided >= 5  # the rule had programs to avoid


def test_designer_sequence_is_the_prompt_then_the_trained_answer(prompts, tokenizer):
    messages, code = prompts[0]
    seq = data.designer_sequence(tokenizer, messages, code)
    prompt_len = int(np.argmax(seq.loss_mask))
    assert not seq.loss_mask[:prompt_len].any() and seq.loss_mask[prompt_len:].all()
    assert seq.tokens[:prompt_len].tolist() == tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert messages[0]["content"] == DESIGNER_SYSTEM_PROMPT
    assert tokenizer.decode(seq.tokens[:prompt_len], skip_special_tokens=False) == render_chatml(messages)
    answer = tokenizer.decode(seq.tokens[prompt_len:], skip_special_tokens=False)
    assert answer == designer_answer(code) + IM_END and seq.tokens[-1] == tokenizer.im_end_id
    assert seq.role == "designer"


def test_agent_sequence_is_the_conversation_the_rollout_builds(transcripts, tokenizer):
    hinted = next(t for t in transcripts if t.hint and len(t.actions) >= 2)
    seq = data.agent_sequence(tokenizer, hinted)
    conversation = Conversation.start(tokenizer, AGENT_SYSTEM_PROMPT,
                                      hinted.observations[0] + HINT_SEPARATOR + hinted.hint)
    for turn, action in enumerate(hinted.actions):
        ids = tokenizer.encode(action) + [tokenizer.im_end_id]
        conversation.add_response(ids, [0.0] * len(ids), action)
        if turn + 1 < len(hinted.actions):
            conversation.add_observation(tokenizer, hinted.observations[turn + 1], response_finished=True)
    assert seq.tokens.tolist() == conversation.tokens and seq.loss_mask.tolist() == conversation.generated
    # the trained runs are exactly the actions, each closed by the end-of-turn token
    edges = np.flatnonzero(np.diff(np.r_[0, seq.loss_mask.astype(int), 0]))
    runs = [tokenizer.decode(seq.tokens[a:b], skip_special_tokens=False) for a, b in zip(edges[::2], edges[1::2])]
    assert runs == [action + IM_END for action in hinted.actions]
    text = tokenizer.decode(seq.tokens, skip_special_tokens=False)
    assert f"HINT: {SOLUTION_HINT_PREFIX}1) {hinted.actions[0]} 2) {hinted.actions[1]}" in text
    assert seq.role == "agent"


def test_tokenizer_keeps_programs_exactly_and_markers_whole(programs, tokenizer):
    for p in programs:
        assert tokenizer.decode(tokenizer.encode(p.code)) == p.code
    for symbol in bootstrap.TOKENIZER_SYMBOLS + (IM_END,):
        assert len(tokenizer.encode(symbol)) == 1


def test_bootstrap_trains_caches_and_retrains_on_a_config_change(tmp_path, monkeypatch):
    policy = bootstrap.bootstrap_policy(tmp_path, TINY, progress=False)
    path = bootstrap.cache_path(tmp_path, TINY)
    stats = bootstrap.bootstrap_stats(path)
    assert stats["admission"]["admitted"] == stats["admission"]["rendered"] == 12
    curve = stats["loss"]["curve"]
    assert len(curve) == TINY.steps and np.mean(curve[-2:]) < curve[0] - 0.5
    assert policy.config.vocab_size == policy.tokenizer.vocab_size == 768

    def no_build(*args):
        raise AssertionError("a cached bootstrap was rebuilt")

    monkeypatch.setattr(bootstrap, "_build", no_build)
    again = bootstrap.bootstrap_policy(tmp_path, TINY, progress=False)
    tokens = np.asarray([again.tokenizer.encode("class GuessEnv:")], np.int32)
    np.testing.assert_array_equal(again.logits(tokens), policy.logits(tokens))

    changed = bootstrap.BootstrapConfig(**{**TINY.__dict__, "steps": 9})
    assert bootstrap.cache_key(changed) != bootstrap.cache_key(TINY)
    built = []
    monkeypatch.setattr(bootstrap, "_build", lambda p, cfg, progress: built.append(cfg) or no_build())
    with pytest.raises(AssertionError):
        bootstrap.bootstrap_policy(tmp_path, changed, progress=False)
    assert built == [changed]


def test_rows_mix_fresh_hint_drills_into_the_agent_transcripts_and_a_long_one_stops_none():
    def seq(token, n):
        return TrainSequence(np.full(n, token, np.int32), np.ones(n, bool), np.zeros(n, np.float32), 0.0)

    designer = [seq(1, 20)]  # one per row of 32, leaving room for two 6-token transcripts
    agent = [seq(2, 6), seq(4, 30), seq(3, 6)]  # 30 tokens fit no row beside a designer example
    for share, expected in ((0.0, {2, 3}), (1.0, set(range(100, 10_000))), (0.5, None)):
        drills = (seq(100 + k, 6) for k in range(10_000))
        cfg = bootstrap.BootstrapConfig(rows=2, row_length=32, hint_drill_share=share, hint_mode="solution")
        batches = bootstrap._batches(designer, agent, drills, cfg, np.random.default_rng(0))
        seen = [int(tokens[segments == k][0]) for batch in (next(batches) for _ in range(50))
                for tokens, segments in zip(batch.tokens_RT, batch.segment_ids_RT)
                for k in np.unique(segments) if k > 0 and tokens[segments == k][0] > 1]
        if expected is None:  # about half drills, each drawn once
            drilled = [t for t in seen if t >= 100]
            assert 0.35 < len(drilled) / len(seen) < 0.65 and len(set(drilled)) == len(drilled)
        else:
            assert set(seen) <= expected and len(seen) == 50 * 2 * 2  # every row is filled


def test_compile_warm_up_leaves_the_initial_state_untouched():
    from spade_jax.models import ModelConfig, make_mesh, random_policy
    from spade_jax.rl.train import LossConfig, OptimConfig, Trainer

    import jax

    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                         num_kv_heads=2, head_dim=16)
    trainer = Trainer(random_policy(config, mesh=make_mesh((1, 1, 1), jax.devices()[:1])),
                      OptimConfig(lr=1e-2), LossConfig(objective="nll"))
    before = jax.device_get(trainer.state_dict())
    bootstrap._compile(trainer, bootstrap.BootstrapConfig(rows=2, row_length=32))
    after = jax.device_get(trainer.state_dict())
    assert after["step"] == before["step"] == 0
    jax.tree.map(np.testing.assert_array_equal, after["params"], before["params"])
    jax.tree.map(np.testing.assert_array_equal, after["opt_state"], before["opt_state"])


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="rows must be a power of two"):
        bootstrap.BootstrapConfig(rows=6)
    with pytest.raises(ValueError, match="hidden_size must equal"):
        bootstrap.BootstrapConfig(hidden_size=100)
    with pytest.raises(ValueError, match="causal inference"):
        bootstrap.BootstrapConfig(envs=("shopping", "number_guess", "compass_walk", "repeat_pattern", "knapsack"))
    with pytest.raises(ValueError, match="unknown seed environment"):
        bootstrap.BootstrapConfig(envs=("nope",))
