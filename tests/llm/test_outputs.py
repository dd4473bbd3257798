"""Run outputs: trainer_log.jsonl lines, loss plots, stop tokens in generation_config, predictions."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from lathe.llm.workflows.outputs import (
    ExactMatch,
    TrainerLogCallback,
    plot_loss,
    read_trainer_log,
    save_predictions,
    smooth,
)
from lathe.train.state import TrainerControl, TrainerState


def _args(output_dir, **extra):
    return SimpleNamespace(output_dir=str(output_dir), should_save=True, overwrite_output_dir=False, **extra)


def test_trainer_log_lines_have_llamafactory_keys(tmp_path):
    args, state, control = _args(tmp_path), TrainerState(max_steps=4), TrainerControl()
    callback = TrainerLogCallback()
    callback.on_train_begin(args, state, control)
    for step in (2, 4):
        state.global_step, state.epoch = step, step / 4
        state.log_history.append({"loss": 1.0 / step, "learning_rate": 1e-3, "epoch": state.epoch, "step": step})
        callback.on_log(args, state, control, logs=state.log_history[-1])
    state.log_history.append({"eval_loss": 0.3, "epoch": 1.0, "step": 4})
    callback.on_log(args, state, control, logs=state.log_history[-1])

    lines = read_trainer_log(str(tmp_path / "trainer_log.jsonl"))
    assert len(lines) == 3
    assert lines[0]["current_steps"] == 2 and lines[0]["total_steps"] == 4 and lines[0]["percentage"] == 50.0
    assert lines[0]["loss"] == 0.5 and lines[0]["lr"] == 1e-3 and lines[0]["epoch"] == 0.5
    assert {"elapsed_time", "remaining_time"} <= set(lines[0])
    assert lines[0]["elapsed_time"].count(":") == 2  # H:MM:SS
    assert lines[2]["eval_loss"] == 0.3 and "loss" not in lines[2]


def test_resume_drops_log_lines_after_the_checkpoint(tmp_path):
    path = tmp_path / "trainer_log.jsonl"
    path.write_text("".join(json.dumps({"current_steps": s, "loss": 1.0}) + "\n" for s in (1, 2, 3, 4)))
    state = TrainerState(max_steps=6)
    state.global_step = 2  # restored from checkpoint-2
    TrainerLogCallback().on_train_begin(_args(tmp_path), state, TrainerControl())
    assert [line["current_steps"] for line in read_trainer_log(str(path))] == [1, 2]


def test_smooth_is_an_ema_that_keeps_the_first_value():
    values = [4.0, 3.0, 2.0, 1.0]
    smoothed = smooth(values)
    assert smoothed[0] == 4.0 and len(smoothed) == 4
    assert all(a >= b for a, b in zip(smoothed, smoothed[1:]))
    assert smoothed[-1] > 1.0  # lags behind the raw curve
    assert smooth([]) == []


def test_plot_loss_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    history = [{"loss": 2.0 / (i + 1), "step": i + 1} for i in range(20)] + [
        {"eval_loss": 0.5, "step": 10},
        {"eval_loss": 0.4, "step": 20},
    ]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    written = plot_loss(str(tmp_path))
    assert [p.split("/")[-1] for p in written] == ["training_loss.png", "training_eval_loss.png"]
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_loss_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot_loss(str(tmp_path))


def test_stop_tokens_go_into_the_saved_generation_config(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lathe.llm.workflows.outputs import save_generation_config, set_stop_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    template = SimpleNamespace(
        get_stop_token_ids=lambda tok: [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    )
    ids = set_stop_tokens(model, tokenizer, template)
    save_generation_config(model, str(tmp_path))
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["eos_token_id"] == ids == [2, 4]
    assert saved["pad_token_id"] == 2


def test_predictions_file_and_exact_match(tiny_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tokenizer.pad_token = tokenizer.eos_token
    pad = tokenizer.pad_token_id
    prompt = tokenizer.encode("What is two plus two?")
    right, wrong = tokenizer.encode(" four"), tokenizer.encode(" five")
    width = max(len(right), len(wrong)) + 2

    def padded(ids, value):
        return ids + [value] * (width - len(ids))

    predictions = np.array([padded(right, pad), padded(wrong, pad)])
    labels = np.array([padded(right, -100), padded(right, -100)])
    metrics = ExactMatch(tokenizer)(SimpleNamespace(predictions=predictions, label_ids=labels))
    assert metrics == {"exact_match": 50.0}

    results = SimpleNamespace(predictions=predictions, label_ids=labels)
    path = save_predictions(str(tmp_path), {"input_ids": [prompt, prompt]}, results, tokenizer)
    lines = [json.loads(line) for line in open(path, encoding="utf-8")]
    # As LLaMA-Factory writes them: the prompt with its special tokens, answers unstripped.
    assert lines[0] == {"prompt": "What is two plus two?", "predict": " four", "label": " four"}
    assert lines[1]["predict"] == " five"


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_sft_trainer_generates_after_the_prompt_only(tiny_model_dir, tmp_path):
    """predict_with_generate on prompt-only rows: the prompt is blanked from the generated ids and
    the labels (the reference answer, a different length) are returned untouched."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lathe.llm.workflows.sft import SFTTrainer
    from lathe.train import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rows = [
        {"input_ids": tokenizer.encode("What is two plus two?"), "labels": tokenizer.encode(" four")},
        {"input_ids": tokenizer.encode("Reverse abc:"), "labels": tokenizer.encode(" cba.")},
    ]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        predict_with_generate=True,
        per_device_eval_batch_size=2,
        report_to="none",
        remove_unused_columns=False,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer),
        compute_metrics=ExactMatch(tokenizer),
    )
    # An EOS id outside the vocabulary: the random model cannot stop early, so each row gets 3 new tokens.
    results = trainer.predict(
        rows, max_new_tokens=3, do_sample=False, eos_token_id=[999], pad_token_id=tokenizer.pad_token_id
    )

    prompt_width = max(len(row["input_ids"]) for row in rows)
    predictions = torch.as_tensor(results.predictions)
    assert (predictions[:, :prompt_width] == tokenizer.pad_token_id).all()
    assert (predictions[:, prompt_width:] != tokenizer.pad_token_id).any()  # three new tokens each
    labels = np.asarray(results.label_ids)
    assert [tokenizer.decode([t for t in row if t >= 0]) for row in labels] == [" four", " cba."]
    assert "test_exact_match" in results.metrics

    path = save_predictions(str(tmp_path), {"input_ids": [row["input_ids"] for row in rows]}, results, tokenizer)
    lines = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert [line["label"] for line in lines] == [" four", " cba."]
    assert lines[1]["prompt"] == "Reverse abc:"
