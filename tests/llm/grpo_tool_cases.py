"""The GRPO tool-calling cases that bench/grpo_goldens.py runs under TRL (`--tools`) and
tests/llm/test_grpo_tools.py runs under lathe: a tiny Llama taught (briefly, deterministically, by
build_tool_model) to answer "add A and B" with a Qwen2.5-style `<tool_call>` of `add`, so that sampled
completions call the tool (correctly, wrongly or not at all); a standalone tool, a stateful environment (a
running total, its own reward) and a dict of two environments picked per row. Imports neither lathe nor TRL.

The model and its tokenizer (the committed BPE vocabulary with ChatML's special tokens; Qwen2.5's chat
template, which renders tools and tool messages) are committed under golden/grpo_tool_model (about 150 kB),
so that the sampled tokens are the same on every machine."""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE / "golden" / "tokenizers" / "bpe_special"
MODEL = HERE / "golden" / "grpo_tool_model"

PAIRS = [(3, 4), (2, 5), (6, 1), (4, 4), (7, 2), (1, 8)]
PROMPTS = [f"add {a} and {b}" for a, b in PAIRS]

BASE = {
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "max_completion_length": 48,
    "max_steps": 2,
    "learning_rate": 1e-2,
    "lr_scheduler_type": "constant",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "seed": 42,
    "bf16": False,
    "gradient_checkpointing": False,
    "use_cpu": True,
}

CASES = {
    "tools": {"tools": True, "beta": 0.1},
    "tools_iter1_grpo": {"tools": True, "loss_type": "grpo", "max_tool_calling_iterations": 1, "num_iterations": 2},
    "environment": {"environment": "single", "beta": 0.1},
    "environment_dict": {"environment": "dict"},
}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


class Adder:
    """A stateful environment: a running total that `add` moves; its reward is how close the total came to the
    row's target (the sum asked for)."""

    def __init__(self):
        self.total = 0
        self.target = 0
        self.calls = 0

    def reset(self, target=0, **kwargs):
        self.total, self.target, self.calls = 0, target, 0
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls += 1
        self.total += a + b
        return self.total

    def get_reward(self) -> float:
        return -abs(self.total - self.target) / 10.0


class Counter:
    """A second environment for the dict case: `add` counts calls; it returns an observation from reset."""

    def __init__(self):
        self.count = 0

    def reset(self, **kwargs):
        self.count = 0
        return " (count calls)"

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.count += 1
        return f"{a + b} (call {self.count})"


def environment_factory(kind: str):
    return {"single": Adder, "dict": {"adder": Adder, "counter": Counter}}[kind]


def _messages(completion):
    return completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]


def tool_result_right(completions, target, **kwargs):
    """1 when a tool message holds the target, else 0."""
    return [
        float(any(m["role"] == "tool" and str(t) in str(m["content"]) for m in _messages(c)))
        for c, t in zip(completions, target)
    ]


def turns(completions, **kwargs):
    """Minus a tenth per message beyond two (rewards short exchanges)."""
    return [-max(0, len(_messages(c)) - 2) / 10 for c in completions]


def calls_made(completions, environments=None, **kwargs):
    """The environments' own counts of calls (None without environments)."""
    if environments is None:
        return [None] * len(completions)
    return [float(getattr(e, "calls", getattr(e, "count", 0))) for e in environments]


REWARDS = [tool_result_right, turns, calls_made]


def dataset(kind: str | None = None):
    from datasets import Dataset

    prompts = [[{"role": "user", "content": text}] for text in PROMPTS]
    columns = {"prompt": prompts, "target": [a + b for a, b in PAIRS]}
    if kind == "dict":
        columns["environment"] = ["adder", "counter"] * (len(PROMPTS) // 2)
    return Dataset.from_dict(columns)


def record(trainer, generations) -> dict:
    logs = [
        {
            k: v
            for k, v in entry.items()
            if k not in ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
        }
        for entry in trainer.state.log_history
    ]
    return {"logs": logs, "generations": generations}


def training_conversations():
    """Tool-calling conversations in the chat template's format: the model learns to call `add` with the numbers
    asked, then to repeat the tool's answer."""
    conversations = []
    for a in range(1, 9):
        for b in range(1, 9):
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
            conversations.append(
                [
                    {"role": "user", "content": f"add {a} and {b}"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "add", "content": str(a + b)},
                    {"role": "assistant", "content": str(a + b)},
                ]
            )
    return conversations


def build_tool_model(folder, chat_template: str, steps: int = 120, seed: int = 0) -> None:
    """A tiny Llama over TOKENIZER with `chat_template` and <|im_end|> as its end-of-sequence token, trained
    for `steps` full-batch Adam steps on training_conversations() (loss on the assistant's and tool's turns), so
    that it calls `add` often but not always; saved with its tokenizer in `folder`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    tokenizer.chat_template = chat_template
    tokenizer.eos_token = "<|im_end|>"
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    rows, masks = [], []
    for conversation in training_conversations():
        full = tokenizer.apply_chat_template(conversation, tools=[add], tokenize=True, return_dict=False)
        prompt = tokenizer.apply_chat_template(
            conversation[:1], tools=[add], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        rows.append(torch.tensor(full))
        masks.append(torch.tensor([0] * len(prompt) + [1] * (len(full) - len(prompt))))
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.nn.functional.pad(r, (0, width - len(r)), value=tokenizer.eos_token_id) for r in rows])
    labels = ids.clone()
    labels[torch.stack([torch.nn.functional.pad(m, (0, width - len(m))) for m in masks]) == 0] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return loss.item()


def copy_model(folder) -> str:
    """The committed model, copied into `folder` (runs write next to it)."""
    shutil.copytree(MODEL, folder, dirs_exist_ok=True)
    return str(folder)
