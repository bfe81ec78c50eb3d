"""The seed environment library: registry, rendering, and every program at its knob extremes.

In-process checks run each program (default knobs and every min/max knob combination)
through reset determinism, solution replay, malformed actions and turn limits. The
admission test runs the same renderings through the sandbox's eight stages.
"""

import ast
import itertools
import json
import pathlib
import re

import pytest

from spade_jax.envs import ToolUseEnv, library
from spade_jax.envs.contract import PARTIAL_CREDIT_SCALE, SUCCESS_REWARD, is_success

SEEDS = range(12)
MALFORMED_ACTIONS = [
    "",
    "   ",
    "I am not sure.",
    "\\boxed{}",
    "\\boxed{ }",
    "\\boxed{???}",
    "\\boxed{flip}",
    "\\boxed{answer}",
    "boxed{1}",
    "<answer></answer>",
    "<answer> </answer>",
    "<tool_call>not json</tool_call>",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "price", "arguments": {"item": 1e999}}</tool_call>',
    '<tool_call>{"name": "apply", "arguments": {"x": Infinity}}</tool_call>',
]
WELL_FORMED_GUESSES = ["\\boxed{1}", "\\boxed{A}", "\\boxed{up}", "\\boxed{flip 1}", "<answer>1</answer>",
                       '<tool_call>{"name": "roads", "arguments": {"town": "A"}}</tool_call>']


def _knob_settings(env):
    """Default knobs plus every combination of each knob's min and max."""
    extremes = [(values[0], values[-1]) for values in env.knobs.values()]
    combos = [dict(zip(env.knobs, values)) for values in itertools.product(*extremes)]
    return [None] + [combo for combo in combos if combo != library.default_knobs(env.name)]


def _load_class(source, module_name="seed_env"):
    namespace = {"__name__": module_name}
    exec(compile(source, module_name, "exec"), namespace)
    classes = [value for key, value in namespace.items()
               if key.endswith("Env") and isinstance(value, type) and value.__module__ == module_name]
    assert len(classes) == 1, [cls.__name__ for cls in classes]
    return classes[0]


def _case_id(name, knobs):
    return f"{name}-{'default' if knobs is None else '-'.join(map(str, knobs.values()))}"


CASES = [pytest.param(env.name, knobs, id=_case_id(env.name, knobs))
         for env in library.SEED_ENVS for knobs in _knob_settings(env)]


def _check_step(result, max_reward=SUCCESS_REWARD):
    observation, reward, terminated, truncated, info = result
    assert isinstance(observation, str) and isinstance(info, dict)
    assert type(reward) is float and -1.0 <= reward <= max_reward
    assert type(terminated) is bool and type(truncated) is bool
    assert not (terminated and truncated)
    return result


# --- registry -------------------------------------------------------------------------------


def test_registry_covers_every_skill_and_both_kinds():
    assert library.SKILLS == ("mathematical reasoning", "logical deduction", "spatial reasoning",
                              "pattern recognition", "optimization", "causal inference")
    assert len(library.SEED_ENVS) >= 14
    assert len({env.name for env in library.SEED_ENVS}) == len(library.SEED_ENVS)
    for skill in library.SKILLS:
        assert len(library.by_skill(skill)) >= 2, skill
    kinds = [env.kind for env in library.SEED_ENVS]
    assert kinds.count("tool_use") >= 5 and kinds.count("game") >= 5
    assert set(kinds) == {"game", "tool_use"}


@pytest.mark.parametrize("env", library.SEED_ENVS, ids=lambda env: env.name)
def test_program_shape_matches_registry(env):
    source = library.load_source(env.name)
    tree = ast.parse(source)
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert len(classes) == 1 and classes[0].name.endswith("Env")
    cls = _load_class(source)
    assert issubclass(cls, ToolUseEnv) == (env.kind == "tool_use")
    assert f"Skill: {env.skill}." in ast.get_docstring(tree)
    method_names = [node.name for node in classes[0].body if isinstance(node, ast.FunctionDef)]
    assert method_names[:2] == ["__init__", "reset"] and "solution" in method_names
    if env.kind == "game":
        assert method_names[2] == "step"
    else:
        assert cls.tools and all(hasattr(cls, f"tool_{tool['function']['name']}") for tool in cls.tools)
    imports = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imports.add(node.module.split(".")[0])
    allowed = {"math", "random", "re", "json", "itertools", "collections", "heapq", "string", "fractions",
               "dataclasses", "typing", "functools", "numpy", "spade_jax"}
    assert imports <= allowed
    assert 40 <= len(source.splitlines()) <= 120


@pytest.mark.parametrize("env", library.SEED_ENVS, ids=lambda env: env.name)
def test_knob_comments_match_registry(env):
    source = library.load_source(env.name)
    documented = dict(re.findall(r"^([A-Z_]+) = -?\d+  # allowed: (-?\d+\.\.-?\d+)", source, re.MULTILINE))
    assert set(documented) == set(env.knobs)
    defaults = library.default_knobs(env.name)
    for knob, values in env.knobs.items():
        low, high = map(int, documented[knob].split(".."))
        assert values == tuple(range(low, high + 1))
        assert defaults[knob] in values


def test_readme_table_matches_registry():
    readme = (pathlib.Path(library.__file__).parent / "README.md").read_text()
    seed_section = readme.split("\n## Testbed families")[0]  # the testbed's table is checked in test_testbed_envs
    rows = re.findall(r"^\| (\w+) \| ([a-z ]+) \| (game|tool use)[^|]* \| ([^|]+) \|", seed_section, re.MULTILINE)
    table = {name: (skill, kind.replace(" ", "_"), knobs.strip()) for name, skill, kind, knobs in rows}
    expected = {}
    for env in library.SEED_ENVS:
        knobs = ", ".join(f"{knob} {values[0]}..{values[-1]}" for knob, values in env.knobs.items())
        expected[env.name] = (env.skill, env.kind, knobs)
    assert table == expected


def test_render_substitutes_knobs_and_rejects_bad_ones():
    source = library.render("arithmetic", {"NUM_OPERANDS": 4, "MAX_OPERAND": 99})
    assert "NUM_OPERANDS = 4  # allowed: 2..4" in source
    assert "MAX_OPERAND = 99  # allowed: 5..99" in source
    assert library.render("arithmetic") == library.load_source("arithmetic")
    assert library.render("arithmetic", {}) == library.load_source("arithmetic")
    assert library.default_knobs("arithmetic") == {"NUM_OPERANDS": 2, "MAX_OPERAND": 9}
    with pytest.raises(ValueError, match="unknown seed environment 'nope'"):
        library.render("nope")
    with pytest.raises(ValueError, match="has no knob 'GRID_SIZE'"):
        library.render("arithmetic", {"GRID_SIZE": 3})
    with pytest.raises(ValueError, match=r"NUM_OPERANDS must be an int in 2\.\.4, got 5"):
        library.render("arithmetic", {"NUM_OPERANDS": 5})
    with pytest.raises(ValueError, match="got True"):
        library.render("job_order", {"WEIGHTED": True})
    with pytest.raises(ValueError, match="unknown skill"):
        library.by_skill("cooking")
    assert [env.name for env in library.by_skill("causal inference")] == [
        "switch_lights", "causal_chain", "plant_experiment"]


# --- every program at its knob extremes -----------------------------------------------------


@pytest.mark.parametrize("name,knobs", CASES)
def test_program_contract_at_knob_extremes(name, knobs):
    cls = _load_class(library.render(name, knobs))
    env = cls()
    for seed in SEEDS:
        observation, info = env.reset(seed)
        assert isinstance(observation, str) and isinstance(info, dict)
        assert ("\\boxed{" in observation) or ("<answer>" in observation)
        assert len(observation) < 800
        assert env.reset(seed)[0] == observation and cls().reset(seed)[0] == observation
        solution = env.solution()
        env.reset(seed)
        assert env.solution() == solution

        # The reference solution wins within max_turns, with no earlier terminal step.
        actions = solution.split("\n")
        assert 1 <= len(actions) <= env.max_turns
        for i, action in enumerate(actions):
            observation, reward, terminated, truncated, _ = _check_step(env.step(action))
            if i < len(actions) - 1:
                assert not terminated and not truncated and reward == 0.0, (seed, action, observation)
        assert terminated and is_success(reward), (seed, observation)
        assert _check_step(env.step(actions[-1]))[2], "stepping a finished episode reports it terminated"

        # Malformed actions never win; any repeated action ends the episode within max_turns.
        for probe in MALFORMED_ACTIONS + WELL_FORMED_GUESSES:
            env.reset(seed)
            max_reward = 0.0 if probe in MALFORMED_ACTIONS else SUCCESS_REWARD
            for _ in range(env.max_turns):
                _, reward, terminated, truncated, _ = _check_step(env.step(probe), max_reward)
                if terminated or truncated:
                    break
            assert terminated or truncated, (probe, "episode outlived max_turns")


@pytest.mark.parametrize("env", library.SEED_ENVS, ids=lambda env: env.name)
def test_reset_varies_with_seed_and_max_turns_is_honoured(env):
    cls = _load_class(library.load_source(env.name))
    env_instance = cls()
    instances = {(env_instance.reset(seed)[0], env_instance.solution()) for seed in range(20)}
    assert len(instances) >= 5
    short = cls(max_turns=1)
    short.reset(0)
    assert _check_step(short.step("nonsense"))[3], "a one-turn episode is truncated after one bad action"
    assert short.step(short.solution().split("\n")[0])[1:3] == (0.0, True)


# --- hand-checked answers for a few programs --------------------------------------------------


def test_arithmetic_answer_matches_python():
    cls = _load_class(library.render("arithmetic", {"NUM_OPERANDS": 4, "MAX_OPERAND": 99}))
    env = cls()
    for seed in range(50):
        observation, _ = env.reset(seed)
        expression = re.match(r"Compute ([\d +*-]+)\.", observation).group(1)
        assert re.fullmatch(r"\d+( [+*-] \d+){3}", expression)
        assert env.solution() == f"\\boxed{{{eval(expression)}}}"  # the test's own evaluator
        assert env.step(f"\\boxed{{{eval(expression) + 1}}}")[1:3] == (0.0, True)


def test_compass_walk_answer_matches_independent_walk():
    cls = _load_class(library.render("compass_walk", {"NUM_MOVES": 8, "MAX_STEP": 9, "RELATIVE": 1}))
    env = cls()
    vectors = [(0, 1), (1, 0), (0, -1), (-1, 0)]
    for seed in range(50):
        observation, _ = env.reset(seed)
        x = y = heading = 0
        for turn, steps in re.findall(r"(?:turn (left|right) and )?walk (\d+)", observation):
            heading = (heading + {"left": -1, "right": 1, "": 0}[turn]) % 4
            x, y = x + vectors[heading][0] * int(steps), y + vectors[heading][1] * int(steps)
        assert env.solution() == f"\\boxed{{{x},{y}}}"
        assert env.step(f"\\boxed{{ ({x}, {y}) }}")[1] == SUCCESS_REWARD


def test_knapsack_optimum_matches_brute_force_and_overweight_loses():
    cls = _load_class(library.render("knapsack", {"NUM_ITEMS": 7, "MAX_WEIGHT": 9, "MAX_VALUE": 20}))
    env = cls()
    for seed in range(20):
        observation, _ = env.reset(seed)
        capacity = int(re.search(r"at most (\d+) kg", observation).group(1))
        items = {label: (int(w), int(v))
                 for label, w, v in re.findall(r"(\w): (\d+) kg, worth (\d+)", observation)}
        subsets = [subset for n in range(len(items) + 1) for subset in itertools.combinations(items, n)]
        best = max(sum(items[i][1] for i in subset) for subset in subsets
                   if sum(items[i][0] for i in subset) <= capacity)
        chosen = env.solution()[len("\\boxed{"):-1]
        assert sum(items[i][1] for i in chosen) == best
        total_weight = sum(weight for weight, _ in items.values())
        assert env.step("\\boxed{ABCDEFG}")[:3] == (f"Too heavy: {total_weight} kg.", 0.0, True)


def test_job_order_shortest_first_is_optimal_and_longest_first_loses():
    cls = _load_class(library.render("job_order", {"NUM_JOBS": 4, "MAX_DURATION": 9, "WEIGHTED": 0}))
    env = cls()
    for seed in range(30):
        observation, _ = env.reset(seed)
        hours = {label: int(h) for label, h in re.findall(r"(\w) takes (\d+) h", observation)}
        shortest_first = sorted(hours, key=lambda job: (hours[job], job))
        for job in shortest_first:
            result = env.step(f"\\boxed{{{job}}}")
        assert result[1] == SUCCESS_REWARD
        if len(set(hours.values())) > 1:
            env.reset(seed)
            for job in reversed(shortest_first):
                result = env.step(f"\\boxed{{{job}}}")
            assert result[1:3] == (0.0, True)


def test_shortest_path_answer_matches_floyd_warshall_over_tool_calls():
    cls = _load_class(library.render("shortest_path", {"NUM_TOWNS": 8, "MAX_COST": 9, "EXTRA_ROADS": 6}))
    env = cls()
    for seed in range(20):
        env.reset(seed)
        towns = "ABCDEFGH"
        distance = {(a, b): 0 if a == b else float("inf") for a in towns for b in towns}
        for town in towns:
            call = json.dumps({"name": "roads", "arguments": {"town": town.lower()}})
            reply = env.step(f"<tool_call>{call}</tool_call>")[0]
            for other, cost in re.findall(r"(\w) \(cost (\d+)\)", reply):
                distance[town, other] = int(cost)
        for k, a, b in itertools.product(towns, repeat=3):
            distance[a, b] = min(distance[a, b], distance[a, k] + distance[k, b])
        assert env.expected_answer == str(distance["A", "H"])


def test_number_guess_feedback_and_limits():
    cls = _load_class(library.render("number_guess", {"MAX_NUMBER": 1000}))
    env = cls()
    env.reset(7)
    assert env.step("\\boxed{1001}")[0].startswith("Invalid action")
    low, high = 1, 1000
    for _ in range(10):
        guess = (low + high) // 2
        observation, reward, terminated, _, _ = env.step(f"My guess: \\boxed{{{guess}}}")
        if terminated:
            break
        low, high = (guess + 1, high) if "too low" in observation else (low, guess - 1)
    assert reward == SUCCESS_REWARD


def test_tool_use_answer_format_and_wrong_answer():
    cls = _load_class(library.render("plant_experiment", {"NUM_FACTORS": 6, "NUM_CAUSES": 2}))
    env = cls()
    env.reset(3)
    first, second = env.causes
    assert env.step(f"<answer>{second.upper()} ,{first}</answer>")[1] == SUCCESS_REWARD
    env.reset(3)
    assert env.step(f"<answer>{first}</answer>")[1:3] == (0.0, True)


def _near_misses(name, env):
    """A wrong answer for the instance ``env`` was reset to and its closeness, computed here
    from the instance's own data (not through ``closeness``)."""
    if name == "shopping":
        expected = int(env.expected_answer)
        return f"<answer>{expected + 1}</answer>", 1 - 1 / expected
    if name == "tallest":
        second = sorted(env.people, key=env.heights.get)[-2]
        return f"<answer>{second}</answer>", (len(env.people) - 2) / (len(env.people) - 1)
    if name == "nearest_city":
        distance = {c: abs(x - env.home[0]) + abs(y - env.home[1]) for c, (x, y) in env.positions.items()}
        farthest = max(distance, key=distance.get)
        return f"<answer>{farthest.lower()}</answer>", (min(distance.values()) + 1) / (distance[farthest] + 1)
    if name == "plant_experiment":
        return f"<answer>{', '.join(env.factors)}</answer>", len(env.causes) / len(env.factors)
    if name == "repeat_pattern":
        wrong = env.answer[:-1] + [next(c for c in "ABCDEF" if c != env.answer[-1])]
        return f"\\boxed{{{' '.join(wrong)}}}", (len(env.answer) - 1) / len(env.answer)
    fits = [(sum(env.items[i][1] for i in chosen), "".join(chosen))
            for n in range(1, len(env.items) + 1) for chosen in itertools.combinations(env.items, n)
            if sum(env.items[i][0] for i in chosen) <= env.capacity]
    value, chosen = max(fit for fit in fits if fit[0] < env.best_value)
    return f"\\boxed{{{chosen}}}", value / env.best_value


GRADED = {"shopping": None, "tallest": None, "nearest_city": None, "plant_experiment": {"NUM_FACTORS": 6},
          "repeat_pattern": {"ANSWER_LENGTH": 4}, "knapsack": {"NUM_ITEMS": 6}}


@pytest.mark.parametrize("name", GRADED)
def test_partial_credit_grades_a_wrong_answer_only_when_asked(name):
    cls = _load_class(library.render(name, GRADED[name]))
    graded = 0
    for seed in range(12):
        for partial in (False, True):
            env = cls(partial_credit=partial)
            env.reset(seed)
            wrong, closeness = _near_misses(name, env)
            _, reward, terminated, _, _ = _check_step(env.step(wrong))
            assert terminated and not is_success(reward)
            assert reward == pytest.approx(PARTIAL_CREDIT_SCALE * closeness if partial else 0.0)
            graded += partial and reward > 0
            env.reset(seed)
            assert env.step(env.solution().splitlines()[-1])[1] == SUCCESS_REWARD
        env = cls(partial_credit=True)
        env.reset(seed)
        nonsense = "\\boxed{Z}" if env.step.__qualname__.startswith(cls.__name__) else "<answer>Zed</answer>"
        assert env.step(nonsense)[1] == 0.0
    assert graded >= 10  # near misses score on most seeds (a 0 closeness is possible, e.g. a one-item bag)


def test_partial_credit_reaches_the_program_through_the_sandbox():
    from spade_jax.sandbox import EpisodeSpec, SandboxPool, SandboxConfig

    pool = SandboxPool(SandboxConfig())
    try:
        specs = [EpisodeSpec(library.load_source("knapsack"), seed=5, env_kwargs={"partial_credit": flag})
                 for flag in (False, True)]
        starts = pool.start(specs)
        assert all(start.ok for start in starts), [start.error for start in starts]
        env = _load_class(library.load_source("knapsack"))(partial_credit=True)
        env.reset(5)
        wrong, closeness = _near_misses("knapsack", env)
        steps = pool.step([start.episode_id for start in starts], [wrong, wrong])
        pool.close([start.episode_id for start in starts])
    finally:
        pool.close_all()
    assert [step.reward for step in steps] == pytest.approx([0.0, PARTIAL_CREDIT_SCALE * closeness])


# --- sandbox admission ---------------------------------------------------------------------


def test_every_seed_env_passes_admission_and_is_novel():
    admission = pytest.importorskip("spade_jax.admission")
    from spade_jax.admission.similarity import code_similarity
    from spade_jax.sandbox import SandboxPool

    # Default, all-minimum and all-maximum knobs (the in-process test covers every min/max mix).
    cases = []
    for env in library.SEED_ENVS:
        lowest = {knob: values[0] for knob, values in env.knobs.items()}
        highest = {knob: values[-1] for knob, values in env.knobs.items()}
        cases += [(env.name, None), (env.name, lowest), (env.name, highest)]
    sources = [library.render(name, knobs) for name, knobs in cases]
    config = admission.AdmissionConfig(batch_novelty=False)  # renderings of one game are alike by design
    pool = SandboxPool(config.sandbox)
    try:
        reports = admission.admit_batch(sources, config, archive=(), pool=pool)
    finally:
        pool.close_all()
    failures = [(_case_id(name, knobs), report.stage, report.reason)
                for (name, knobs), report in zip(cases, reports) if not report.admitted]
    assert not failures
    assert all(report.stage == admission.STAGES[-1] for report in reports)

    # Distinct programs must not look like near-duplicates of each other to the novelty stage.
    names = [env.name for env in library.SEED_ENVS]
    similarity = {(a, b): code_similarity(library.load_source(a), library.load_source(b))
                  for a, b in itertools.combinations(names, 2)}
    closest = sorted(similarity.items(), key=lambda item: -item[1])[:5]
    print("closest seed env pairs:", ", ".join(f"{a}/{b} {score:.2f}" for (a, b), score in closest))
    assert max(similarity.values()) < config.novelty_threshold
