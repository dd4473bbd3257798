"""lathe's GRPO tool calling against TRL 1.16's (goldens from `bench/grpo_goldens.py --tools`): a tiny model
that calls `add` in Qwen2.5's format, with a standalone tool, a stateful environment owning its reward, and a
dict of two environments picked per row. The same completion tokens (the tool results included), tool masks,
rewards and advantages at every generation, and the same logged numbers (tools/* included) at every step."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grpo_cases  # noqa: E402
import grpo_tool_cases  # noqa: E402

GOLDEN = json.loads((HERE / "golden" / "trl_grpo_tools.json").read_text())
# Relative tolerance of the logged numbers. `tools`: step 1 agrees to 1e-6 and step 2's tokens, masks, rewards,
# loss and KL to 1e-4, but step 2's grad_norm differs by 3e-4 (not explained yet; at learning_rate 5e-2 it was
# 4e-3, so a small difference of step 1's update that step 2 amplifies; test_grpo_golden's mask_truncated shows
# the same signature).
TOLERANCE = {"tools": 1e-3}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return grpo_tool_cases.copy_model(tmp_path_factory.mktemp("grpo_tool_model"))


def run_lathe_tool_case(name: str, model_dir: str, output_dir: str) -> dict:
    from lathe.llm.rl import GRPOConfig, GRPOTrainer

    settings = {**grpo_tool_cases.BASE, **grpo_tool_cases.CASES[name]}
    tools = [grpo_tool_cases.add] if settings.pop("tools", False) else None
    kind = settings.pop("environment", None)
    generations, rewards = [], {}
    functions = []
    for function in grpo_tool_cases.REWARDS:

        @functools.wraps(function)
        def call(*args, _function=function, **kwargs):
            values = _function(*args, **kwargs)
            rewards.setdefault(_function.__name__, []).append(list(values))
            return values

        functions.append(call)

    class Recording(GRPOTrainer):
        def _generate_and_score(self, rows, mode):
            output = super()._generate_and_score(rows, mode)
            mask = output["completion_mask"].bool()
            ids = [row[m].tolist() for row, m in zip(output["completion_ids"], mask)]
            tool_mask = [row[m].tolist() for row, m in zip(output["tool_mask"], mask)]
            generations.append(
                {"completion_ids": ids, "tool_mask": tool_mask, "advantages": output["advantages"].tolist()}
            )
            return output

    trainer = Recording(
        model=model_dir,
        reward_funcs=functions,
        args=GRPOConfig(output_dir=output_dir, **settings),
        train_dataset=grpo_tool_cases.dataset(kind),
        tools=tools,
        environment_factory=grpo_tool_cases.environment_factory(kind) if kind else None,
    )
    trainer.train()
    for index, generation in enumerate(generations):
        generation["rewards"] = {key: values[index] for key, values in rewards.items()}
    return grpo_tool_cases.record(trainer, generations)


@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_grpo_tools_match_trl(case, model_dir, tmp_path):
    torch.set_num_threads(1)
    expected = GOLDEN["cases"][case]
    got = run_lathe_tool_case(case, model_dir, str(tmp_path))
    grpo_cases.assert_matches_trl(case, got, expected, log_rel=TOLERANCE.get(case, 1e-4), exact=("tool_mask",))


def test_lathes_qwen_template_renders_the_tools_and_results_as_the_chat_template_does():
    """`template: qwen` (lathe's template, its tool_format) gives the prompt and tool-result tokens that TRL's
    rendering (the model's Qwen2.5 chat template) gives, so the golden numbers hold for either."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from lathe.llm.rl.tools import ChatTemplateRendering, TemplateRendering
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(grpo_tool_cases.MODEL))
    chat = ChatTemplateRendering(tokenizer)
    lathes = TemplateRendering(get_template_and_fix_tokenizer(tokenizer, SimpleNamespace(template="qwen")), tokenizer)
    prompt = [{"role": "user", "content": "add 3 and 4"}]
    assert lathes.prompt_ids(prompt, [grpo_tool_cases.add]) == chat.prompt_ids(prompt, [grpo_tool_cases.add])
    assert lathes.prompt_ids(prompt, []) == chat.prompt_ids(prompt, [])
    results = [{"role": "tool", "name": "add", "content": "7"}]
    assert lathes.suffix_ids(results) == chat.suffix_ids(results)
    assert "<tool_response>\n7\n</tool_response>" in tokenizer.decode(chat.suffix_ids(results))


def test_a_tool_call_is_parsed_run_and_a_failure_is_the_models_to_read():
    from transformers import AutoTokenizer

    from lathe.llm.rl.tool_parsing import call_tools, parse_completion

    tokenizer = AutoTokenizer.from_pretrained(str(grpo_tool_cases.MODEL))
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
    message = parse_completion(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"], "qwen")
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}
    assert message == {"role": "assistant", "content": "", "tool_calls": [call]}
    broken = parse_completion(
        tokenizer, tokenizer('<tool_call>\n{"name": "add"', add_special_tokens=False)["input_ids"], "qwen"
    )
    assert "tool_calls" not in broken and broken["content"].startswith('\n{"name"')
    quoted = '<tool_call>\n{"name": "add", "arguments": {"a": "3", "b": "4.0"}}\n</tool_call>'
    ids = tokenizer(quoted, add_special_tokens=False)["input_ids"]
    assert parse_completion(tokenizer, ids, "qwen", [grpo_tool_cases.add])["tool_calls"] == [call]  # cast as TRL
    unknown = {"type": "function", "function": {"name": "mul", "arguments": {}}}
    wrong = {"type": "function", "function": {"name": "add", "arguments": {"c": 1}}}
    results, failures = call_tools([call, unknown, wrong], {"add": grpo_tool_cases.add})
    assert results[0] == ("add", 7) and results[1] == ("mul", {"error": "Tool mul not found."})
    assert "unexpected keyword argument 'c'" in results[2][1]["error"] and failures == 2


@pytest.mark.slow
def test_the_calculator_example_learns_to_call_the_tool_with_the_questions_numbers(tmp_path, monkeypatch):
    """examples/grpo_calculator/calculator.yaml as a user runs it (from the repository root), cut to 10 steps:
    the mean reward of steps 6-10 is above that of steps 1-5 (docs/GRPO.md: 0.18 then 0.24), the tool is called,
    and the reward curve is plotted."""
    from lathe.llm.config import parse_train_config
    from lathe.llm.workflows.stages import run_train

    monkeypatch.chdir(HERE.parents[1])
    overrides = [f"output_dir={tmp_path / 'out'}", "max_steps=10", "logging_steps=5"]
    run_train(parse_train_config("examples/grpo_calculator/calculator.yaml", overrides))
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "reward" in entry]
    rewards = [entry["reward"] for entry in logged]
    assert len(rewards) == 2 and rewards[1] > rewards[0] + 0.03, rewards
    assert all(entry["tools/call_frequency"] > 0.5 for entry in logged)
    assert (tmp_path / "out" / "training_reward.png").is_file()


def test_environments_are_pooled_reset_with_their_row_and_misuse_is_one_error():
    from lathe.llm.rl.environments import Environments

    class NoReset:
        def add(self, a: int, b: int) -> int:
            """Add.

            Args:
                a: a.
                b: b.
            """
            return a + b

    with pytest.raises(ValueError, match="NoReset has no `reset` method"):
        Environments(NoReset, [])
    environments = Environments({"adder": grpo_tool_cases.Adder, "counter": grpo_tool_cases.Counter}, [])
    assert [f.__name__ for f in environments.reward_functions] == ["Adder"]  # only Adder owns a reward
    rows = [{"prompt": [{"role": "user", "content": "q"}], "target": 7, "environment": e} for e in ("adder", "counter")]
    names = environments.names_of(rows * 2, [0, 1, 2, 3])
    instances = environments.instances_for(names)
    assert len(environments.pool["adder"]) == 2 and instances[0] is not instances[2]  # one instance per rollout
    prompts = environments.reset(instances, [r["prompt"] for r in rows * 2], rows * 2)
    assert (
        instances[0].target == 7 and prompts[1][-1]["content"] == "q (count calls)" and prompts[0] == rows[0]["prompt"]
    )
    assert rows[1]["prompt"][-1]["content"] == "q"  # the row is left as it is
    with pytest.raises(ValueError, match="dataset row 5: environment='maze' is not among"):
        environments.names_of([{"environment": "maze"}], [5])


def test_a_tool_without_type_hints_and_docstring_is_one_error_naming_it():
    from lathe.llm.rl.tool_parsing import tool_schemas

    def undocumented(a, b):
        return a + b

    with pytest.raises(ValueError, match="'undocumented' cannot be described as a JSON schema"):
        tool_schemas([undocumented])
