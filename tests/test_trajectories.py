"""Tool-use trajectory synthesis: graph, chains, query checks, calibration, export, replay, chat template."""

import json
import re
import types

import numpy as np
import pytest

from spade_jax.agent import AgentConfig, play_episodes
from spade_jax.envs import library
from spade_jax.sampling import Generation, GenerationStats
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.trajectories import chains as chains_lib
from spade_jax.trajectories.export import (Example, read_jsonl, record_calls, rl_task, score_transcript, sft_record,
                                           write_jsonl)
from spade_jax.trajectories.graph import ToolProbe, probe_graph, read_tool_schemas, text_values
from spade_jax.trajectories.queries import spelled_out, ungrounded
from spade_jax.trajectories.synth import NoToolPrograms, SynthConfig, load_programs, summary_table, synthesize

# Two tools: get_orders takes the id that find_user prints, never a value of the observation.
SHOP_DB = '''
import random
from spade_jax.envs import ToolUseEnv

NAMES = ["alice", "bruno", "chen", "dana", "emil"]
GOODS = ["lamp", "desk", "mug", "pen"]


class OrdersEnv(ToolUseEnv):
    tools = [
        {"type": "function", "function": {"name": "find_user", "description": "The id of a customer.",
         "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
        {"type": "function", "function": {"name": "get_orders", "description": "Orders of a customer id.",
         "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}},
                        "required": ["user_id"]}}},
    ]

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.ids = {name: "u" + str(rng.randint(100, 999)) for name in NAMES}
        self.orders = {uid: rng.sample(GOODS, 2) for uid in self.ids.values()}
        self.who = rng.sample(NAMES, 2)
        self.expected_answer = ", ".join(self.orders[self.ids[self.who[0]]])
        return "Customers " + " and ".join(self.who) + " wrote in. What did " + self.who[0] + " order?", {}

    def tool_find_user(self, name):
        key = str(name).strip().lower()
        if key not in self.ids:
            return "Unknown customer."
        return "Customer " + key + " has id " + self.ids[key] + "."

    def tool_get_orders(self, user_id):
        if user_id not in self.orders:
            return "Unknown id."
        return "Orders of " + user_id + ": " + ", ".join(self.orders[user_id]) + "."

    def solution(self):
        return "<answer>" + self.expected_answer + "</answer>"
'''

TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] }}\n<tools>{% for tool in tools %}\n"
    "{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{%- for message in messages[1:] %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{% for call in message.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(num_workers=1)) as p:
        yield p


def _probe(pool, source):
    return ToolProbe(pool, source, read_tool_schemas(source))


def test_text_values_rank_list_members_and_names_first():
    values = text_values("You buy 2 apple, 3 bread. Ask Bob about 'green tea'.")
    tiers = {value: tier for tier, value in values}
    assert tiers["apple"] == tiers["bread"] == tiers[2] == tiers["Bob"] == tiers["green tea"] == 0
    assert tiers["You"] == tiers["Ask"] == 1 and tiers["about"] == 2


def test_graph_of_two_tools_has_the_feeding_edge_and_one_entry(pool):
    graph = probe_graph(pool, SHOP_DB)
    assert graph.nodes == ("find_user", "get_orders")
    assert graph.entry == ("find_user",)  # no id appears in the observation
    assert graph.has_edge("find_user", "get_orders")
    assert ("find_user", "get_orders", "user_id") in {(e.source, e.target, e.argument) for e in graph.edges}
    assert not graph.has_edge("get_orders", "find_user")  # "Orders of u123: lamp, mug." names no customer


def test_graph_of_shopping_is_one_entry_tool_feeding_itself(pool):
    graph = probe_graph(pool, library.load_source("shopping"))
    assert graph.nodes == ("price",) and graph.entry == ("price",)
    assert [(e.source, e.target, e.argument) for e in graph.edges] == [("price", "price", "item")]


def test_tools_with_an_f_string_description_are_read_without_running_the_program():
    (schema,) = read_tool_schemas(library.load_source("hidden_rule"))
    assert schema["function"]["description"] == "Run the machine on a whole number x from 0 to 5."


def test_chains_follow_the_graph_within_the_depth_and_depend_on_the_seed(pool):
    probe = _probe(pool, SHOP_DB)
    graph = probe_graph(pool, SHOP_DB)
    cfg = chains_lib.ChainConfig(max_calls=3, skip_prob=0.5)
    chains, dropped = chains_lib.sample_chains(probe, graph, 10, cfg, seed=3)
    assert len(chains) + dropped == 10 and len(chains) >= 8
    assert any(len(c.calls) > 1 for c in chains) and any(c.calls[-1].tool == "get_orders" for c in chains)
    for chain in chains:
        assert 1 <= len(chain.calls) <= 3 and len(chain.results) == len(chain.calls)
        assert chain.calls[0].tool in graph.entry
        for before, after in zip(chain.calls, chain.calls[1:]):
            assert after.tool in graph.entry or graph.has_edge(before.tool, after.tool)
        assert not any(r.startswith("Unknown") for r in chain.results)
    again, _ = chains_lib.sample_chains(probe, graph, 10, cfg, seed=3)
    other, _ = chains_lib.sample_chains(probe, graph, 10, cfg, seed=4)
    assert again == chains and other != chains


def test_a_query_that_spells_out_the_calls_is_rejected():
    call = chains_lib.Call("get_orders", {"user_id": "u123"})
    chain = chains_lib.Chain(0, "task", (chains_lib.Call("price", {"item": "milk"}), call), ("a", "b"))
    names = ["price", "get_orders"]
    assert spelled_out("What did the customer order? Use get_orders.", chain, names) == "names tool 'get_orders'"
    assert spelled_out("Call price(milk) for me", chain, names) == "names tool 'price'"
    assert spelled_out('Please run <tool_call>{"name": "x"}</tool_call>', chain, names).startswith("call syntax")
    assert spelled_out('Look up {"user_id": "u123"} please', chain, names) == "argument JSON"
    assert spelled_out("What is the price of milk, and what did customer u123 buy?", chain, names) is None


def test_a_query_without_a_value_the_user_must_supply_is_ungrounded():
    fed = chains_lib.Call("get_orders", {"user_id": "u123"}, fed=True)
    chain = chains_lib.Chain(0, "task", (chains_lib.Call("find_user", {"name": "alice"}), fed),
                             ("Customer alice has id u123.", "Orders of u123: lamp."))
    assert ungrounded("What did Alice order?", chain) is None  # u123 comes from the first result
    assert ungrounded("What did the customer order?", chain) == "missing value 'alice'"


def test_load_programs_rejects_a_directory_without_tool_use_programs(tmp_path):
    (tmp_path / "game.py").write_text(library.load_source("arithmetic"))
    with pytest.raises(NoToolPrograms, match="no tool-use program"):
        load_programs(str(tmp_path))
    (tmp_path / "orders.py").write_text(SHOP_DB)
    programs, skipped = load_programs(str(tmp_path))
    assert [name for name, _ in programs] == ["orders"] and [name for name, _ in skipped] == ["game"]


def _canned_queries(chats):
    """A stand-in query writer: names the shopping items of the trace (one reply names the tool)."""
    out = []
    for i, chat in enumerate(chats):
        items = re.findall(r'item="([a-z]+)"', chat[-1]["content"])
        out.append("Call price(x) please" if i == 0 else f"How much do these cost: {', '.join(items)}?")
    return out


def _shopping_agent(follow: bool):
    """A scripted agent: with ``follow`` it asks the price of each item the query names, then answers."""

    def sample(policy, prompts, *, max_new_tokens, **unused):
        tok = policy.tokenizer
        rows = []
        for prompt in prompts:
            text = tok.decode(prompt)
            items = re.search(r"How much do these cost: ([a-z, ]+)\?", text).group(1).split(", ")
            asked = text.count('"name": "price"')
            if follow and asked < len(items):
                reply = '<tool_call>{"name": "price", "arguments": {"item": "' + items[asked] + '"}}</tool_call>'
            else:
                reply = "<answer>0</answer>"
            rows.append(tok.encode(reply) + [tok.eos_token_ids[0]])
        width = max(map(len, rows))
        tokens = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
        return Generation(tokens, np.zeros(tokens.shape, np.float32), np.array(list(map(len, rows)), np.int32),
                          np.ones(len(rows), bool), GenerationStats(0.0, 0.0, 0.0, width, (len(rows), 0, width)))

    return sample


@pytest.mark.parametrize("follow,verified_by", [(True, "agent"), (False, "reference")])
def test_synthesis_exports_records_that_replay_to_their_end_state(pool, small_tokenizer, tmp_path, follow,
                                                                  verified_by):
    source = library.load_source("shopping")
    policy = types.SimpleNamespace(tokenizer=small_tokenizer)

    def play(requests):
        return play_episodes(policy, pool, requests, AgentConfig(max_turns=6, max_new_tokens=64, context_budget=4096),
                             sample=_shopping_agent(follow))

    cfg = SynthConfig(chains_per_env=5, chain=chains_lib.ChainConfig(max_calls=3))
    examples, (report,) = synthesize(pool, [("shopping", source)], _canned_queries, play, cfg, progress=False)
    assert report.chains == report.queries == 5 and report.spelled_out == 1  # the reply naming price(
    assert report.kept == len(examples) == 4 and {e.verified_by for e in examples} == {verified_by}
    assert "| shopping | 1 / 1 / 1 | 5 | 5 | 1 | 0 | 4 | 80% |" in summary_table([report])

    path = str(tmp_path / "sft.jsonl")
    assert write_jsonl(path, (sft_record(e) for e in examples)) == 4
    probe = _probe(pool, source)
    for record in read_jsonl(path):
        meta = record["meta"]
        tool_messages = [m["content"] for m in record["messages"] if m["role"] == "tool"]
        assert tool_messages == meta["results"] and meta["verified_by"] == verified_by
        assert chains_lib.replay(probe, meta["seed"], record_calls(record)) == meta["results"]
        assert record["messages"][-1]["content"] == f"<answer>{meta['results'][-1]}</answer>"
        assert "price" not in record["messages"][1]["content"].split(":")[0]

    task = rl_task(examples[0])
    assert task["program"] == source and score_transcript(task, sft_record(examples[0])["messages"])
    missing_last = [m for m in sft_record(examples[0])["messages"] if m.get("content") != task["checker"]["results"][-1]]
    assert not score_transcript(task, missing_last)


def test_an_exported_record_round_trips_through_a_tool_chat_template(pool):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    source = SHOP_DB
    probe = _probe(pool, source)
    graph = probe_graph(pool, source)
    chains, _ = chains_lib.sample_chains(probe, graph, 6, chains_lib.ChainConfig(min_calls=2, max_calls=3), seed=1)
    chain = max(chains, key=lambda c: len(c.calls))
    record = sft_record(Example("orders", source, read_tool_schemas(source), chain, "What did alice buy?", "agent"))
    record = json.loads(json.dumps(record))  # as read back from the file

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tokenizer.chat_template = TOOL_TEMPLATE
    text = tokenizer.apply_chat_template(record["messages"], tools=record["tools"], tokenize=False)
    assert "What did alice buy?" in text and '"name": "get_orders"' in text
    for call, result in zip(record["meta"]["chain"], record["meta"]["results"]):
        assert f'{{"name": "{call["name"]}", "arguments": {json.dumps(call["arguments"])}}}' in text
        assert f"<tool_response>\n{result}\n</tool_response>" in text
    assert text.count("<tool_call>") == len(chain.calls) and f"<answer>{chain.results[-1]}</answer>" in text


def test_the_loop_synthesizes_from_the_tool_use_environments_in_memory(tmp_path, random_selfplay, monkeypatch):
    from spade_jax.trajectories import run as synthesis

    def configure(c):
        c.trajectories.update(every=1, max_envs=1, chains_per_env=3)
        c.trajectories.chain.max_calls = 3

    monkeypatch.setattr(synthesis, "complete_chats",
                        lambda policy, chats, **unused: [types.SimpleNamespace(text=t) for t in _canned_queries(chats)])
    monkeypatch.setattr(synthesis, "play_episodes",
                        lambda *a, **k: play_episodes(*a, sample=_shopping_agent(True), **k))
    run = random_selfplay(tmp_path, configure)
    try:
        metrics = run.components.named("trajectories").run(5)
    finally:
        run.close()
    # memory's newest tool-use program (the seed library's first: shopping); the first query names price(
    assert metrics == {"trajectories/envs": 1, "trajectories/chains": 3, "trajectories/kept": 2,
                       "trajectories/acceptance": 2 / 3, "trajectories/by_agent": 2}
    out = tmp_path / "trajectories" / "5"
    sft, rl = read_jsonl(str(out / "sft.jsonl")), read_jsonl(str(out / "rl.jsonl"))
    assert len(sft) == len(rl) == 2 and all(score_transcript(t, r["messages"]) for t, r in zip(rl, sft))
    assert "| seed-shopping | 1 / 1 / 1 | 3 | 3 | 1 | 0 | 2 | 67% | 2 | 0 |" in (out / "summary.md").read_text()


def test_the_trajectories_section_is_validated():
    from spade_jax.selfplay.config import base_config, validate

    c = base_config()
    c.model.source = "random"
    c.trajectories.every = -1
    with pytest.raises(ValueError, match="config.trajectories: every must be >= 0"):
        validate(c, 1)
    c.trajectories.every = 2
    c.trajectories.chains_per_env = 0
    with pytest.raises(ValueError, match="config.trajectories: SynthConfig.chains_per_env"):
        validate(c, 1)
