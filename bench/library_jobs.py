"""Libraries built on transformers' Trainer (sentence-transformers, TRL, setfit), run on transformers' Trainer or,
with --lathe, on lathe's (lathe.patch_transformers() before the library is imported): tiny local models and
data, CPU, fixed seeds. Writes what a user observes as JSON (log history, metrics, predictions, the files of
every checkpoint and of the final model, the final weights' sums), for bench/library_compare.py.

Run in the peer venv (bench/.cache/peers-venv: torch 2.13.0, transformers 5.23.0, accelerate 1.15.0,
sentence-transformers 6.2.0, trl 1.16.0, setfit 1.2.0), lathe on PYTHONPATH:
    python bench/library_jobs.py JOB OUT.json [--lathe]
Jobs: st_bi (bi-encoder, MultipleNegativesRankingLoss + CoSENTLoss on two datasets, an evaluator, step
evaluation, checkpoints, best model at end), st_cross (a cross-encoder), sft (TRL SFTTrainer: conversational,
packing, assistant-only loss), dpo, reward (TRL), setfit.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

WORDS = (
    "the a cat dog sat ran on mat log red blue big small fast slow bird fish swam flew tree sky water "
    "house car road green quick lazy jumped over under near far happy sad sun moon star night day"
).split()


def sentences(count: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(count)]


def bert_folder(root: str, seed: int = 0, layers: int = 2) -> str:
    """A tiny BERT and a WordPiece tokenizer whose vocabulary is the data's words (reproducible)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = os.path.join(root, "bert")
    os.makedirs(folder, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    with open(os.path.join(folder, "vocab.txt"), "w") as handle:
        handle.write("\n".join(vocab) + "\n")
    BertTokenizerFast(os.path.join(folder, "vocab.txt"), model_max_length=32).save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(folder)
    return folder


def llama_folder(root: str, seed: int = 0) -> str:
    """A tiny Llama with a chat template and a word-level tokenizer (TRL jobs)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = os.path.join(root, "llama")
    specials = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
    vocab = {token: index for index, token in enumerate(specials + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="<|end|>", unk_token="<unk>"
    )
    fast.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}<|user|> {{ m['content'] }} <|end|> "
        "{% else %}<|assistant|> {% generation %}{{ m['content'] }} <|end|>{% endgeneration %} {% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=6,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def common_args(output_dir: str) -> dict:
    return dict(
        output_dir=output_dir,
        report_to="none",
        disable_tqdm=True,
        seed=42,
        logging_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
    )


# ----- jobs: each returns (trainer, extra results) after training -----


def job_st_bi(root: str):
    from datasets import Dataset, DatasetDict
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer import losses, modules
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    bert = bert_folder(root)
    model = SentenceTransformer(modules=[modules.Transformer(bert), modules.Pooling(16, "mean")], device="cpu")
    anchors, positives = sentences(24, 1), sentences(24, 2)
    pairs = Dataset.from_dict({"anchor": anchors, "positive": positives})
    first, second = sentences(24, 3), sentences(24, 4)
    scores = [round(((i * 37) % 11) / 10.0, 1) for i in range(24)]
    scored = Dataset.from_dict({"sentence1": first, "sentence2": second, "score": scores})
    train = DatasetDict({"pairs": pairs.select(range(16)), "scored": scored.select(range(16))})
    evaluation = DatasetDict({"pairs": pairs.select(range(16, 24)), "scored": scored.select(range(16, 24))})
    loss = {"pairs": losses.MultipleNegativesRankingLoss(model), "scored": losses.CoSENTLoss(model)}
    evaluator = EmbeddingSimilarityEvaluator(first[16:], second[16:], scores[16:], name="sts")
    args = SentenceTransformerTrainingArguments(
        **common_args(os.path.join(root, "out")),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        eval_strategy="steps",
        eval_steps=4,
        save_strategy="steps",
        save_steps=4,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_sts_spearman_cosine",
        warmup_steps=2,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=evaluation, loss=loss, evaluator=evaluator
    )
    trainer.train()
    final = os.path.join(root, "final")
    model.save_pretrained(final)
    embeddings = model.encode(first[16:20], convert_to_tensor=True)
    return trainer, {"embeddings": embeddings.tolist(), "evaluator": evaluator(model), "final_dir": final}


def job_st_cross(root: str):
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    from transformers import BertForSequenceClassification

    bert = bert_folder(root)
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(bert, num_labels=1).save_pretrained(bert)
    model = CrossEncoder(bert, num_labels=1, device="cpu")
    first, second = sentences(20, 5), sentences(20, 6)
    labels = [float(i % 2) for i in range(20)]
    data = Dataset.from_dict({"sentence1": first, "sentence2": second, "label": labels})
    args = CrossEncoderTrainingArguments(
        **common_args(os.path.join(root, "out")),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="steps",
        save_steps=3,
    )
    trainer = CrossEncoderTrainer(
        model=model,
        args=args,
        train_dataset=data.select(range(12)),
        eval_dataset=data.select(range(12, 20)),
        loss=BinaryCrossEntropyLoss(model),
    )
    trainer.train()
    final = os.path.join(root, "final")
    model.save_pretrained(final)
    predictions = model.predict(list(zip(first[12:16], second[12:16])))
    return trainer, {"predictions": [float(p) for p in predictions], "final_dir": final}


def conversations(count: int, seed: int) -> list[list[dict]]:
    asked, answered = sentences(count, seed), sentences(count, seed + 100)
    return [
        [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        for question, answer in zip(asked, answered)
    ]


def job_sft(root: str):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    llama = llama_folder(root)
    data = Dataset.from_dict({"messages": conversations(24, 7)})
    args = SFTConfig(
        **common_args(os.path.join(root, "out")),
        max_steps=6,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        gradient_accumulation_steps=2,
        packing=True,
        max_length=32,
        assistant_only_loss=True,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="steps",
        save_steps=3,
    )
    trainer = SFTTrainer(
        model=llama, args=args, train_dataset=data.select(range(16)), eval_dataset=data.select(range(16, 24))
    )
    trainer.train()
    return trainer, {"final_dir": _save_final(trainer, root)}


def preference_data(count: int, seed: int):
    from datasets import Dataset

    prompts, chosen, rejected = sentences(count, seed), sentences(count, seed + 1), sentences(count, seed + 2)
    return Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})


# The DPO and reward jobs' schedule: 4 steps of 2 pairs, evaluation and a checkpoint every 2, rows of 32 tokens.
PAIR_JOB_STEPS = dict(
    max_steps=4,
    per_device_train_batch_size=2,
    per_device_eval_batch_size=2,
    eval_strategy="steps",
    eval_steps=2,
    save_strategy="steps",
    save_steps=2,
    max_length=32,
)


def job_dpo(root: str):
    from trl import DPOConfig, DPOTrainer

    llama = llama_folder(root)
    data = preference_data(16, 11)
    args = DPOConfig(**common_args(os.path.join(root, "out")), **PAIR_JOB_STEPS)
    trainer = DPOTrainer(
        model=llama, args=args, train_dataset=data.select(range(12)), eval_dataset=data.select(range(12, 16))
    )
    trainer.train()
    return trainer, {"final_dir": _save_final(trainer, root)}


def job_reward(root: str):
    import torch
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    llama = llama_folder(root)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(llama, num_labels=1).save_pretrained(llama)
    data = preference_data(16, 21)
    args = RewardConfig(**common_args(os.path.join(root, "out")), **PAIR_JOB_STEPS)
    trainer = RewardTrainer(
        model=llama, args=args, train_dataset=data.select(range(12)), eval_dataset=data.select(range(12, 16))
    )
    trainer.train()
    return trainer, {"final_dir": _save_final(trainer, root)}


def job_setfit(root: str):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules
    from setfit import SetFitModel, Trainer, TrainingArguments

    bert = bert_folder(root)
    body = SentenceTransformer(modules=[modules.Transformer(bert), modules.Pooling(16, "mean")], device="cpu")
    body.save_pretrained(os.path.join(root, "body"))
    model = SetFitModel.from_pretrained(os.path.join(root, "body"))
    texts = sentences(16, 31)
    data = Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(16)]})
    args = TrainingArguments(
        output_dir=os.path.join(root, "out"), batch_size=4, num_epochs=1, num_iterations=2, seed=42, report_to="none"
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data.select(range(12)),
        eval_dataset=data.select(range(12, 16)),
        metric=accuracy,  # a callable: evaluate.load("accuracy") needs the Hub
    )
    trainer.train()
    metrics = trainer.evaluate()
    final = os.path.join(root, "final")
    model.save_pretrained(final)
    probabilities = model.predict_proba(texts[12:]).tolist()
    return trainer, {"metrics": metrics, "probabilities": probabilities, "final_dir": final}


def accuracy(predictions, references) -> dict:
    import numpy

    return {"accuracy": float((numpy.asarray(predictions) == numpy.asarray(references)).mean())}


def _save_final(trainer, root: str) -> str:
    final = os.path.join(root, "final")
    trainer.save_model(final)
    return final


JOBS = {
    "st_bi": job_st_bi,
    "st_cross": job_st_cross,
    "sft": job_sft,
    "dpo": job_dpo,
    "reward": job_reward,
    "setfit": job_setfit,
}


# ----- what is recorded -----


def folder_record(folder: str) -> dict:
    """Each file: its size class and, for text/JSON files, content (JSON parsed); safetensors: every tensor's sum."""
    record = {}
    for base, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            path = os.path.join(base, name)
            key = os.path.relpath(path, folder)
            record[key] = file_record(path)
    return record


def file_record(path: str):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return {
            name: [list(t.shape), float(t.double().sum()), float(t.double().abs().sum())]
            for name, t in sorted(load_file(path).items())
        }
    if path.endswith(".json"):
        with open(path) as handle:
            try:
                return json.load(handle)
            except json.JSONDecodeError:
                return "unreadable json"
    if path.endswith((".txt", ".md", ".jinja")):
        with open(path, errors="replace") as handle:
            return handle.read()
    if path.endswith((".pt", ".pth", ".bin")):
        return torch_file_record(path)
    with open(path, "rb") as handle:
        return {"bytes": len(handle.read())}


def torch_file_record(path: str):
    """optimizer.pt, scheduler.pt, rng_state.pth: their numbers (tensors as shape and sums); training_args.bin:
    the arguments' dict (a pickled TrainingArguments of the library's class)."""
    import torch

    try:
        return _numbers(torch.load(path, weights_only=True))
    except Exception:
        loaded = torch.load(path, weights_only=False)  # files this run wrote (numpy RNG states, pickled arguments)
        if hasattr(loaded, "to_dict"):
            return {"class": type(loaded).__name__, "fields": _numbers(loaded.to_dict())}
        return _numbers(loaded)


def _numbers(value):
    import numpy
    import torch

    if torch.is_tensor(value):
        return [list(value.shape), float(value.double().sum())]
    if isinstance(value, numpy.ndarray):
        return [list(value.shape), float(value.astype("float64").sum())]
    if isinstance(value, dict):
        return {str(key): _numbers(item) for key, item in value.items() if key not in ("output_dir", "logging_dir")}
    if isinstance(value, (list, tuple)):
        return [_numbers(item) for item in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(type(value).__name__)


def main() -> None:
    job, out = sys.argv[1], sys.argv[2]
    if "--lathe" in sys.argv:
        import lathe

        lathe.patch_transformers()
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        trainer, extra = JOBS[job](root)
        import transformers

        final_dir = extra.pop("final_dir")
        result = {
            "trainer_class": f"{type(trainer).__mro__[1].__module__}",
            "lathe": type(trainer).__mro__[-2].__module__.startswith("lathe") or "lathe" in repr(transformers.Trainer),
            "log_history": getattr(getattr(trainer, "state", None), "log_history", None),
            "extra": extra,
            "output_dir": folder_record(os.path.join(root, "out")),
            "final": folder_record(final_dir),
        }
    with open(out, "w") as handle:
        json.dump(result, handle, indent=1, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
