"""The floor: each benchmark job as a hand-written PyTorch loop doing the same maths as Trainer.

Same weights, same sample order, same AdamW (torch.optim.AdamW, foreach default, weight decay 0),
same linear schedule, same clipping, same loss normalisation over gradient accumulation (the lm
loss is summed over tokens and divided by the label tokens of the whole accumulated step, as
transformers does when the model takes `num_items_in_batch`), the same evaluations and checkpoints.
What it does not do is the bookkeeping a Trainer does: regression batches are gathered from the
data tensors with one index operation instead of per-sample fetching and collation.

    python bench/run_plain.py --job regression [--quick] [--out result.json]
"""

import time

_T0 = time.perf_counter()
import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import jobs  # noqa: E402
import measure  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

IMPORT_S = time.perf_counter() - _T0


def linear_schedule(warmup_steps: int, total_steps: int):
    """transformers' get_linear_schedule_with_warmup multiplier, written out."""

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return float(step) / float(max(1, warmup_steps))
        return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))

    return multiplier


def micro_batches(job, epoch, data):
    """The epoch's micro-batches in Trainer's sample order."""
    order = jobs.epoch_order(job, epoch)
    for start in range(0, len(order), job.batch_size):
        index = order[start : start + job.batch_size]
        if job.name == "regression":
            rows = torch.tensor(index)
            yield {key: column[rows] for key, column in data.items()}
        else:
            yield jobs.pad_batch([data["train"][i] for i in index])


def step_groups(batches, size):
    """Group micro-batches into optimizer steps of `size` (the last group may be shorter)."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def save_checkpoint(folder: Path, model, optimizer, scheduler, log_history):
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    torch.save({"cpu": torch.get_rng_state()}, folder / "rng_state.pth")
    if hasattr(model, "config"):
        model.config.to_json_file(folder / "config.json")
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": log_history}))


def train(job, model, data, output_dir: Path) -> dict:
    """One plain nested loop: epochs -> optimizer steps -> micro-batches."""
    is_lm = job.name == "lm"
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(job.warmup_steps, job.max_steps))
    log_history, first_step_time = [], None
    running_loss = torch.zeros(())  # summed on-device; read (a sync) only when logging
    total_loss, last_logged_step, global_step = 0.0, 0, 0
    model.train()
    for epoch in range(job.epochs):
        for group in step_groups(micro_batches(job, epoch, data), job.gradient_accumulation_steps):
            if is_lm:
                # Causal LM loss shifts labels: count label tokens of positions 1.. of the whole step.
                num_items = sum(int((b["labels"][:, 1:] != jobs.IGNORE_INDEX).sum()) for b in group)
            for batch in group:
                if is_lm:
                    loss = model(**batch, num_items_in_batch=torch.tensor(num_items)).loss
                else:
                    loss = model(**batch)["loss"] / len(group)
                loss.backward()
                running_loss += loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), job.max_grad_norm)
            learning_rate = scheduler.get_last_lr()[0]  # the rate this step used; Trainer logs that one
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            global_step += 1
            if first_step_time is None:
                first_step_time = time.time()

            if global_step % job.logging_steps == 0:
                interval_loss = running_loss.item()
                total_loss += interval_loss
                running_loss.zero_()
                log_history.append(
                    {
                        "loss": interval_loss / (global_step - last_logged_step),
                        "step": global_step,
                        "learning_rate": learning_rate,
                    }
                )
                last_logged_step = global_step
            is_last = global_step == job.max_steps
            if job.eval_steps and (global_step % job.eval_steps == 0 or is_last):
                eval_loss = jobs.lm_eval_loss(model, data["eval"], job.eval_batch_size)
                log_history.append({"eval_loss": eval_loss, "step": global_step})
                model.train()
            if job.save_steps and (global_step % job.save_steps == 0 or is_last):
                folder = output_dir / f"checkpoint-{global_step}"
                save_checkpoint(folder, model, optimizer, scheduler, log_history)
    total_loss += running_loss.item()
    return {
        "first_step_time": first_step_time,
        "global_step": global_step,
        "train_loss": total_loss / global_step,
        "log_history": log_history,
    }


def evaluate_memory(job, args) -> dict:
    """Peak RSS of one full evaluation pass (loss only) over eval_scale x the eval texts."""
    import gc

    data = jobs.load_lm_data(job, eval_scale=args.eval_scale)
    model = jobs.build_lm_model(job, data["vocab_size"])
    gc.collect()
    before = measure.current_rss_mb()
    measure.reset_peak_rss()
    start = time.perf_counter()
    eval_loss = jobs.lm_eval_loss(model, data["eval"], job.eval_batch_size)
    return {
        "eval_s": time.perf_counter() - start,
        "eval_loss": eval_loss,
        "rss_before_eval_mb": before,
        "eval_peak_rss_mb": measure.high_water_rss_mb(),
        "eval_samples": len(data["eval"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(jobs.JOBS), required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mode", choices=["train", "evalmem"], default="train")
    parser.add_argument("--eval-scale", type=int, default=1)
    parser.add_argument("--eval-metrics", choices=["loss"], default="loss")
    parser.add_argument("--output-dir", default="bench/results/tmp/plain")
    parser.add_argument("--out", help="write the result JSON here (default: stdout)")
    args = parser.parse_args()
    dynamo_import_s = jobs.prepare_process(threads=1)
    job = jobs.get_job(args.job, args.quick)
    result = {
        "runner": "plain",
        "job": job.name,
        "quick": args.quick,
        "mode": args.mode,
        "import_s": IMPORT_S,
        "threads": torch.get_num_threads(),
        "dynamo_import_s": dynamo_import_s,
    }
    if args.mode == "evalmem":
        result.update(evaluate_memory(job, args))
        measure.write_result(args.out, result)
        return

    setup_start = time.perf_counter()
    if job.name == "regression":
        data = jobs.regression_columns(job)
        model = jobs.build_regression_model(job)
    else:
        data = jobs.load_lm_data(job)
        model = jobs.build_lm_model(job, data["vocab_size"])
    output_dir = Path(args.output_dir)
    result["setup_s"] = time.perf_counter() - setup_start

    train_start, train_cpu_start = time.perf_counter(), time.process_time()
    with measure.profile_if_requested():
        outcome = train(job, model, data, output_dir)
    result["train_s"] = time.perf_counter() - train_start
    result["train_cpu_s"] = time.process_time() - train_cpu_start
    shutil.rmtree(output_dir, ignore_errors=True)

    result["first_step_s"] = outcome.pop("first_step_time") - measure.spawn_time()
    result.update(outcome)
    if job.name == "regression":
        result["final_loss"] = jobs.regression_probe_loss(model, data)
    else:
        result["final_loss"] = jobs.lm_eval_loss(model, data["eval"], job.eval_batch_size)
        result["train_tokens"] = jobs.lm_train_tokens(job, data)
    result["param_checksum"] = jobs.param_checksum(model)
    measure.write_result(args.out, result)


if __name__ == "__main__":
    main()
