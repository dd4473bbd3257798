"""What a `lathe train` run leaves in output_dir besides the weights: trainer_log.jsonl (LLaMA-Factory's
LogCallback format), loss plots, generation_config.json with the template's stop tokens, and
generated_predictions.jsonl with exact-match scores."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from datetime import timedelta

from lathe.train.callbacks.events import TrainerCallback
from lathe.train.data.labels import IGNORE_INDEX

__all__ = [
    "TRAINER_LOG",
    "TrainerLogCallback",
    "read_trainer_log",
    "smooth",
    "plot_loss",
    "set_stop_tokens",
    "save_generation_config",
    "ExactMatch",
    "save_predictions",
]

logger = logging.getLogger(__name__)

TRAINER_LOG = "trainer_log.jsonl"
PREDICTIONS_FILE = "generated_predictions.jsonl"


class TrainerLogCallback(TrainerCallback):
    """One JSON line per log event in output_dir/trainer_log.jsonl, with LLaMA-Factory's keys:
    current_steps, total_steps, loss, eval_loss, predict_loss, accuracy (dpo's rewards/accuracies), lr,
    epoch, percentage, elapsed_time, remaining_time (absent keys are left out, as LLaMA-Factory does).

    Remaining time is extrapolated from the steps taken in *this* process, so a resumed run does not
    count the restored steps as free. On resume, lines past the checkpoint's step are dropped: they
    belong to the interrupted run and are about to be redone.
    """

    def __init__(self):
        self.start_time = None
        self.start_step = 0

    def _path(self, args) -> str:
        return os.path.join(args.output_dir, TRAINER_LOG)

    def on_init_end(self, args, state, control, **kwargs):
        if args.should_save and getattr(args, "overwrite_output_dir", False) and os.path.isfile(self._path(args)):
            os.remove(self._path(args))

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_time = time.time()
        self.start_step = state.global_step
        if not args.should_save:
            return
        os.makedirs(args.output_dir, exist_ok=True)
        path = self._path(args)
        if os.path.isfile(path):
            kept = [line for line in read_trainer_log(path) if line.get("current_steps", 0) <= state.global_step]
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(line) + "\n" for line in kept)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not args.should_save or not state.log_history:
            return
        if self.start_time is None:  # evaluate()/predict() without train()
            self.start_time, self.start_step = time.time(), state.global_step
        last = state.log_history[-1]
        elapsed = time.time() - self.start_time
        steps_done_here = state.global_step - self.start_step
        per_step = elapsed / steps_done_here if steps_done_here > 0 else 0.0
        remaining = max(state.max_steps - state.global_step, 0) * per_step
        line = {
            "current_steps": state.global_step,
            "total_steps": state.max_steps,
            "loss": last.get("loss"),
            "eval_loss": last.get("eval_loss"),
            "predict_loss": last.get("predict_loss"),
            "accuracy": last.get("rewards/accuracies"),
            "lr": last.get("learning_rate"),
            "epoch": last.get("epoch"),
            "percentage": round(state.global_step / state.max_steps * 100, 2) if state.max_steps else 100,
            "elapsed_time": str(timedelta(seconds=int(elapsed))),
            "remaining_time": str(timedelta(seconds=int(remaining))),
        }
        if state.num_input_tokens_seen:
            line["throughput"] = round(state.num_input_tokens_seen / max(elapsed, 1e-9), 2)
            line["total_tokens"] = state.num_input_tokens_seen
        os.makedirs(args.output_dir, exist_ok=True)  # evaluation without training writes nothing before this
        with open(self._path(args), "a", encoding="utf-8") as f:
            f.write(json.dumps({k: v for k, v in line.items() if v is not None}) + "\n")


def read_trainer_log(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ----------------------------------------------------------------------------------------------
# plots


def smooth(values: list[float]) -> list[float]:
    """TensorBoard-style exponential moving average; the weight grows with the number of points
    (a sigmoid of it), so short curves are barely smoothed and long ones strongly (as LLaMA-Factory)."""
    if not values:
        return []
    weight = 1.8 * (1 / (1 + math.exp(-0.05 * len(values))) - 0.5)
    smoothed, last = [], values[0]
    for value in values:
        last = last * weight + (1 - weight) * value
        smoothed.append(last)
    return smoothed


def plot_loss(output_dir: str, keys: tuple[str, ...] = ("loss", "eval_loss")) -> list[str]:
    """training_<key>.png for each key found in output_dir/trainer_state.json's log history: the
    raw curve (faint) and the smoothed one. Returns the paths written."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plot_loss: true needs matplotlib: pip install matplotlib (or lathe[plot]), or set plot_loss: false."
        ) from None
    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    with open(os.path.join(output_dir, "trainer_state.json"), encoding="utf-8") as f:
        history = json.load(f)["log_history"]
    written = []
    for key in keys:
        points = [(entry["step"], entry[key]) for entry in history if key in entry]
        if not points:
            if key == "loss":
                logger.warning("plot_loss: no %r entries in the log history to plot.", key)
            continue
        steps, values = zip(*points)
        figure, axes = plt.subplots(figsize=(6.4, 4.0))
        marker = "o" if len(points) == 1 else None  # a line through one point draws nothing
        axes.plot(steps, values, color="#1f77b4", alpha=0.35, label="original", marker=marker)
        axes.plot(steps, smooth(list(values)), color="#1f77b4", label="smoothed", marker=marker)
        axes.set_title(f"training {key} of {os.path.basename(os.path.abspath(output_dir))}")
        axes.set_xlabel("step")
        axes.set_ylabel(key)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        path = os.path.join(output_dir, f"training_{key.replace('/', '_')}.png")
        figure.savefig(path, format="png", dpi=100)
        plt.close(figure)
        written.append(path)
        print(f"Figure saved at: {path}")
    return written


# ----------------------------------------------------------------------------------------------
# generation settings that travel with the model


def set_stop_tokens(model, tokenizer, template) -> list[int]:
    """Put the template's stop tokens (EOS first) into the model's generation config, so the saved
    model stops where it was trained to stop wherever it is served; returns the ids."""
    stop_ids = template.get_stop_token_ids(tokenizer)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for target in {id(base): base, id(model): model}.values():
        config = getattr(target, "generation_config", None)
        if config is not None:
            config.eos_token_id = stop_ids[0] if len(stop_ids) == 1 else stop_ids
            config.pad_token_id = tokenizer.pad_token_id
    return stop_ids


def save_generation_config(model, output_dir: str) -> None:
    """generation_config.json next to the weights or the adapter (save_pretrained of a peft model
    writes only the adapter)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "generation_config", None)
    if config is not None:
        config.save_pretrained(output_dir)


# ----------------------------------------------------------------------------------------------
# predictions


def _decode_rows(tokenizer, rows, skip_special_tokens: bool) -> list[str]:
    import numpy as np

    texts = []
    for row in rows:
        row = np.asarray(row)
        row = (
            row[(row != IGNORE_INDEX) & (row != tokenizer.pad_token_id)]
            if tokenizer.pad_token_id is not None
            else row[row != IGNORE_INDEX]
        )
        texts.append(tokenizer.decode(row.tolist(), skip_special_tokens=skip_special_tokens).strip())
    return texts


class ExactMatch:
    """The share of predictions equal to the reference after stripping whitespace (lathe's addition to
    LLaMA-Factory's BLEU-4 / ROUGE, which lathe.llm.workflows.metrics computes)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens

    def __call__(self, eval_prediction) -> dict[str, float]:
        predictions = _decode_rows(self.tokenizer, eval_prediction.predictions, self.skip_special_tokens)
        labels = _decode_rows(self.tokenizer, eval_prediction.label_ids, self.skip_special_tokens)
        matches = [prediction == label for prediction, label in zip(predictions, labels)]
        return {"exact_match": round(100.0 * sum(matches) / max(len(matches), 1), 4)}


def _padding_last(rows, pad_token_id):
    """-100 read as padding, and each row's leading padding (the blanked prompt) moved to its end."""
    import numpy as np

    rows = np.where(np.asarray(rows) != IGNORE_INDEX, rows, pad_token_id)
    for index in range(len(rows)):
        kept = np.nonzero(rows[index] != pad_token_id)[0]
        if len(kept):
            rows[index] = np.concatenate((rows[index][kept[0] :], rows[index][: kept[0]]), axis=-1)
    return rows


def save_predictions(output_dir: str, dataset, predict_results, tokenizer, skip_special_tokens: bool = True) -> str:
    """generated_predictions.jsonl: one {"prompt", "predict", "label"} line per example, in order, decoded as
    LLaMA-Factory writes them: the prompt with its special tokens, answers with skip_special_tokens, unstripped."""
    import numpy as np

    pad = tokenizer.pad_token_id
    prompts = tokenizer.batch_decode([list(row) for row in dataset["input_ids"]], skip_special_tokens=False)
    predictions = tokenizer.batch_decode(
        _padding_last(predict_results.predictions, pad), skip_special_tokens=skip_special_tokens
    )
    labels = tokenizer.batch_decode(
        np.where(np.asarray(predict_results.label_ids) != IGNORE_INDEX, predict_results.label_ids, pad),
        skip_special_tokens=skip_special_tokens,
    )
    path = os.path.join(output_dir, PREDICTIONS_FILE)
    os.makedirs(output_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for prompt, predict, label in zip(prompts, predictions, labels):
            f.write(json.dumps({"prompt": prompt, "predict": predict, "label": label}, ensure_ascii=False) + "\n")
    logger.info("Saved predictions to %s", path)
    return path
