"""Seq2SeqTrainer: generation during evaluate/predict, padded to one length, equal to transformers'."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from lathe import Seq2SeqTrainer, Seq2SeqTrainingArguments  # noqa: E402


def tiny_t5():
    config = transformers.T5Config(
        vocab_size=40,
        d_model=16,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        d_kv=8,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config)


DATA = [{"input_ids": [5, 6, 7, 1], "attention_mask": [1, 1, 1, 1], "labels": [7, 6, 5, 1]} for _ in range(6)]


def run(trainer_cls, args_cls, tmp_path, **gen):
    args = args_cls(
        output_dir=str(tmp_path),
        predict_with_generate=True,
        generation_max_length=6,
        per_device_eval_batch_size=4,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = trainer_cls(model=tiny_t5(), args=args, eval_dataset=DATA)
    return trainer.predict(DATA[:5], **gen)


def test_predict_with_generate_pads_generations_to_max_length(tmp_path):
    output = run(Seq2SeqTrainer, Seq2SeqTrainingArguments, tmp_path)
    # Generations stop at generation_max_length (6) and, as in transformers, are padded to the model's
    # generation_config.max_length (20 by default), across a batch of 4 and of 1; labels too.
    assert output.predictions.shape == (5, 20)
    assert np.all(output.predictions[:, 6:] == 0)  # padded with the pad token id
    assert output.label_ids.shape == (5, 20)
    assert np.all(output.label_ids[:, 4:] == 0)
    assert "test_loss" in output.metrics


def test_max_new_tokens_per_call(tmp_path):
    output = run(Seq2SeqTrainer, Seq2SeqTrainingArguments, tmp_path, max_new_tokens=2)
    assert np.all(output.predictions[:, 3:] == 0)  # decoder start + 2 new tokens, then padding
    assert output.predictions.shape == (5, 20)  # to generation_config.max_length, as transformers


@pytest.mark.hf
def test_generations_equal_transformers(tmp_path):
    ours = run(Seq2SeqTrainer, Seq2SeqTrainingArguments, tmp_path / "lathe")
    theirs = run(transformers.Seq2SeqTrainer, transformers.Seq2SeqTrainingArguments, tmp_path / "hf")
    # Both pad to the model's generation_config.max_length (20) even when 6 was asked for.
    np.testing.assert_array_equal(ours.predictions, theirs.predictions)
    np.testing.assert_array_equal(ours.label_ids, theirs.label_ids)
    assert ours.metrics["test_loss"] == pytest.approx(theirs.metrics["test_loss"], rel=1e-6)


@pytest.mark.parametrize("library", ["lathe", "transformers"])
def test_prediction_step_drops_none_num_beams_and_max_length_as_transformers(tmp_path, library):
    """QuestionAnsweringSeq2SeqTrainer (transformers' run_seq2seq_qa.py) calls prediction_step with
    num_beams=None / max_length=None when the script's arguments are unset: generate must not see them."""
    import importlib

    module = importlib.import_module(library)
    args = module.Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), predict_with_generate=True, report_to="none", disable_tqdm=True
    )
    model = tiny_t5()
    seen = []
    generate = model.generate

    def recording_generate(**kwargs):
        seen.append(sorted(kwargs))
        return generate(**kwargs)

    model.generate = recording_generate
    trainer = module.Seq2SeqTrainer(model=model, args=args)
    inputs = {key: torch.tensor([value]) for key, value in DATA[0].items()}
    trainer.prediction_step(model, inputs, prediction_loss_only=False, num_beams=None, max_length=None, top_k=3)
    assert len(seen) == 1 and "top_k" in seen[0]
    assert "num_beams" not in seen[0] and "max_length" not in seen[0]  # None is left to the generation config
