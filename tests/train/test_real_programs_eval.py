"""evaluate() gives transformers' eval_loss bit for bit where real programs (run_clm, run_summarization)
see it differ from the model's own mean: a causal LM's loss divided by every label position (what
transformers' prediction_step counts), a short last batch, Seq2SeqTrainer counting that batch as a
full one, an iterable dataset; and Seq2SeqTrainer leaves the generation_config.json transformers
leaves after evaluating with generate()."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from tests.train.trainer_helpers import tiny_llama

pytestmark = pytest.mark.hf
transformers = pytest.importorskip("transformers")


def blocks(count: int = 10, length: int = 16) -> list[dict]:
    """Equal-length blocks with labels = input_ids (run_clm's group_texts), no -100."""
    return [
        {"input_ids": torch.tensor([(7 * i + 3 * j) % 60 + 1 for j in range(length)])}
        | {"labels": torch.tensor([(7 * i + 3 * j) % 60 + 1 for j in range(length)])}
        for i in range(count)
    ]


def evaluate(library: str, tmp_path, model, dataset, trainer_class="Trainer", **overrides):
    module = importlib.import_module(library)
    args_class = module.Seq2SeqTrainingArguments if trainer_class == "Seq2SeqTrainer" else module.TrainingArguments
    options = dict(
        output_dir=str(tmp_path / library), report_to="none", disable_tqdm=True, per_device_eval_batch_size=4
    )
    options.update(overrides)
    trainer = getattr(module, trainer_class)(model=model, args=args_class(**options), eval_dataset=dataset)
    return trainer.evaluate()["eval_loss"]


def tiny_gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    )


@pytest.mark.parametrize(
    "make_model, counted",
    # GPT-2 sets no loss_type, so transformers counts every label position (16 a block, 15 predicted): its
    # eval_loss is the model's own mean x 15/16, what run_clm users read. Llama's loss_type shifts the count.
    [(tiny_gpt2, 16), (tiny_llama, 15)],
    ids=["gpt2", "llama"],
)
def test_causal_lm_eval_loss_is_transformers(tmp_path, make_model, counted):
    model, data = make_model(), blocks()
    ours = evaluate("lathe", tmp_path, model, data)
    theirs = evaluate("transformers", tmp_path, model, data)
    assert ours == theirs  # bit for bit
    with torch.no_grad():
        model.eval()
        ids = torch.stack([item["input_ids"] for item in data])
        own_mean = model(input_ids=ids, labels=ids).loss.item()
    assert ours == pytest.approx(own_mean * 15 / counted, rel=1e-5)


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


@pytest.mark.parametrize("count", [10, 12], ids=["short last batch", "full batches"])
@pytest.mark.parametrize("iterable", [False, True], ids=["map-style", "iterable"])
def test_eval_loss_weighs_the_batches_as_transformers(tmp_path, count, iterable):
    items = [
        dict(item, labels=item["labels"].masked_fill(torch.arange(16) >= 4 + i % 9, -100))
        for i, item in enumerate(blocks(count))
    ]
    data = Stream(items) if iterable else items
    model = tiny_llama()
    assert evaluate("lathe", tmp_path, model, data) == evaluate("transformers", tmp_path, model, data)


def tiny_bart():
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=48,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    return transformers.BartForConditionalGeneration(config)


def pairs(count: int = 10) -> list[dict]:
    """Label lengths that differ from batch to batch (padded with -100)."""
    items = []
    for i in range(count):
        size = 3 + (i * 5) % 9
        labels = [(i + 2 * j) % 40 + 4 for j in range(size)] + [-100] * (12 - size)
        source = [0] + [(3 * i + j) % 40 + 4 for j in range(8)] + [2]
        items.append({"input_ids": torch.tensor(source), "labels": torch.tensor(labels)})
    return items


@pytest.mark.parametrize("generate", [False, True], ids=["loss", "predict_with_generate"])
def test_seq2seq_eval_loss_counts_a_short_last_batch_as_transformers(tmp_path, generate):
    model, data = tiny_bart(), pairs()  # 10 pairs in batches of 4: the last holds 2
    options = dict(trainer_class="Seq2SeqTrainer", predict_with_generate=generate, generation_max_length=6)
    ours = evaluate("lathe", tmp_path, model, data, **options)
    theirs = evaluate("transformers", tmp_path, model, data, **options)
    assert ours == theirs
    # transformers' Seq2SeqTrainer counts the short batch as a full one: the plain mean of batch means.
    model.eval()
    with torch.no_grad():
        means = [
            model(**{k: torch.stack([item[k] for item in data[b : b + 4]]) for k in data[0]}).loss.item()
            for b in range(0, 10, 4)
        ]
    assert ours == pytest.approx(sum(means) / 3, rel=1e-5)


@pytest.mark.parametrize("saved_config", [False, True], ids=["from the model config", "its own config"])
def test_generation_config_after_a_generate_evaluation_is_transformers(tmp_path, saved_config):
    """transformers' Seq2SeqTrainer fills the model's generation_config with the default generation
    parameters when it evaluates with generate(), so checkpoints and the final folder carry them all."""
    files = {}
    for library in ("transformers", "lathe"):
        module = importlib.import_module(library)
        model = tiny_bart()
        if saved_config:
            model.generation_config = transformers.GenerationConfig(
                bos_token_id=0, eos_token_id=2, pad_token_id=1, decoder_start_token_id=2, max_length=20, num_beams=2
            )
        output = tmp_path / library
        args = module.Seq2SeqTrainingArguments(
            output_dir=str(output),
            report_to="none",
            disable_tqdm=True,
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
            predict_with_generate=True,
            generation_max_length=6,
            eval_strategy="steps",
            eval_steps=1,
            max_steps=2,
            save_steps=1,
        )
        trainer = module.Seq2SeqTrainer(
            model=model,
            args=args,
            train_dataset=pairs(8),
            eval_dataset=pairs(6),
            compute_metrics=lambda prediction: {"width": prediction.predictions.shape[-1]},
        )
        trainer.train()
        trainer.save_model()
        files[library] = [
            json.loads((output / folder / "generation_config.json").read_text())
            for folder in ("checkpoint-1", "checkpoint-2", ".")
        ]
        files[library + " widths"] = [
            entry["eval_width"] for entry in trainer.state.log_history if "eval_width" in entry
        ]
    assert files["lathe"] == files["transformers"]
    assert not files["lathe"][0].get("_from_model_config") and "top_k" in files["lathe"][0]
    assert files["lathe widths"] == files["transformers widths"]  # generations padded to the same length
