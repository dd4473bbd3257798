"""Each benchmark job through a Trainer: transformers.Trainer (--impl hf) or lathe.Trainer (--impl lathe).

Both implementations run this very code; only the import line differs, which is the drop-in claim.

    python bench/run_trainer.py --impl hf --job lm [--quick] [--out result.json]
    python bench/run_trainer.py --impl lathe --job lm --mode evalmem --eval-scale 10
"""

import time

_T0 = time.perf_counter()
import argparse  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--impl", choices=["hf", "lathe"], required=True)
parser.add_argument("--job", choices=["regression", "lm"], required=True)
parser.add_argument("--quick", action="store_true")
parser.add_argument("--mode", choices=["train", "evalmem"], default="train")
parser.add_argument("--eval-scale", type=int, default=1, help="evalmem: evaluate on this many times the eval texts")
parser.add_argument(
    "--eval-metrics",
    choices=["loss", "accuracy"],
    default="loss",
    help="evalmem: loss only, or token accuracy via preprocess_logits_for_metrics=argmax",
)
parser.add_argument("--output-dir", default=None)
parser.add_argument("--out", help="write the result JSON here (default: stdout)")
ARGS = parser.parse_args()

_T_IMPORT = time.perf_counter()
# The only line that differs between the two runners.
if ARGS.impl == "hf":
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments
else:
    from lathe import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments
TRAINER_IMPORT_S = time.perf_counter() - _T_IMPORT

import jobs  # noqa: E402
import measure  # noqa: E402
import torch  # noqa: E402

IMPORT_S = time.perf_counter() - _T0


class FirstStepTimer(TrainerCallback):
    """Wall-clock time of the first on_step_end, i.e. just after the first optimizer step."""

    def __init__(self):
        self.first_step_time = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.first_step_time is None:
            self.first_step_time = time.time()


def training_arguments(job, output_dir: str, evaluate: bool) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=job.batch_size,
        per_device_eval_batch_size=job.eval_batch_size,
        gradient_accumulation_steps=job.gradient_accumulation_steps,
        num_train_epochs=job.epochs,
        learning_rate=job.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=job.warmup_steps,
        weight_decay=0.0,
        max_grad_norm=job.max_grad_norm,
        optim="adamw_torch",
        logging_strategy="steps",
        logging_steps=job.logging_steps,
        eval_strategy="steps" if evaluate and job.eval_steps else "no",
        eval_steps=job.eval_steps or None,
        save_strategy="steps" if job.save_steps else "no",
        save_steps=job.save_steps or 500,
        seed=job.seed,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def token_accuracy(prediction) -> dict:
    """Next-token accuracy from argmax ids (predictions[:, i] predicts labels[:, i + 1])."""
    predictions, labels = prediction.predictions[:, :-1], prediction.label_ids[:, 1:]
    mask = labels != jobs.IGNORE_INDEX
    return {"accuracy": float((predictions[mask] == labels[mask]).mean())}


def argmax_logits(logits, labels):
    return logits.argmax(dim=-1)


def build(job, output_dir: str, eval_scale: int = 1, evaluate: bool = True):
    """(model, trainer, data) for the job; the model's weights come from jobs.build_*_model."""
    timer = FirstStepTimer()
    if job.name == "regression":
        data = jobs.regression_columns(job)
        model = jobs.build_regression_model(job)
        train_dataset, eval_dataset, collator = jobs.DictDataset(data), None, None
    else:
        data = jobs.load_lm_data(job, eval_scale=eval_scale)
        model = jobs.build_lm_model(job, data["vocab_size"])
        collator = DataCollatorForLanguageModeling(tokenizer=jobs.lm_tokenizer(data), mlm=False)
        train_dataset = jobs.DictDataset({"input_ids": data["train"]})
        eval_dataset = jobs.DictDataset({"input_ids": data["eval"]})
    extra = {}
    if ARGS.mode == "evalmem" and ARGS.eval_metrics == "accuracy":
        extra = {"compute_metrics": token_accuracy, "preprocess_logits_for_metrics": argmax_logits}
    trainer = Trainer(
        model=model,
        args=training_arguments(job, output_dir, evaluate),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        callbacks=[timer],
        **extra,
    )
    return model, trainer, data, timer


def run_training(job, result: dict, output_dir: str) -> None:
    setup_start = time.perf_counter()
    model, trainer, data, timer = build(job, output_dir)
    result["setup_s"] = time.perf_counter() - setup_start

    train_start, train_cpu_start = time.perf_counter(), time.process_time()
    with measure.profile_if_requested():
        output = trainer.train()
    result["train_s"] = time.perf_counter() - train_start
    result["train_cpu_s"] = time.process_time() - train_cpu_start
    shutil.rmtree(output_dir, ignore_errors=True)

    result["first_step_s"] = timer.first_step_time - measure.spawn_time() if timer.first_step_time else None
    result["global_step"] = trainer.state.global_step
    result["train_loss"] = output.training_loss
    result["log_history"] = [
        {k: v for k, v in entry.items() if k in ("loss", "eval_loss", "step", "learning_rate")}
        for entry in trainer.state.log_history
        if "loss" in entry or "eval_loss" in entry
    ]
    if job.name == "regression":
        result["final_loss"] = jobs.regression_probe_loss(model, data)
    else:
        result["final_loss"] = jobs.lm_eval_loss(model, data["eval"], job.eval_batch_size)
        result["train_tokens"] = jobs.lm_train_tokens(job, data)
    result["param_checksum"] = jobs.param_checksum(model)


def run_evaluation_memory(job, result: dict, output_dir: str) -> None:
    """Peak RSS of trainer.evaluate() alone, after building everything and resetting the high-water mark."""
    model, trainer, data, _ = build(job, output_dir, eval_scale=ARGS.eval_scale)
    gc.collect()
    result["rss_before_eval_mb"] = measure.current_rss_mb()
    result["peak_reset"] = measure.reset_peak_rss()
    start = time.perf_counter()
    metrics = trainer.evaluate()
    result["eval_s"] = time.perf_counter() - start
    result["eval_peak_rss_mb"] = measure.high_water_rss_mb()
    result["eval_samples"] = len(data["eval"])
    result["eval_metrics"] = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    shutil.rmtree(output_dir, ignore_errors=True)


def main():
    dynamo_import_s = jobs.prepare_process(threads=1)
    job = jobs.get_job(ARGS.job, ARGS.quick)
    output_dir = ARGS.output_dir or f"bench/results/tmp/{ARGS.impl}"
    result = {
        "runner": ARGS.impl,
        "job": job.name,
        "quick": ARGS.quick,
        "mode": ARGS.mode,
        "import_s": IMPORT_S,
        "trainer_import_s": TRAINER_IMPORT_S,
        "threads": torch.get_num_threads(),
        "dynamo_import_s": dynamo_import_s,
        "trainer_module": Trainer.__module__,
    }
    if ARGS.mode == "evalmem":
        result.update(eval_scale=ARGS.eval_scale, eval_metrics=ARGS.eval_metrics)
        run_evaluation_memory(job, result, output_dir)
    else:
        run_training(job, result, output_dir)
    measure.write_result(ARGS.out, result)


if __name__ == "__main__":
    main()
