"""Stages dpo and kto beyond the golden numbers: the losses LLaMA-Factory gets wrong (hinge and ipo,
checked against a plain PyTorch statement), the direction DPO moves the policy, exact resume (with BCO's
running mean), evaluation without training, the plan, `lathe data preview`, and the config checks."""

import json
import logging
import os

import pytest
import torch

from tests.llm.golden.make_llamafactory_preference import BASE, DATA_DIR, build_model

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("preference_model") / "model"
    build_model(folder, seed=0)
    return str(folder)


def config_for(model_dir, output_dir, **values) -> dict:
    return {
        **BASE,
        "dataset_dir": str(DATA_DIR),
        "model_name_or_path": model_dir,
        "stage": "dpo",
        "dataset": "pairs_alpaca,pairs_sharegpt",
        "output_dir": str(output_dir),
        **values,
    }


def train(config: dict) -> list[dict]:
    from lathe.llm.commands import run_train
    from lathe.llm.config.train import parse_train_config

    logging.disable(logging.WARNING)
    try:
        run_train(parse_train_config(config))
    finally:
        logging.disable(logging.NOTSET)
    with open(os.path.join(config["output_dir"], "trainer_state.json"), encoding="utf-8") as handle:
        return json.load(handle)["log_history"]


# ---- hinge and ipo: the loss the config asks for (LLaMA-Factory 0.9.5 trains sigmoid for both) -------------
def plain_pytorch_losses(model_dir, loss_type: str, beta: float, steps: int, learning_rate: float) -> list[float]:
    """Full fine-tuning of the whole dataset as one batch, written out with torch only: summed (hinge) or
    mean (ipo) answer log-probs, logits = policy margin - reference margin, AdamW, clipping at 1.0."""
    from transformers import AutoModelForCausalLM

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.data.pairwise import PairwiseDataCollator
    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.templates import get_template_and_fix_tokenizer

    config = parse_train_config(config_for(model_dir, "unused"))
    tokenizer = load_tokenizer(config.model)
    template = get_template_and_fix_tokenizer(tokenizer, config.data)
    rows = get_dataset(template, config.model, config.data, config.training, stage="dpo", tokenizer=tokenizer)[
        "train_dataset"
    ]
    batch = PairwiseDataCollator(tokenizer)([rows[i] for i in range(len(rows))])
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=learning_rate, weight_decay=0.0)

    def answer_log_probs(model):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        targets = batch["labels"][:, 1:]
        mask = targets != -100
        per_token = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        summed = (per_token * mask).sum(-1)
        return summed / mask.sum(-1) if loss_type == "ipo" else summed

    losses = []
    half = len(rows)
    for _ in range(steps):
        with torch.no_grad():
            reference_logps = answer_log_probs(reference)
        logps = answer_log_probs(policy)
        margin = (logps[:half] - logps[half:]) - (reference_logps[:half] - reference_logps[half:])
        if loss_type == "hinge":
            loss = torch.clamp(1 - beta * margin, min=0).mean()
        else:
            loss = ((margin - 1 / (2 * beta)) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("loss_type, first_loss", [("hinge", 1.0), ("ipo", 25.0)])
def test_hinge_and_ipo_train_the_loss_asked_for(model_dir, tmp_path, loss_type, first_loss):
    """Policy = reference at the start, so every margin is 0: hinge relu(1 - 0) = 1, ipo (0 - 1/(2 x 0.1))^2
    = 25, where the sigmoid loss LLaMA-Factory trains instead would log log 2 = 0.693."""
    logs = train(
        config_for(
            model_dir,
            tmp_path / "out",
            pref_loss=loss_type,
            finetuning_type="full",
            learning_rate=1.0e-3,
            per_device_train_batch_size=24,
            max_steps=3,
            disable_gradient_checkpointing=True,
        )
    )
    ours = [entry["loss"] for entry in logs if "loss" in entry]
    assert ours[0] == pytest.approx(first_loss, abs=1e-6)
    # The whole dataset is each step's batch: only the order of the rows (their sum) differs.
    assert ours == pytest.approx(plain_pytorch_losses(model_dir, loss_type, 0.1, 3, 1.0e-3), rel=1e-5)


# ---- the direction of learning ------------------------------------------------------------------------------
def answer_log_prob(model, tokenizer, question: str, answer: str) -> float:
    """log p(answer | question) under the chatml template, computed with transformers alone."""
    prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(f"{answer}<|im_end|>\n", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    positions = range(len(prompt_ids) - 1, ids.shape[1] - 1)
    return sum(log_probs[position, ids[0, position + 1]].item() for position in positions)


@pytest.mark.slow
def test_dpo_moves_the_policy_towards_the_chosen_answers(model_dir, tmp_path):
    """A toy preference (chosen "yes", rejected "no" to 16 questions): the reward margin grows step after
    step, the accuracy goes to 1 on held-out pairs, and, measured with transformers and peft alone, the
    trained model prefers the chosen answer by far more than the starting model did. A loss with the
    wrong sign would push every one of these the other way."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"instruction": f"Is {a} plus {b} equal to {a + b}?", "chosen": "yes", "rejected": "no"}
        for a in range(4)
        for b in range(4)
    ]
    (data / "pairs.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(
        json.dumps(
            {
                "toy": {
                    "file_name": "pairs.json",
                    "ranking": True,
                    "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"},
                }
            }
        )
    )
    logs = train(
        config_for(
            model_dir,
            tmp_path / "out",
            dataset_dir=str(data),
            dataset="toy",
            pref_beta=0.5,
            learning_rate=2.0e-2,
            max_steps=12,
            per_device_train_batch_size=4,
            val_size=4,
            do_eval=True,
            eval_strategy="steps",
            eval_steps=6,
        )
    )
    steps = [entry for entry in logs if "loss" in entry]
    evaluations = [entry for entry in logs if "eval_loss" in entry]
    margins = [entry["rewards/margins"] for entry in steps]
    assert margins[0] == 0.0 and steps[0]["loss"] == pytest.approx(0.6931472, abs=1e-6)
    assert all(later > earlier for earlier, later in zip(margins[:6], margins[1:6])) and margins[-1] > 2.0
    assert all(entry["rewards/accuracies"] == 1.0 for entry in steps[1:])
    assert [entry["eval_rewards/accuracies"] for entry in evaluations] == [1.0, 1.0]
    assert evaluations[-1]["eval_rewards/margins"] > evaluations[0]["eval_rewards/margins"] > 1.0
    assert steps[-1]["loss"] < 0.1

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    question = "Is 7 plus 9 equal to 16?"  # not in the data
    before = answer_log_prob(base, tokenizer, question, "yes") - answer_log_prob(base, tokenizer, question, "no")
    trained = PeftModel.from_pretrained(base, str(tmp_path / "out")).eval()
    after = answer_log_prob(trained, tokenizer, question, "yes") - answer_log_prob(trained, tokenizer, question, "no")
    assert after > before + 4.0


# ---- resume ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_dpo_with_bco_resumes_exactly(model_dir, tmp_path):
    """BCO's running mean of the rewards is state across steps: it travels in the checkpoint, so an
    interrupted run resumed from step 2 logs and trains exactly what the uninterrupted one did."""
    from safetensors.torch import load_file

    values = dict(pref_bco_weight=0.5, max_steps=4, save_strategy="steps", save_steps=2)
    whole = train(config_for(model_dir, tmp_path / "whole", **values))
    state = json.loads((tmp_path / "whole" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["BCORunningMean"]["args"]["count"] == pytest.approx(2.0)
    resumed = train(
        config_for(
            model_dir, tmp_path / "resumed", resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"), **values
        )
    )
    steps = lambda logs: [{k: v for k, v in entry.items() if k != "epoch"} for entry in logs if "loss" in entry]
    assert steps(resumed)[-2:] == steps(whole)[-2:]
    a, b = (
        load_file(tmp_path / "whole" / "adapter_model.safetensors"),
        load_file(tmp_path / "resumed" / "adapter_model.safetensors"),
    )
    assert all(torch.equal(a[name], b[name]) for name in a)


# ---- evaluation without training ------------------------------------------------------------------------------
@pytest.mark.slow
def test_evaluating_without_training_compares_the_model_with_itself(model_dir, tmp_path):
    """do_train false, no ref_model: the reference is the model itself, so the rewards (all 0) are left out
    of eval_results.json, as in LLaMA-Factory; the log-probs and the loss (log 2) are reported."""
    train(config_for(model_dir, tmp_path / "trained", max_steps=2))
    config = config_for(
        model_dir,
        tmp_path / "eval",
        do_train=False,
        do_eval=True,
        eval_dataset="pairs_alpaca",
        adapter_name_or_path=str(tmp_path / "trained"),
    )
    from lathe.llm.commands import run_train
    from lathe.llm.config.train import parse_train_config

    metrics = run_train(parse_train_config(config))
    results = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert not [key for key in results if "rewards" in key] and not [key for key in metrics if "rewards" in key]
    assert results["eval_loss"] == pytest.approx(0.6931472, abs=1e-6)
    assert results["eval_logps/chosen"] < 0 and "eval_logits/rejected" in results


# ---- plan, preview, config ----------------------------------------------------------------------------------
def test_dry_run_and_data_preview(model_dir, tmp_path, write_yaml, capsys, monkeypatch):
    from lathe.llm.commands import data_preview_command, train_command

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the tokenization cache
    config = write_yaml(tmp_path / "c.yaml", config_for(model_dir, tmp_path / "out"))
    assert train_command(config, [], dry_run=True) == 0
    plan = capsys.readouterr().out
    assert "Plan: stage dpo, lora fine-tuning" in plan and "train examples  24" in plan
    assert "reference       the model with its LoRA adapter switched off (no second copy)" in plan
    assert (
        "reference       a frozen copy of the starting model"
        in (train_command(config, ["finetuning_type=full"], dry_run=True), capsys.readouterr().out)[1]
    )
    assert data_preview_command(config, [], num_examples=1) == 0
    preview = capsys.readouterr().out
    assert "== train (stage dpo, template chatml)" in preview
    assert "chosen: " in preview and "rejected: " in preview
    assert "[[elppa<|im_end|>\n]]" in preview  # the chosen answer to "Reverse the word apple." is trained


@pytest.mark.parametrize(
    "values, message",
    [
        ({"stage": "ppo"}, "stage 'ppo' .*is not supported yet; lathe trains pt, sft, rm, dpo, kto"),
        ({"pref_loss": "kto_pair"}, "kto_pair is not supported: LLaMA-Factory 0.9.5 accepts it but trains the sigmoid"),
        ({"pref_loss": "orpo", "ref_model": "m"}, "ref_model: 'm' is read by .* not by stage dpo with pref_loss orpo"),
        (
            {"pref_loss": "ipo", "dpo_label_smoothing": 0.1},
            "dpo_label_smoothing: 0.1 is read by dpo with pref_loss sigmoid",
        ),
        ({"stage": "sft", "pref_beta": 0.2}, "pref_beta: 0.2 is read by dpo and kto only, not by stage sft"),
        ({"stage": "kto", "simpo_gamma": 1.0}, "simpo_gamma: 1.0 is read by dpo with pref_loss simpo only"),
        ({"dpo_label_smoothing": 0.5}, r"dpo_label_smoothing must be in \[0, 0.5\)"),
        ({"packing": True}, "packing .*applies to stages pt and sft"),
        ({"do_predict": True, "val_size": 2}, "do_predict .*is not read by stage dpo"),
        (
            {
                "stage": "rm",
                "load_best_model_at_end": True,
                "eval_strategy": "steps",
                "save_strategy": "steps",
                "val_size": 2,
            },
            "load_best_model_at_end .*not supported for stage rm",
        ),
        ({"ref_model_adapters": "a"}, "ref_model_adapters needs ref_model"),
        ({"reward_model": "m"}, "reward_model .*PPO"),
    ],
)
def test_config_errors_name_the_key(values, message):
    from lathe.llm.config.train import parse_train_config

    with pytest.raises(ValueError, match=message):
        parse_train_config(config_for("m", "out", **values))


def test_defaults_of_the_preference_keys_are_llamafactorys():
    from lathe.llm.config.train import parse_train_config

    finetuning = parse_train_config(config_for("m", "out")).finetuning
    assert (
        finetuning.pref_beta,
        finetuning.pref_ftx,
        finetuning.pref_loss,
        finetuning.simpo_gamma,
        finetuning.dpo_label_smoothing,
        finetuning.kto_chosen_weight,
        finetuning.kto_rejected_weight,
    ) == (0.1, 0.0, "sigmoid", 0.5, 0.0, 1.0, 1.0)
    assert finetuning.use_ref_model
    assert not parse_train_config(config_for("m", "out", pref_loss="simpo")).finetuning.use_ref_model
