"""`lathe train` with `stage: grpo`: the TRL golden numbers (tests/llm/golden/trl_grpo.json, case
conversational) from a registered dataset rendered by the template, the rows' other columns handed to the
reward functions with their types, a reward function that raises as one line naming it and the row, and
the GRPO keys checked when the config is read."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grpo_cases  # noqa: E402

from lathe.llm.config import parse_train_config  # noqa: E402
from tests.goldens import assert_close_to_golden, assert_same_files  # noqa: E402

GOLDEN = json.loads((HERE / "golden" / "trl_grpo.json").read_text())
SHAREGPT_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import shutil

    folder = tmp_path_factory.mktemp("grpo_stage_model")
    grpo_cases.build_model(folder)
    for item in (grpo_cases.TOKENIZER.parent / "bpe_chatml").iterdir():  # the ChatML chat template
        shutil.copy(item, folder / item.name)
    return str(folder)


def write_project(folder: Path, rows: list, entry: dict, rewards: str) -> None:
    (folder / "data").mkdir()
    (folder / "data" / "rows.json").write_text(json.dumps(rows))
    (folder / "data" / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json", **entry}}))
    (folder / "my_rewards.py").write_text(rewards)


def config_file(folder: Path, model_dir: str, **keys) -> str:
    import yaml

    values = {
        "model_name_or_path": model_dir,
        "stage": "grpo",
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(folder / "data"),
        "output_dir": str(folder / "out"),
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 8,
        "max_steps": 3,
        "learning_rate": 5.0e-2,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "disable_gradient_checkpointing": True,
        "use_cpu": True,
        **keys,
    }
    path = folder / "configs" / "grpo.yaml"  # the rewards module sits beside it, not in the working directory
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(values))
    (folder / "configs" / "my_rewards.py").write_text((folder / "my_rewards.py").read_text())
    return str(path)


def run(path: str) -> list[dict]:
    from lathe.llm.workflows.stages import run_train

    config = parse_train_config(path)
    run_train(config)
    return json.loads(Path(config.training.output_dir, "trainer_state.json").read_text())["log_history"]


def test_stage_grpo_logs_trls_numbers_from_a_registered_conversation(model_dir, tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": p}], "target": t}
        for p, t in zip(grpo_cases.PROMPTS, grpo_cases.TARGETS)
    ]
    entry = {"formatting": "sharegpt", "columns": {"messages": "prompt"}, "tags": SHAREGPT_TAGS}
    write_project(tmp_path, rows, entry, (HERE / "grpo_cases.py").read_text())
    path = config_file(
        tmp_path, model_dir, beta=0.1, reward_funcs="my_rewards:vowel_share, my_rewards:length_target", plot_loss=True
    )
    logs = run(path)
    expected = GOLDEN["cases"]["conversational"]["logs"]
    assert len(logs) == len(expected)
    timings = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    for step, (mine, theirs) in enumerate(zip(logs, expected), start=1):
        theirs = {key: value for key, value in theirs.items() if key not in timings}
        assert_close_to_golden({key: mine[key] for key in theirs}, theirs, f"lathe train logs, step {step}", rel=1e-4)
    assert (tmp_path / "out" / "training_reward.png").is_file() and (tmp_path / "out" / "training_loss.png").is_file()


RECORDING_REWARD = """
import json, os

def seen(prompts, completions, completion_ids, **columns):
    with open(os.environ["GRPO_SEEN"], "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions, "columns": sorted(columns),
                            "answer": columns["answer"], "meta": columns["meta"], "output": columns["output"]}) + "\\n")
    if 6 in columns["answer"]:
        raise KeyError("no rule for 6")
    return [float(a) for a in columns["answer"]]
"""


def test_alpaca_rows_hand_their_other_columns_to_the_rewards_and_a_raise_names_the_row(
    model_dir, tmp_path, monkeypatch
):
    rows = [
        {
            "instruction": "add",
            "input": f"{i} and 1",
            "output": str(i + 1),
            "answer": i + 1,
            "meta": {"id": i},
            "_id": i,
        }
        for i in range(6)
    ]
    write_project(tmp_path, rows, {}, RECORDING_REWARD)
    monkeypatch.setenv("GRPO_SEEN", str(tmp_path / "seen.jsonl"))
    path = config_file(tmp_path, model_dir, reward_funcs="my_rewards:seen", shuffle_dataset=False)
    with pytest.raises(ValueError, match=r"reward function 'seen' raised KeyError: 'no rule for 6'.*dataset row 5"):
        run(path)
    calls = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    first = calls[0]
    assert first["prompts"][0] == [{"role": "user", "content": "add\n0 and 1"}]  # alpaca: instruction + "\n" + input
    assert first["completions"][0][0]["role"] == "assistant" and len(first["completions"]) == 8
    assert first["columns"] == ["_id", "answer", "meta", "output", "trainer_state"]
    assert first["answer"] == [1] * 4 + [2] * 4 and first["meta"][0] == {"id": 0} and first["output"][0] == "1"


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"num_generations": 3}, r"generation_batch_size \(8\) must be divisible by num_generations \(3\)"),
        ({"loss_type": "ppo"}, "loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo"),
        ({"max_new_tokens": 16}, r"max_new_tokens .*stage grpo does not read \(use max_completion_length\)"),
        ({"cutoff_len": 512}, "cutoff_len .*use max_prompt_length and max_completion_length"),
        ({"reward_weights": "1, 2"}, "reward_weights has 2 values for 1 reward_funcs"),
        ({"reward_funcs": None}, "reward_funcs is required for stage grpo"),
        (
            {"stage": "sft", "beta": 0.1, "reward_funcs": None, "num_generations": None},
            "beta only applies to stages grpo and rloo",
        ),
        ({"val_size": 0.2}, "stage grpo .*trains only"),
        ({"enable_liger_kernel": True}, "enable_liger_kernel is not read by stage grpo"),
        ({"importance_sampling_level": "tokens"}, "importance_sampling_level must be one of token, sequence"),
        ({"use_vllm": True}, "use_vllm .*TRL GRPOConfig key that lathe's stage grpo does not implement yet"),
        ({"tools": "add"}, "tools: 'add' is not 'module:name'"),
        ({"environment_factory": {"maze": "envs"}}, "environment_factory: 'envs' is not 'module:name'"),
        ({"max_tool_calling_iterations": -1}, "max_tool_calling_iterations must be >= 0"),
        # TRL's RLOOTrainer takes no tools or environments: stage rloo names the key.
        ({"stage": "rloo", "tools": "calculator:add"}, "tools is a key of stage grpo; stage rloo"),
        ({"stage": "rloo", "environment_factory": "envs:Maze"}, "environment_factory is a key of stage grpo"),
        # An environment owning its reward may be the only reward source (the next error is reached).
        ({"reward_funcs": None, "environment_factory": "envs:Maze", "num_generations": 3}, r"divisible by .*\(3\)"),
        # TRL's default of a key lathe does not implement changes nothing: accepted (the next error is reached).
        ({"use_vllm": False, "num_generations": 3}, r"must be divisible by num_generations \(3\)"),
    ],
)
def test_grpo_keys_are_checked_when_the_config_is_read(tmp_path, keys, message):
    values = {
        "model_name_or_path": str(tmp_path),
        "stage": "grpo",
        "dataset": "rows",
        "output_dir": str(tmp_path / "out"),
        "reward_funcs": "r:f",
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        **keys,
    }
    with pytest.raises(ValueError, match=message):
        parse_train_config({k: v for k, v in values.items() if v is not None})


def test_grpo_sampling_keys_are_trls_and_the_generating_section_keeps_llamafactorys(tmp_path):
    from lathe.llm.config.grpo import grpo_config

    values = {"model_name_or_path": str(tmp_path), "dataset": "rows", "output_dir": str(tmp_path / "out")}
    config = parse_train_config({**values, "stage": "grpo", "reward_funcs": "r:f", "top_p": 0.9})
    args = grpo_config(config.training, config.finetuning)
    assert (args.temperature, args.top_p, args.top_k, args.num_generations, args.beta) == (1.0, 0.9, 0, 8, 0.0)
    assert (args.loss_type, args.max_completion_length, args.epsilon, args.scale_rewards) == ("dapo", 512, 0.2, "group")
    sft = parse_train_config({**values, "stage": "sft", "top_p": 0.9})
    assert (sft.generating.temperature, sft.generating.top_p, sft.generating.top_k) == (0.95, 0.9, 50)


def test_a_stage_rm_folder_is_a_reward_model_scoring_the_sampled_tokens(model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from lathe.llm.model.value_head import ValueHeadModel
    from lathe.llm.rl.reward_models import score_token_ids

    scorer = ValueHeadModel(AutoModelForCausalLM.from_pretrained(model_dir), dropout=0.0)
    with torch.no_grad():
        scorer.v_head.summary.weight.copy_(torch.linspace(-1, 1, scorer.v_head.summary.weight.numel()).view(1, -1))
    folder = tmp_path / "my_rm"
    scorer.save_pretrained(str(folder))  # stage rm's layout: the LM's weights and value_head.safetensors
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in grpo_cases.PROMPTS]
    entry = {"formatting": "sharegpt", "columns": {"messages": "prompt"}, "tags": SHAREGPT_TAGS}
    write_project(tmp_path, rows, entry, "")
    logs = run(config_file(tmp_path, model_dir, reward_funcs=str(folder), max_steps=1))
    assert logs[0]["rewards/my_rm/std"] > 0 and logs[0]["reward"] == logs[0]["rewards/my_rm/mean"]

    from lathe.llm.rl.rewards import resolve_reward_function

    loaded = resolve_reward_function(str(folder))
    prompts, completions = [[5, 6, 7], [8]], [[9, 2], [10, 11, 12, 2]]
    scores = score_token_ids(loaded, prompts, completions, pad_id=0)  # right-padded: each row's own last token
    with torch.no_grad():
        alone = [scorer(input_ids=torch.tensor([p + c]))[0, -1].item() for p, c in zip(prompts, completions)]
    assert scores.tolist() == pytest.approx(alone, rel=1e-5)


def test_the_plan_counts_sampling_and_the_reference_only_where_one_is_loaded(tmp_path, capsys):
    """A dry run (the model on the meta device): the KV cache of a generation batch is in the plan, the
    reference copy only for full fine-tuning with beta > 0, and the steps are the sampler's."""
    import re
    import shutil

    from transformers import LlamaConfig

    from lathe.llm.workflows.stages import run_train

    folder = tmp_path / "big"
    shutil.copytree(grpo_cases.TOKENIZER.parent / "bpe_chatml", folder)
    shape = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=8)
    LlamaConfig(vocab_size=512, num_key_value_heads=8, max_position_embeddings=8192, **shape).save_pretrained(folder)
    rows = [{"prompt": [{"role": "user", "content": "count to five:"}]}] * 8
    entry = {"formatting": "sharegpt", "columns": {"messages": "prompt"}, "tags": SHAREGPT_TAGS}
    write_project(tmp_path, rows, entry, "")
    keys = {"num_generations": 8, "max_completion_length": 4096, "max_steps": 2, "reward_funcs": "x:y"}
    plans = {}
    for method, extra in (("full", {"beta": 0.04}), ("lora", {})):
        run_train(parse_train_config(config_file(tmp_path, str(folder), finetuning_type=method, **keys, **extra)), True)
        plans[method] = capsys.readouterr().out
    prompt_tokens = int(re.search(r"train tokens\s+(\d+)", plans["full"]).group(1)) // 8
    kv_cache = 8 * (prompt_tokens + 4096) * 8 * 2 * 1024 * 4  # rows x tokens x layers x (k, v) x width x fp32
    prefill = 8 * prompt_tokens * (2 * 1024 + 2816) * 4
    sampling = float(re.search(r"sampling \(KV cache\) ([\d,.]+) MiB", plans["full"]).group(1).replace(",", ""))
    assert sampling == pytest.approx((kv_cache + prefill) / 2**20, abs=1)
    weights, reference = re.search(r"weights ([\d,.]+) MiB, reference model ([\d,.]+) MiB", plans["full"]).groups()
    assert weights == reference and "a frozen copy of the initial model (beta 0.04)" in plans["full"]
    assert "reference model" not in plans["lora"] and "none (beta 0" in plans["lora"]
    assert "8 per epoch, 2 in total" in plans["full"]  # 8 prompts, one per generation of 8 completions
    # generation_batch_size 64 on the 2 processes a launch will start (the plan is made before it): each process
    # samples 64 / 2 = 32 rows (steps_per_generation 4 of 8 rows), not the 64 one process would.
    config = parse_train_config(
        config_file(tmp_path, str(folder), finetuning_type="lora", generation_batch_size=64, **keys)
    )
    config.processes = 2
    run_train(config, True)
    shared = float(re.search(r"sampling \(KV cache\) ([\d,.]+) MiB", capsys.readouterr().out).group(1).replace(",", ""))
    assert shared == pytest.approx(4 * (kv_cache + prefill) / 2**20, abs=1)


def test_the_cpu_example_learns_its_task_and_its_assets_are_what_make_assets_writes(tmp_path, monkeypatch):
    """examples/grpo/digits.yaml as a user runs it (from the repository root), cut to 40 steps: the mean
    reward of steps 21-40 is far above that of steps 1-20 (docs/GRPO.md: 0.28 then 0.75 on 2 CPU cores)."""
    import importlib.util

    root = HERE.parents[1]
    spec = importlib.util.spec_from_file_location("grpo_make_assets", root / "examples" / "grpo" / "make_assets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = module.HERE
    monkeypatch.setattr(module, "HERE", tmp_path / "assets")
    module.main()
    # config.json holds transformers_version: JSON files are compared parsed, without the *_version keys
    assert_same_files(tmp_path / "assets", committed, "examples/grpo/digits (rerun examples/grpo/make_assets.py)")

    from lathe.llm.workflows.stages import run_train

    monkeypatch.chdir(root)
    config = parse_train_config("examples/grpo/digits.yaml", [f"output_dir={tmp_path / 'out'}", "max_steps=40"])
    run_train(config)
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    rewards = [entry["reward"] for entry in state["log_history"] if "reward" in entry]
    assert len(rewards) == 2 and rewards[1] > rewards[0] + 0.3, rewards
    assert (tmp_path / "out" / "training_reward.png").is_file()


def test_the_reference_is_a_copy_only_for_full_or_freeze_with_beta():
    from types import SimpleNamespace

    from lathe.llm.workflows.grpo import reference_description

    def described(method, beta):
        return reference_description(SimpleNamespace(finetuning=SimpleNamespace(finetuning_type=method, beta=beta)))

    assert described("lora", 0.1).startswith("the policy with its adapters off")
    assert described("full", 0.0).startswith("none") and described("lora", 0.0).startswith("none")
    assert described("freeze", 0.1).startswith("a frozen copy")


LORA_KEYS = {"finetuning_type": "lora", "lora_rank": 4, "lora_alpha": 8, "lora_target": "q_proj,v_proj"}


@pytest.mark.parametrize("case", sorted(set(grpo_cases.CASES) - {"conversational"}))
def test_every_golden_variant_as_config_keys_gives_the_library_cases_grpo_config(case, model_dir, tmp_path):
    """The golden variants' numbers are the library class's (test_grpo_golden.py, 1e-4 of TRL's); `lathe train`
    runs that class with the GRPOConfig its keys build (the conversational case is run whole above). So each
    variant's keys, written in a config, build the case's GRPOConfig: every GRPO key and every training value set."""
    from lathe.llm.config.grpo import RLOO_ONLY, GRPOArguments, grpo_config
    from lathe.llm.rl.config import GRPOConfig

    settings = {**grpo_cases.BASE, **grpo_cases.CASES[case]}
    lora = settings.pop("lora", None)
    names = ", ".join(["my_rewards:a", "my_rewards:b", *grpo_cases.reward_funcs([], model_dir, settings)])
    rollout = {"rollout_func": "my_rewards:rollout"} if grpo_cases.rollout_of(settings) else {}
    keys = {k: v for k, v in settings.items() if k not in ("bf16", "gradient_checkpointing", "use_cpu")}
    if isinstance(keys.get("reward_weights"), list):
        keys["reward_weights"] = ",".join(str(w) for w in keys["reward_weights"])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json"}}))
    (tmp_path / "my_rewards.py").write_text("")
    path = config_file(tmp_path, model_dir, reward_funcs=names, **keys, **rollout, **(LORA_KEYS if lora else {}))
    config = parse_train_config(path)
    ours = grpo_config(config.training, config.finetuning)
    theirs = GRPOConfig(output_dir=str(tmp_path / "out"), **settings)
    trainer_arguments = {"reward_funcs", "rollout_func", "tools", "environment_factory"}
    names = {f.name for f in dataclasses.fields(GRPOArguments)} - trainer_arguments - set(RLOO_ONLY)
    names |= set(settings)
    assert {n: getattr(ours, n) for n in names} == {n: getattr(theirs, n) for n in names}
    assert config.finetuning.rollout_func == rollout.get("rollout_func")  # handed to GRPOTrainer(rollout_func=...)
    if lora:  # the adapter the library case passes as peft_config
        assert (config.finetuning.lora_rank, config.finetuning.lora_alpha) == (lora["r"], lora["lora_alpha"])
        assert config.finetuning.lora_target == lora["target_modules"]


RLOO_GOLDEN = json.loads((HERE / "golden" / "trl_rloo.json").read_text())


def test_stage_rloo_logs_trls_numbers_and_its_keys_build_the_library_cases_rloo_config(model_dir, tmp_path):
    """`stage: rloo` runs RLOOTrainer: case rloo_beta whole (TRL's RLOOTrainer numbers); the other RLOO cases'
    keys build the library case's RLOOConfig (whose numbers tests/llm/test_rloo.py compares with TRL's); RLOO's
    defaults are TRL's RLOOConfig's, and the keys of the other stage are errors naming them."""
    from lathe.llm.config.grpo import GRPO_ONLY, GRPOArguments, grpo_config
    from lathe.llm.rl import RLOOConfig

    rows = [
        {"prompt": [{"role": "user", "content": p}], "target": t}
        for p, t in zip(grpo_cases.PROMPTS, grpo_cases.TARGETS)
    ]
    entry = {"formatting": "sharegpt", "columns": {"messages": "prompt"}, "tags": SHAREGPT_TAGS}
    write_project(tmp_path, rows, entry, (HERE / "grpo_cases.py").read_text())
    rewards = "my_rewards:vowel_share, my_rewards:length_target"
    for case, settings in grpo_cases.RLOO_CASES.items():
        settings = {**grpo_cases.BASE, **settings}
        lora = settings.pop("lora", None)
        settings.pop("conversational", None)
        keys = {k: v for k, v in settings.items() if k not in ("bf16", "gradient_checkpointing", "use_cpu")}
        if "reward_clip_range" in keys:
            keys["reward_clip_range"] = ",".join(str(v) for v in keys["reward_clip_range"])
        config = parse_train_config(
            config_file(tmp_path, model_dir, stage="rloo", reward_funcs=rewards, **keys, **(LORA_KEYS if lora else {}))
        )
        ours = grpo_config(config.training, config.finetuning)
        theirs = RLOOConfig(output_dir=str(tmp_path / "out"), **settings)
        names = {f.name for f in dataclasses.fields(GRPOArguments)} - {"reward_funcs", *GRPO_ONLY} | set(settings)
        assert isinstance(ours, RLOOConfig)
        assert {n: getattr(ours, n) for n in names} == {n: getattr(theirs, n) for n in names}, case
    keys = {k: v for k, v in grpo_cases.RLOO_CASES["rloo_beta"].items() if k != "conversational"}
    logs = run(config_file(tmp_path, model_dir, stage="rloo", reward_funcs=rewards, **keys))
    expected = RLOO_GOLDEN["cases"]["rloo_beta"]["logs"]
    assert len(logs) == len(expected)
    timings = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    for step, (mine, theirs) in enumerate(zip(logs, expected), start=1):
        theirs = {key: value for key, value in theirs.items() if key not in timings}
        assert_close_to_golden({k: mine[k] for k in theirs}, theirs, f"stage rloo, step {step}", rel=1e-4, abs=1e-6)
    base = {
        "model_name_or_path": model_dir,
        "dataset": "rows",
        "output_dir": str(tmp_path / "o"),
        "reward_funcs": "r:f",
    }
    config = parse_train_config({**base, "stage": "rloo", "per_device_train_batch_size": 2})
    assert (config.finetuning.num_generations, config.finetuning.beta) == (2, 0.05)
    with pytest.raises(ValueError, match="loss_type is a key of stage grpo; stage rloo"):
        parse_train_config({**base, "stage": "rloo", "loss_type": "grpo", "per_device_train_batch_size": 2})
    with pytest.raises(ValueError, match="normalize_advantages is a key of stage rloo; stage grpo"):
        parse_train_config({**base, "stage": "grpo", "normalize_advantages": True, "per_device_train_batch_size": 8})


def test_the_plan_of_two_zero3_processes_counts_the_weights_gathered_for_sampling(tmp_path, capsys):
    """Under ZeRO-3 on 2 processes (a dry run planned before the launch) each process holds half the weights,
    and sampling gathers the other half on top (ds3_gather_for_generation, TRL's default) or block by block."""
    import re
    import shutil

    from transformers import LlamaConfig

    from lathe.llm.workflows.stages import run_train

    folder = tmp_path / "big"
    shutil.copytree(grpo_cases.TOKENIZER.parent / "bpe_chatml", folder)
    shape = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=8)
    LlamaConfig(vocab_size=512, num_key_value_heads=8, max_position_embeddings=8192, **shape).save_pretrained(folder)
    rows = [{"prompt": [{"role": "user", "content": "count to five:"}]}] * 8
    entry = {"formatting": "sharegpt", "columns": {"messages": "prompt"}, "tags": SHAREGPT_TAGS}
    write_project(tmp_path, rows, entry, "")
    zero3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}
    keys = {"num_generations": 8, "max_completion_length": 1024, "max_steps": 2, "reward_funcs": "x:y"}
    outputs = {}
    for gather in (True, False):
        path = config_file(tmp_path, str(folder), finetuning_type="full", deepspeed=zero3, **keys)
        config = parse_train_config(path)
        config.finetuning.ds3_gather_for_generation = gather
        config.processes = 2
        run_train(config, True)
        outputs[gather] = capsys.readouterr().out
    weights = float(re.search(r"weights ([\d,.]+) MiB", outputs[True]).group(1).replace(",", ""))
    held = re.search(r"sampling gathers ([\d,.]+) MiB of weights whole .*\(every weight", outputs[True])
    assert held and float(held.group(1).replace(",", "")) == pytest.approx(weights, abs=0.1)  # the other half
    assert "DeepSpeed ZeRO stage 3 over 2 processes" in outputs[True]
    gathered = float(re.search(r"gathered while computing ([\d,.]+) MiB", outputs[False]).group(1).replace(",", ""))
    assert re.search(rf"sampling gathers {gathered:,.1f} MiB of weights whole .*\(block by block\)", outputs[False])
    assert gathered < weights
