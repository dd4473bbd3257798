"""What the CUDA tests share: a tiny Qwen2 built from a config, fixed-length token rows with a pattern a model
can learn, a small dropout MLP, and the losses and grad norms a Trainer logged."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 128


def tiny_qwen2(seed: int = 0, **overrides):
    """A 2-layer Qwen2ForCausalLM (hidden 64, vocab 128) with SDPA attention, on the CPU (the Trainer moves it)."""
    import transformers

    config = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    config.update(overrides)
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config))


def token_rows(count: int = 32, length: int = 32, seed: int = 0) -> list[dict]:
    """Rows of one length (no padding, no attention mask: SDPA's causal fast path) counting up from a random
    start modulo a 16-token range, so the next token is learnable and the loss falls within a few steps."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        start = int(torch.randint(0, 16, (1,), generator=generator))
        ids = (start + torch.arange(length)) % 16 + 1
        labels = ids.clone()
        labels[: int(torch.randint(0, 4, (1,), generator=generator))] = -100  # a prompt part that is not trained
        rows.append({"input_ids": ids, "labels": labels})
    return rows


class DropoutNet(nn.Module):
    """An MLP with dropout: on CUDA its masks come from the CUDA generator, so an exact resume needs its state."""

    def __init__(self, features: int = 8, hidden: int = 32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))

    def forward(self, x, labels=None):
        prediction = self.body(x).squeeze(-1)
        loss = nn.functional.mse_loss(prediction, labels) if labels is not None else None
        return {"loss": loss, "logits": prediction}


def regression_rows(count: int = 64, features: int = 8, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, features, generator=generator)
    y = x.sum(dim=1) + 0.1 * torch.randn(count, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(count)]


def no_tf32() -> None:
    """True fp32 matrix products, with the API the running torch has (mixing torch's old and new TF32 switches
    is an error on newer torch)."""
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_loss" not in entry]
