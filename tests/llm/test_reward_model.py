"""Stage rm: the value head's files (value_head.safetensors beside the model or the adapter, LLaMA-Factory's
keys), loading a trained reward model back for evaluation and prediction (the same scores), full
fine-tuning with tied embeddings (LLaMA-Factory 0.9.5 crashes saving it), exact resume with the head's
dropout, and export with the value head."""

import json
import logging

import pytest
import torch

from tests.llm.golden.make_llamafactory_preference import BASE, DATA_DIR, build_model

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reward_model") / "model"
    build_model(folder, seed=0)
    return str(folder)


def config_for(model_dir, output_dir, **values) -> dict:
    return {
        **BASE,
        "dataset_dir": str(DATA_DIR),
        "model_name_or_path": model_dir,
        "stage": "rm",
        "dataset": "pairs_alpaca,pairs_sharegpt",
        "output_dir": str(output_dir),
        "learning_rate": 1.0e-2,
        **values,
    }


def run(config: dict) -> dict:
    from lathe.llm.commands import run_train
    from lathe.llm.config.train import parse_train_config

    logging.disable(logging.WARNING)
    try:
        return run_train(parse_train_config(config))
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.slow
def test_lora_reward_model_saves_loads_and_predicts_the_same_scores(model_dir, tmp_path):
    from safetensors.torch import load_file

    trained = run(config_for(model_dir, tmp_path / "run", eval_dataset="pairs_sharegpt", do_eval=True))
    files = sorted(path.name for path in (tmp_path / "run").iterdir())
    assert (
        "adapter_model.safetensors" in files and "value_head.safetensors" in files and "model.safetensors" not in files
    )
    head = load_file(tmp_path / "run" / "value_head.safetensors")
    assert sorted(head) == ["v_head.summary.bias", "v_head.summary.weight"] and head["v_head.summary.weight"].shape == (
        1,
        16,
    )
    assert 0 <= trained["eval_accuracy"] <= 1 and "eval_loss" in trained

    # Loaded back from the adapter folder (the head comes from there too): the same evaluation, and scores.
    again = run(
        config_for(
            model_dir,
            tmp_path / "eval",
            do_train=False,
            do_eval=True,
            do_predict=True,
            eval_dataset="pairs_sharegpt",
            adapter_name_or_path=str(tmp_path / "run"),
        )
    )
    assert again["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-6)
    assert again["eval_accuracy"] == trained["eval_accuracy"]
    lines = (tmp_path / "eval" / "generated_predictions.jsonl").read_text().split("\n")
    scores = [json.loads(line) for line in lines]
    assert len(scores) == 12 and all(set(score) == {"chosen", "rejected"} for score in scores)
    assert sum(score["chosen"] > score["rejected"] for score in scores) / 12 == pytest.approx(
        again["predict_accuracy"], abs=1 / 12
    )


@pytest.mark.slow
def test_full_fine_tuning_with_tied_embeddings_saves_and_reloads(tmp_path):
    """LLaMA-Factory 0.9.5 stops with "Some tensors share memory" here; lathe saves the model (tied
    weights once, as transformers saves them) and the head, and they load back to the same scores."""
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.model.loader import load_model, load_tokenizer
    from lathe.llm.model.value_head import add_value_head

    tied = tmp_path / "tied"
    build_model(tied, seed=0, tie_word_embeddings=True)
    run(
        config_for(
            str(tied),
            tmp_path / "run",
            finetuning_type="full",
            max_steps=2,
            eval_dataset="pairs_sharegpt",
            do_eval=True,
        )
    )
    assert (tmp_path / "run" / "model.safetensors").is_file() and (
        tmp_path / "run" / "value_head.safetensors"
    ).is_file()
    config = parse_train_config(config_for(str(tmp_path / "run"), tmp_path / "unused", do_train=False))
    tokenizer = load_tokenizer(config.model)
    model = add_value_head(load_model(tokenizer, config.model, config.finetuning), config.model).eval()
    assert model.pretrained_model.get_input_embeddings().weight is model.pretrained_model.get_output_embeddings().weight
    base = add_value_head(
        load_model(
            tokenizer, parse_train_config(config_for(str(tied), "unused", do_train=False)).model, config.finetuning
        ),
        config.model,
    ).eval()
    ids = torch.tensor([[1, 5, 9, 12, 2]])
    with torch.no_grad():
        assert not torch.equal(model(input_ids=ids), base(input_ids=ids))  # trained weights and head were loaded


@pytest.mark.slow
def test_full_reward_model_resumes_exactly(model_dir, tmp_path):
    """The value head's dropout draws from the RNG: resumed from step 2, the run still gives the
    uninterrupted run's weights and head bit for bit (LLaMA-Factory does not resume rm full runs)."""
    from safetensors.torch import load_file

    values = dict(finetuning_type="full", learning_rate=1.0e-3, max_steps=4, save_strategy="steps", save_steps=2)
    run(config_for(model_dir, tmp_path / "whole", **values))
    checkpoint = tmp_path / "whole" / "checkpoint-2"
    assert (checkpoint / "value_head.safetensors").is_file() and (checkpoint / "model.safetensors").is_file()
    run(config_for(model_dir, tmp_path / "resumed", resume_from_checkpoint=str(checkpoint), **values))
    for name in ("model.safetensors", "value_head.safetensors"):
        whole, resumed = load_file(tmp_path / "whole" / name), load_file(tmp_path / "resumed" / name)
        assert sorted(whole) == sorted(resumed)
        assert all(torch.equal(whole[key], resumed[key]) for key in whole), name
    logs = [
        json.loads((tmp_path / folder / "trainer_state.json").read_text())["log_history"]
        for folder in ("whole", "resumed")
    ]
    assert [entry["loss"] for entry in logs[0] if "loss" in entry] == [
        entry["loss"] for entry in logs[1] if "loss" in entry
    ]


@pytest.mark.slow
def test_export_with_stage_rm_copies_the_value_head(model_dir, tmp_path):
    from lathe.llm.export import export_model
    from lathe.llm.inference.config import parse_infer_config

    run(config_for(model_dir, tmp_path / "run", max_steps=2))
    infer = {
        "model_name_or_path": model_dir,
        "adapter_name_or_path": str(tmp_path / "run"),
        "template": "chatml",
        "finetuning_type": "lora",
        "stage": "rm",
        "export_dir": str(tmp_path / "exported"),
    }
    export_model(parse_infer_config(infer, command="export"))
    assert (tmp_path / "exported" / "value_head.safetensors").read_bytes() == (
        tmp_path / "run" / "value_head.safetensors"
    ).read_bytes()
    with pytest.raises(ValueError, match="stage: rm.*scores answers"):
        parse_infer_config({**infer, "export_dir": None}, command="chat")


def test_last_token_scores_read_the_last_real_token():
    from lathe.llm.preference.reward import last_token_scores

    values = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 0.6, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert last_token_scores(values, mask).tolist() == pytest.approx([0.3, 0.6])


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_reward_model_asks_its_lm_for_the_last_positions_logits_only(method):
    """The scores read hidden states only: the LM computes one position's logits instead of every position's
    (the memory plan counts that), and the scores are the very same floats as with every position's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lathe.llm.memory.plan import Settings, estimate_memory
    from lathe.llm.model.value_head import ValueHeadModel

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=120,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    base = LlamaForCausalLM(config)
    if method == "lora":
        peft = pytest.importorskip("peft")
        base = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model = ValueHeadModel(base, dropout=0.0)
    assert model._keeps_logits_of_last_position_only
    seen = []
    head = base.get_output_embeddings()
    hook = head.register_forward_hook(lambda module, args, output: seen.append(tuple(output.shape)))
    ids = torch.randint(3, 100, (4, 12))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        scores = model(input_ids=ids, attention_mask=mask)
        every_position = model(input_ids=ids, attention_mask=mask, logits_to_keep=0)
    hook.remove()
    vocab = base.config.vocab_size
    assert seen == [(4, 1, vocab), (4, 12, vocab)]
    assert torch.equal(scores, every_position) and scores.shape == (4, 12)
    plan = estimate_memory(model, Settings(batch=2, seq_len=12, stage="rm"))
    assert plan.logits == 4 * 1 * vocab * 4
    assert plan.loss_path == "value head: the LM's logits for the last position only"
