"""Tiny models, datasets, arguments and a recording callback shared by the Trainer loop tests
(test_trainer_steps.py, test_trainer_callbacks.py, test_trainer_inputs.py). Each builder takes
`library` ("lathe" or "transformers") where the same job is also run through transformers.Trainer."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

FLAGS = ("should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log")
EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
)


def library_module(library: str):
    return importlib.import_module("lathe" if library == "lathe" else "transformers")


def training_args(output_dir, library: str = "lathe", **overrides):
    """Quiet, deterministic arguments: plain SGD at a constant, large learning rate (so every step
    moves the weights visibly), sequential sampling, a log every step, no checkpoints."""
    options = dict(
        output_dir=str(output_dir),
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        train_sampling_strategy="sequential",
        per_device_train_batch_size=2,
        optim="sgd",
        learning_rate=0.1,
        lr_scheduler_type="constant",
        logging_steps=1,
        seed=0,
        dataloader_pin_memory=False,
    )
    options.update(overrides)
    return library_module(library).TrainingArguments(**options)


def make_trainer(library: str = "lathe", **kwargs):
    return library_module(library).Trainer(**kwargs)


class Regression(nn.Module):
    """y = w·x + b with a per-batch mean squared error: no **kwargs, so the Trainer divides each
    micro-batch loss by the number of micro-batches in its accumulation window."""

    def __init__(self, features: int = 3, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(features, 1)
        self.forward_calls = 0
        self.batch_sizes: list[int] = []

    def forward(self, x, labels=None):
        self.forward_calls += 1
        self.batch_sizes.append(x.shape[0])
        prediction = self.linear(x).squeeze(-1)
        if labels is None:
            return {"logits": prediction}
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def regression_items(count: int = 10, features: int = 3, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, features, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5][:features]) + 0.1 * torch.randn(count, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(count)]


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_weights_close(first: nn.Module, second: nn.Module, atol: float = 1e-6) -> None:
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def assert_same_weights(first: nn.Module, second: nn.Module) -> None:
    """Bit for bit: both runs happen in the same test on the same machine."""
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ (not bitwise equal): {different}"


def max_weight_difference(first: nn.Module, second: nn.Module) -> float:
    a, b = weights(first), weights(second)
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def tiny_llama(seed: int = 0, **config_overrides):
    """A 2-layer LlamaForCausalLM (vocab 64, hidden 32): its forward takes **kwargs and divides the
    summed token loss by num_items_in_batch when given one."""
    transformers = pytest.importorskip("transformers")  # these tests skip where transformers is missing

    config = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    config.update(config_overrides)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))


def token_items(count: int = 12, min_length: int = 3, max_length: int = 10, seed: int = 0) -> list[dict]:
    """Sequences of different lengths (token ids 1..63; 0 is padding), labels = input_ids."""
    generator = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(count):
        length = int(torch.randint(min_length, max_length + 1, (1,), generator=generator))
        ids = torch.randint(1, 64, (length,), generator=generator).tolist()
        items.append({"input_ids": ids, "labels": list(ids)})
    return items


def pad_collate(features: list[dict]) -> dict:
    """Right padding to the longest item: input_ids 0, attention_mask 0, labels -100."""
    longest = max(len(f["input_ids"]) for f in features)
    batch = {"input_ids": [], "attention_mask": [], "labels": []}
    for feature in features:
        pad = longest - len(feature["input_ids"])
        batch["input_ids"].append(list(feature["input_ids"]) + [0] * pad)
        batch["attention_mask"].append([1] * len(feature["input_ids"]) + [0] * pad)
        batch["labels"].append(list(feature["labels"]) + [-100] * pad)
    return {key: torch.tensor(value) for key, value in batch.items()}


def recording_callback(library: str = "lathe", record_flags: bool = False):
    """A callback (subclass of the library's TrainerCallback) that appends "event:global_step" to
    `.events` for every event, or (event, step, flags) tuples with `record_flags`: the control
    flags as the event sees them on entry."""
    base = library_module(library).TrainerCallback

    def make_handler(event):
        def handler(self, args, state, control, **kwargs):
            if record_flags:
                self.events.append((event, state.global_step, tuple(getattr(control, f) for f in FLAGS)))
            else:
                self.events.append(f"{event}:{state.global_step}")
            self.kwargs.setdefault(event, kwargs)

        return handler

    namespace = {event: make_handler(event) for event in EVENTS}

    def __init__(self):
        self.events = []
        self.kwargs = {}

    namespace["__init__"] = __init__
    return type("RecordingCallback", (base,), namespace)()
