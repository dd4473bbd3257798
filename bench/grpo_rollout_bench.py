"""GRPO rollouts: transformers' `generate` (TRL's draws, the default) against lathe's engine (`rollout_engine:
lathe`: a batched KV-cache loop that drops each row when it ends) on the same job, on the CPU:

1. rollouts: one generation batch (prompts x num_generations rows, up to max_completion_length tokens each)
   sampled by each engine; completion tokens per second of process CPU time and of wall time, medians of repeats.
2. GRPO: a short GRPOTrainer run with each engine; optimizer steps per second (train_runtime), CPU and wall.

    python bench/grpo_rollout_bench.py [--repeats 3]    # ~5 min -> docs/BENCHMARKS_grpo.md

The model is a Llama of random weights over the committed BPE tokenizer (tests/llm/golden/tokenizers/bpe), with
a constant feature the end-of-sequence logit reads, so completion lengths spread from one token to the limit as
sampled completions do; one thread (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "BENCHMARKS_grpo.md"
sys.path.insert(0, str(ROOT / "tests" / "llm"))
SHAPE = {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 4}
PROMPTS = 8
GENERATIONS = 8
COMPLETION = 128
EOS_BIAS = 0.3


def build(folder: str) -> None:
    import shutil

    import grpo_cases
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    for item in grpo_cases.TOKENIZER.iterdir():
        shutil.copy(item, Path(folder) / item.name)
    vocab = len(AutoTokenizer.from_pretrained(str(grpo_cases.TOKENIZER)))
    config = LlamaConfig(
        vocab_size=vocab, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, **SHAPE
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight[2, 0] = EOS_BIAS
    model.save_pretrained(folder)


def rollouts(folder: str, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lathe.llm.rl import GRPOConfig, generation
    from lathe.llm.rl.rollouts import sample_dropping_finished

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.eos_token
    eos = generation.eos_ids_of(model, tokenizer)
    args = GRPOConfig(output_dir=folder, max_completion_length=COMPLETION, use_cpu=True, per_device_train_batch_size=8)
    config = generation.generation_config(args, tokenizer, eos)
    prompts = [tokenizer(p)["input_ids"] for p in prompt_rows()["prompt"][:PROMPTS]]
    rows = [ids for ids in prompts for _ in range(GENERATIONS)]
    engines = {
        "generate": lambda: generation.sample(model, rows, config, tokenizer.pad_token_id, eos, "cpu"),
        "lathe": lambda: sample_dropping_finished(model, rows, config, tokenizer.pad_token_id, eos, "cpu"),
    }
    results = {}
    for name, run in engines.items():
        measured = []
        for repeat in range(repeats):
            torch.manual_seed(repeat)
            wall, cpu = time.perf_counter(), time.process_time()
            completions = run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tokens = sum(len(c) for c in completions)
            measured.append((tokens / cpu, tokens / wall, tokens, max(len(c) for c in completions)))
        results[name] = [statistics.median(m[i] for m in measured) for i in range(4)]
    return results


def prompt_rows():
    """Twice the generation batch's prompts: grpo_cases' prompts, numbered."""
    import grpo_cases
    from datasets import Dataset

    count = 2 * PROMPTS
    prompts = [f"{grpo_cases.PROMPTS[i % len(grpo_cases.PROMPTS)]} {i}" for i in range(count)]
    return Dataset.from_dict({"prompt": prompts, "target": [grpo_cases.TARGETS[i % 6] for i in range(count)]})


def grpo_runs(folder: str, repeats: int) -> dict:
    import grpo_cases
    import torch

    from lathe.llm.rl import GRPOConfig, GRPOTrainer

    results = {}
    for engine in ("generate", "lathe"):
        measured = []
        for repeat in range(repeats):
            with tempfile.TemporaryDirectory() as out:
                args = GRPOConfig(
                    output_dir=out,
                    per_device_train_batch_size=PROMPTS * GENERATIONS // 2,
                    gradient_accumulation_steps=2,
                    num_generations=GENERATIONS,
                    max_completion_length=COMPLETION,
                    max_steps=3,
                    learning_rate=1e-5,
                    logging_steps=1,
                    save_strategy="no",
                    report_to="none",
                    seed=repeat,
                    bf16=False,
                    gradient_checkpointing=False,
                    use_cpu=True,
                    disable_tqdm=True,
                    rollout_engine=engine,
                )
                trainer = GRPOTrainer(
                    model=folder,
                    reward_funcs=grpo_cases.REWARDS,
                    args=args,
                    train_dataset=prompt_rows(),
                )
                torch.manual_seed(repeat)
                wall, cpu = time.perf_counter(), time.process_time()
                trainer.train()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                lengths = [
                    e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e
                ]
                measured.append((3 / cpu, 3 / wall, statistics.mean(lengths)))
        results[engine] = [statistics.median(m[i] for m in measured) for i in range(3)]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        build(folder)
        sampled = rollouts(folder, options.repeats)
        trained = grpo_runs(folder, options.repeats)
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    lines = [
        "# GRPO rollouts: `generate` against `rollout_engine: lathe` (CPU)",
        "",
        f"Made by `python bench/grpo_rollout_bench.py --repeats {options.repeats}` on "
        f"{datetime.date.today().isoformat()} ({platform.machine()}, one thread; a shared machine, so wall times "
        f"vary with the other jobs: the CPU columns are the comparison). Model: Llama, {shape}, random weights, "
        f"an end-of-sequence bias so completion lengths spread from 1 token to the limit ({COMPLETION}).",
        "",
        f"## Rollouts: one generation batch ({PROMPTS} prompts x {GENERATIONS} generations, temperature 1.0)",
        "",
        "| engine | tokens/s (CPU) | tokens/s (wall) | completion tokens | longest completion |",
        "|---|---|---|---|---|",
    ]
    for name, (cpu, wall, tokens, longest) in sampled.items():
        lines.append(f"| {name} | {cpu:.0f} | {wall:.0f} | {tokens:.0f} | {longest:.0f} |")
    speed = sampled["lathe"][0] / sampled["generate"][0]
    lines += [
        "",
        f"lathe's engine samples {speed:.2f}x the completion tokens per CPU second of `generate` on this batch.",
        "",
        f"## GRPO: 3 optimizer steps (per_device_train_batch_size {PROMPTS * GENERATIONS // 2}, accumulation 2: "
        f"one generation batch of {PROMPTS * GENERATIONS} completions per step)",
        "",
        "| engine | steps/s (CPU) | steps/s (wall) | mean completion length |",
        "|---|---|---|---|",
    ]
    for name, (cpu, wall, length) in trained.items():
        lines.append(f"| {name} | {cpu:.3f} | {wall:.3f} | {length:.1f} |")
    lines += [
        "",
        f"A GRPO run through lathe's engine takes {trained['lathe'][0] / trained['generate'][0]:.2f}x the steps per "
        "CPU second of one through `generate` (sampling is one part of a step: the old/reference log-probs, the "
        "rewards and the backward pass are the same work in both). The sampled tokens differ between the engines "
        "(the same distribution, fewer rows drawing once rows end), so the two runs' completion lengths differ too.",
        "",
    ]
    REPORT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
