"""The benchmark jobs: data, models and hyperparameters that every runner (plain, transformers, lathe) shares.

Everything a runner needs to reproduce the same maths lives here, so the three runners differ only
in the training loop. Two facts make the runs bit-comparable:
- weights come from `torch.manual_seed(job.seed)` immediately before the model is built, in every
  runner, so all three start from the same tensors;
- the sample order is the one transformers.Trainer uses: for epoch `e`, `torch.randperm(n)` drawn
  from a generator seeded with `seed + e` (accelerate's SeedableRandomSampler; the Trainer calls
  `set_seed(args.seed)` first, so the sampler's initial seed is `args.seed`). See `epoch_order`.

`python bench/jobs.py prepare` builds the lm job's tokenizer and token ids once (cached under
bench/results/cache/) so that no timed run pays for tokenizer training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

BENCH_DIR = Path(__file__).resolve().parent
CACHE_DIR = BENCH_DIR / "results" / "cache"
IGNORE_INDEX = -100  # label value the loss skips (padding), as in transformers


# ---------------------------------------------------------------------------------------------
# Job definitions
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """Hyperparameters of one job; the trainers get them as TrainingArguments, the plain loop reads them."""

    name: str
    seed: int = 42
    batch_size: int = 32
    eval_batch_size: int = 32
    gradient_accumulation_steps: int = 1
    epochs: int = 5
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    logging_steps: int = 50
    eval_steps: int = 0  # 0: no evaluation during training
    save_steps: int = 0  # 0: no checkpoints
    # regression data/model
    n_samples: int = 4096
    n_features: int = 16
    hidden: int = 64
    # lm data/model
    n_train_texts: int = 0
    n_eval_texts: int = 0
    max_length: int = 128
    vocab_size: int = 1024
    n_layers: int = 2
    n_heads: int = 4
    intermediate: int = 256

    @property
    def n_train(self) -> int:
        return self.n_samples if self.name.startswith("regression") else self.n_train_texts

    @property
    def micro_batches_per_epoch(self) -> int:
        return math.ceil(self.n_train / self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.micro_batches_per_epoch / self.gradient_accumulation_steps)

    @property
    def max_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


JOBS = {
    # Overhead dominates: ~0.1 ms of maths per step. 4096/32 = 128 steps per epoch, 640 steps.
    "regression": Job(name="regression", epochs=5),
    # A small causal LM: 2 layers, hidden 128, padded variable-length text, accumulation 2,
    # evaluation every 32 steps and a checkpoint every 64: 2 epochs x 64 steps = 128 steps.
    "lm": Job(
        name="lm",
        batch_size=16,
        gradient_accumulation_steps=2,
        epochs=2,
        learning_rate=2e-3,
        warmup_steps=16,
        logging_steps=16,
        eval_steps=32,
        save_steps=64,
        hidden=128,
        n_train_texts=2048,
        n_eval_texts=256,
        eval_batch_size=32,
    ),
}
QUICK_JOBS = {
    "regression": dataclasses.replace(JOBS["regression"], n_samples=1024, epochs=2, logging_steps=16),
    "lm": dataclasses.replace(
        JOBS["lm"],
        n_train_texts=256,
        n_eval_texts=64,
        epochs=1,
        eval_steps=4,
        save_steps=8,
        logging_steps=4,
    ),
}


def get_job(name: str, quick: bool = False) -> Job:
    return (QUICK_JOBS if quick else JOBS)[name]


def epoch_order(job: Job, epoch: int) -> list[int]:
    """The sample order of `epoch`, as transformers.Trainer draws it (see module docstring)."""
    generator = torch.Generator()
    generator.manual_seed(job.seed + epoch)
    return torch.randperm(job.n_train, generator=generator).tolist()


def prepare_process(threads: int = 1) -> float:
    """Same thread count everywhere, and torch's one-time optimizer import paid before any timing.

    Creating the first torch optimizer in a process imports torch._dynamo (1-1.5 s here).
    `from transformers import Trainer` already imports it, so without this the plain loop's and
    lathe's train times would carry a second that transformers' carries in its import time. The
    cost still shows in every runner's process wall and start-to-first-step times. Returns the
    seconds the import took (0 when it was already imported).
    """
    torch.set_num_threads(threads)  # OMP_NUM_THREADS is also set by run_all
    start = time.perf_counter()
    importlib.import_module("torch._dynamo")
    return time.perf_counter() - start


class DictDataset(torch.utils.data.Dataset):
    """A map-style dataset of per-sample dicts (what a user hands to Trainer), rows made up front.

    Slicing a tensor row costs ~5 us, so building samples on the fly would bill the Trainers
    ~0.3 ms per regression step for this file's design rather than for their own machinery;
    `__getitem__` returns a shallow copy so a collator that edits its features cannot corrupt
    the next epoch.
    """

    def __init__(self, columns: dict):
        keys = list(columns)
        values = [list(column.unbind(0)) if isinstance(column, torch.Tensor) else column for column in columns.values()]
        self.rows = [dict(zip(keys, row)) for row in zip(*values)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return dict(self.rows[index])


# ---------------------------------------------------------------------------------------------
# regression: a tiny MLP, overhead dominates
# ---------------------------------------------------------------------------------------------
class MLPRegressor(nn.Module):
    """Returns a dict with `loss` when given labels, as Trainer requires of a model."""

    def __init__(self, n_features: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1)
        )

    def forward(self, x, labels=None):
        prediction = self.net(x).squeeze(-1)
        output = {"logits": prediction}
        if labels is not None:
            output["loss"] = F.mse_loss(prediction, labels)
        return output


def regression_columns(job: Job) -> dict[str, torch.Tensor]:
    """A smooth nonlinear target plus noise; the same tensors in every process."""
    generator = torch.Generator().manual_seed(job.seed)
    x = torch.randn(job.n_samples, job.n_features, generator=generator)
    weight = torch.randn(job.n_features, generator=generator) / math.sqrt(job.n_features)
    noise = 0.1 * torch.randn(job.n_samples, generator=generator)
    y = x @ weight + 0.5 * torch.sin(3 * x[:, 0]) + noise
    return {"x": x, "labels": y}


def build_regression_model(job: Job) -> MLPRegressor:
    torch.manual_seed(job.seed)
    return MLPRegressor(job.n_features, job.hidden)


def regression_probe_loss(model: nn.Module, columns: dict[str, torch.Tensor]) -> float:
    """Full-data MSE of the trained model: the runner-independent 'final loss'."""
    model.eval()
    with torch.no_grad():
        return float(model(**columns)["loss"])


# ---------------------------------------------------------------------------------------------
# lm: a small randomly initialised Llama on synthetic text
# ---------------------------------------------------------------------------------------------
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
PAD_ID, BOS_ID, EOS_ID = 0, 2, 3


def synthetic_texts(count: int, seed: int) -> list[str]:
    """Sentences from a tiny grammar over invented words: learnable structure, variable lengths."""
    rng = random.Random(seed)
    word_rng = random.Random(1234)  # the lexicon is the same for train and eval texts
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "pe", "da", "zu", "fen", "gor", "bel"]

    def words(n):
        return ["".join(word_rng.choice(syllables) for _ in range(word_rng.randint(1, 3))) for _ in range(n)]

    nouns, verbs, adjectives = words(120), words(60), words(40)
    determiners, prepositions = ["the", "a", "every", "some"], ["on", "under", "with", "near"]
    texts = []
    for _ in range(count):
        sentences = []
        for _ in range(rng.randint(1, 10)):
            parts = [rng.choice(determiners)]
            if rng.random() < 0.5:
                parts.append(rng.choice(adjectives))
            parts += [rng.choice(nouns), rng.choice(verbs), rng.choice(determiners), rng.choice(nouns)]
            if rng.random() < 0.3:
                parts += [rng.choice(prepositions), rng.choice(determiners), rng.choice(nouns)]
            sentences.append(" ".join(parts) + " .")
        texts.append(" ".join(sentences))
    return texts


def _lm_cache_dir(job: Job) -> Path:
    key = {k: getattr(job, k) for k in ("seed", "n_train_texts", "n_eval_texts", "max_length", "vocab_size")}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return CACHE_DIR / f"lm-{digest}"


EVAL_SCALES = (1, 10)  # eval-memory measurement: 1x and 10x the eval texts


def prepare_lm_assets(job: Job) -> Path:
    """Train a BPE tokenizer on the synthetic training text and tokenize everything; cached."""
    folder = _lm_cache_dir(job)
    if (folder / "data.json").exists():
        return folder
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    train_texts = synthetic_texts(job.n_train_texts, job.seed)
    eval_texts = synthetic_texts(job.n_eval_texts * max(EVAL_SCALES), job.seed + 1)
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        train_texts, trainers.BpeTrainer(vocab_size=job.vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", BOS_ID), ("[EOS]", EOS_ID)]
    )
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]

    def encode(texts):
        return [e.ids[: job.max_length] for e in tokenizer.encode_batch(texts)]

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    data = {"train": encode(train_texts), "eval": encode(eval_texts), "vocab_size": tokenizer.get_vocab_size()}
    temporary = folder / "data.json.tmp"
    temporary.write_text(json.dumps(data))
    os.replace(temporary, folder / "data.json")
    return folder


def load_lm_data(job: Job, eval_scale: int = 1) -> dict:
    """Token ids: {'train': [[ids]], 'eval': [[ids]], 'vocab_size': V}; eval cut to eval_scale x n_eval_texts."""
    folder = prepare_lm_assets(job)
    data = json.loads((folder / "data.json").read_text())
    data["eval"] = data["eval"][: job.n_eval_texts * eval_scale]
    data["tokenizer_file"] = str(folder / "tokenizer.json")
    return data


def lm_tokenizer(data: dict):
    """The locally trained tokenizer as a transformers tokenizer (the trainers' collator pads with it)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=data["tokenizer_file"],
        pad_token="[PAD]",
        unk_token="[UNK]",
        bos_token="[BOS]",
        eos_token="[EOS]",
    )


def build_lm_model(job: Job, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=job.hidden,
        intermediate_size=job.intermediate,
        num_hidden_layers=job.n_layers,
        num_attention_heads=job.n_heads,
        num_key_value_heads=job.n_heads,
        max_position_embeddings=2 * job.max_length,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    torch.manual_seed(job.seed)
    return LlamaForCausalLM(config)


def pad_batch(sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Right padding to the longest sequence; labels are the ids with padding set to -100.

    The same tensors as DataCollatorForLanguageModeling(mlm=False) with a [PAD] token distinct from EOS.
    """
    longest = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), longest), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[row, : len(sequence)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def lm_eval_loss(model: nn.Module, sequences: list[list[int]], batch_size: int) -> float:
    """Mean over samples of each batch's token-mean loss: how transformers.Trainer.evaluate reports eval_loss."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(sequences), batch_size):
            chunk = sequences[start : start + batch_size]
            total += float(model(**pad_batch(chunk)).loss) * len(chunk)
            count += len(chunk)
    return total / count


def lm_train_tokens(job: Job, data: dict) -> int:
    """Non-padding tokens the training run processes (the tokens/s numerator, the same for every runner)."""
    return sum(len(s) for s in data["train"]) * job.epochs


def param_checksum(model: nn.Module) -> float:
    """Sum of all weights in float64: equal across runners only if every update was the same."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["prepare"]:
        for quick in (False, True):
            print(prepare_lm_assets(get_job("lm", quick)))
    else:
        sys.exit("usage: python bench/jobs.py prepare")
