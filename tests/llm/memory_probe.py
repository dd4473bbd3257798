"""Measures one configuration's peak memory for tests/llm/test_memory_plan.py, in a process of its own:
CPU peak RSS (VmHWM) above the RSS of the loaded process, over a few training steps of a model built
from its config with lathe.llm's method setup, and the memory plan of the same run. Prints one JSON line.

    python tests/llm/memory_probe.py '[{"vocab": 8000, "hidden": 128, ..., "batch": 4, "seq_len": 256, "keys": {...}}, ...]'

Under torchrun (several processes: FSDP2 when the keys say `fsdp`) each configuration runs in the launched
processes themselves, after a warm-up, with the high-water mark reset when training begins (every rank
builds the whole model before it is sharded); rank 0 prints the largest measured peak of the ranks.
"""

import json
import os
import sys
import tempfile


def rss(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def model_folder(spec: dict) -> str:
    """config.json of a Llama of the spec's sizes; with "saved", random weights too (quantization_bit loads them)."""
    folder = tempfile.mkdtemp(prefix="lathe_memory_probe_")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec["vocab"],
        "hidden_size": spec["hidden"],
        "intermediate_size": spec["intermediate"],
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"],
        "num_key_value_heads": spec["kv_heads"],
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }
    with open(os.path.join(folder, "config.json"), "w") as file:
        json.dump(config, file)
    if spec.get("saved") or spec.get("stage") in ("dpo", "kto"):  # a reference copy is loaded from the weights
        from transformers import AutoConfig, AutoModelForCausalLM

        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def train(spec: dict, steps: int, folder: str | None = None, callbacks: list | None = None):
    """Build the model as `lathe train` does and train it `steps` steps on random rows; returns the model and config."""
    import torch

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.model.loader import load_model
    from lathe.llm.workflows.setup import checkpointing_for
    from lathe.train.trainer import Trainer

    keys = {
        "model_name_or_path": folder or model_folder(spec),
        "train_from_scratch": not (spec.get("saved") or spec.get("stage") in ("dpo", "kto")),
        "stage": spec.get("stage", "sft"),
        "dataset": "none",
        "output_dir": tempfile.mkdtemp(prefix="lathe_memory_probe_out_"),
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1000,
        "disable_tqdm": True,
        "max_steps": steps,
        "per_device_train_batch_size": spec["batch"],
        "disable_gradient_checkpointing": not spec["checkpointing"],
        "use_cpu": True,
        **spec.get("keys", {}),
    }
    config = parse_train_config(keys)
    model = load_model(range(spec["vocab"]), config.model, config.finetuning, is_trainable=True)
    stage = spec.get("stage", "sft")
    if stage in ("dpo", "kto", "rm"):
        model = train_preference(spec, config, model, steps)
        return model, config
    checkpointing_for(model, config.training)
    generator = torch.Generator().manual_seed(0)
    shape = (spec["batch"] * steps, spec["seq_len"])
    rows = [
        {"input_ids": ids, "labels": ids.clone()} for ids in torch.randint(0, spec["vocab"], shape, generator=generator)
    ]
    Trainer(model=model, args=config.training, train_dataset=rows, callbacks=callbacks).train()
    return model, config


PROMPT = 16  # unlabelled prompt tokens of each preference row
SHORTER = 24  # the rejected (dpo, rm) or KL (kto) answer is this much shorter: the rows are padded


def preference_rows(spec: dict, count: int) -> list[dict]:
    """Random pairwise (dpo, rm) or KTO rows: chosen / target rows of seq_len tokens, the other side shorter."""
    import torch

    generator = torch.Generator().manual_seed(0)

    def encoded(length: int) -> tuple[list, list, list]:
        ids = torch.randint(0, spec["vocab"], (length,), generator=generator).tolist()
        return ids, [1] * length, [-100] * min(PROMPT, length) + ids[PROMPT:]

    names = ("input_ids", "attention_mask", "labels")
    rows = []
    for index in range(count):
        long, short = encoded(spec["seq_len"]), encoded(spec["seq_len"] - SHORTER)
        if spec["stage"] == "kto":
            row = {**dict(zip(names, long)), **{f"kl_{name}": value for name, value in zip(names, short)}}
            rows.append({**row, "kto_tags": index % 2 == 0})
        else:
            rows.append(
                {
                    **{f"chosen_{n}": v for n, v in zip(names, long)},
                    **{f"rejected_{n}": v for n, v in zip(names, short)},
                }
            )
    return rows


def train_preference(spec: dict, config, model, steps: int):
    """The stage's trainer as its recipe builds it (lathe.llm.workflows.preference / rm), on random rows."""
    from types import SimpleNamespace

    from lathe.llm.workflows.setup import checkpointing_for

    tokenizer = SimpleNamespace(pad_token_id=0, padding_side="right", eos_token_id=1)
    rows = preference_rows(spec, spec["batch"] * steps)
    if spec["stage"] == "rm":
        from lathe.llm.data.pairwise import PairwiseDataCollator
        from lathe.llm.model.value_head import add_value_head
        from lathe.llm.preference.reward import RewardTrainer

        model = add_value_head(model, config.model)
        checkpointing_for(model, config.training)
        collator = PairwiseDataCollator(tokenizer, pad_to_multiple_of=8)
        trainer = RewardTrainer(
            model=model,
            args=config.training,
            data_collator=collator,
            train_dataset=rows,
            finetuning_args=config.finetuning,
        )
    else:
        from lathe.llm.workflows.preference import _make_trainer, make_reference

        checkpointing_for(model, config.training)
        reference = make_reference(model, range(spec["vocab"]), config)
        datasets = {"train_dataset": rows, "eval_dataset": None}
        trainer = _make_trainer(config, model, reference, tokenizer, datasets, [])
    trainer.train()
    return model


def measure(spec: dict) -> dict:
    """In a forked child: peak RSS above the child's own starting RSS (the high-water mark reset first)."""
    from lathe.llm.memory.plan import Settings, estimate_memory
    from lathe.llm.workflows.plan import loss_chunk

    folder = model_folder(spec)
    # A forked child shares the parent's library code but maps it in again as it runs: run the same
    # code once on a tiny model so that the baseline holds it.
    warm_up([spec])
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS
    baseline = rss("VmRSS")
    model, config = train(spec, spec.get("steps", 2), folder)
    measured = rss("VmHWM") - baseline
    settings = Settings(
        batch=spec["batch"],
        seq_len=spec["seq_len"],
        optim=str(config.training.optim),
        checkpointing=config.training.gradient_checkpointing,
        quantization_bit=config.model.quantization_bit,
        chunk=loss_chunk(config.training, spec["vocab"]),
        half=bool(config.training.bf16 or config.training.fp16 or config.finetuning.pure_bf16),
        **preference_settings(spec, config),
    )
    plan = estimate_memory(model, settings)
    terms = {key: value for key, value in vars(plan).items() if isinstance(value, int) and not isinstance(value, bool)}
    return {"measured": measured, "planned": plan.peak, "plan": terms}


def preference_settings(spec: dict, config) -> dict:
    """The plan's preference settings of the probe's run, as lathe.llm.workflows.plan derives them."""
    stage = spec.get("stage", "sft")
    if stage not in ("dpo", "kto", "rm"):
        return {}
    from lathe.llm.preference.reference import reference_kind

    return {
        "stage": stage,
        "masked": True,  # the rejected / KL rows are shorter: the batch is padded
        "reference_copy": reference_kind(config.finetuning, True) == "copy",
        "kl_seq_len": spec["seq_len"] - SHORTER if stage == "kto" else None,
        "reference_forward": stage == "kto" or (stage == "dpo" and config.finetuning.use_ref_model),
    }


def in_child(function, argument) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report, leave without running the parent's cleanup
        os.close(read)
        try:
            result = {"ok": function(argument)}
        except BaseException as error:  # reported to the parent, which raises it
            result = {"error": f"{type(error).__name__}: {error}"}
        with os.fdopen(write, "w") as pipe:
            pipe.write(json.dumps(result))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    result = json.loads(text)
    if "error" in result:
        raise RuntimeError(result["error"])
    return result["ok"]


def main(specs: list[dict]) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    warm_up(specs)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return [measure_launched(spec) for spec in specs]
    return [in_child(measure, spec) for spec in specs]


def measure_launched(spec: dict) -> dict:
    """One configuration in this launched process: peak RSS from the start of training (the sharded
    model) above the RSS before the model was built; the largest of the ranks, and rank 0's plan."""
    import torch
    import torch.distributed as dist

    from lathe.llm.memory.plan import Settings, estimate_memory
    from lathe.llm.memory.sharding import sharding_of
    from lathe.llm.workflows.plan import loss_chunk
    from lathe.train.callbacks.events import TrainerCallback

    folder = model_folder(spec) if dist.get_rank() == 0 else None
    holder = [folder]
    dist.broadcast_object_list(holder)
    baseline = rss("VmRSS")

    class ResetPeak(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")

    model, config = train(spec, spec.get("steps", 2), holder[0], callbacks=[ResetPeak()])
    measured = torch.tensor(rss("VmHWM") - baseline)
    dist.all_reduce(measured, op=dist.ReduceOp.MAX)
    settings = Settings(
        batch=spec["batch"],
        seq_len=spec["seq_len"],
        optim=str(config.training.optim),
        checkpointing=config.training.gradient_checkpointing,
        chunk=loss_chunk(config.training, spec["vocab"]),
        half=bool(config.training.bf16 or config.training.fp16 or config.finetuning.pure_bf16),
        sharding=sharding_of(config.training),
        **preference_settings(spec, config),
    )
    plan = estimate_memory(unsharded_copy(spec, config), settings)
    terms = {key: value for key, value in vars(plan).items() if isinstance(value, int) and not isinstance(value, bool)}
    return {"measured": int(measured), "planned": plan.peak, "plan": terms}


def unsharded_copy(spec: dict, config):
    """The model as the plan sees it before sharding (`lathe train` plans before the Trainer shards)."""
    from lathe.llm.model.loader import load_model

    return load_model(range(spec["vocab"]), config.model, config.finetuning, is_trainable=True)


def warm_up(specs: list[dict]) -> None:
    """The loaded process: every module imported and the code paths run once, on a tiny model of the same kind."""
    tiny = {"vocab": 64, "hidden": 16, "intermediate": 16, "layers": 1, "heads": 2, "kv_heads": 1, "batch": 1}
    kinds = {(json.dumps(spec.get("keys", {}), sort_keys=True), spec.get("stage", "sft")) for spec in specs}
    for keys, stage in sorted(kinds):  # the same order on every rank (string hashes differ)
        saved = "quantization_bit" in keys or stage in ("dpo", "kto")  # the reference copy loads weights
        for checkpointing in sorted({spec["checkpointing"] for spec in specs}):
            warm = {**tiny, "seq_len": 48, "checkpointing": checkpointing, "saved": saved, "stage": stage}
            train({**warm, "keys": json.loads(keys)}, 2)


if __name__ == "__main__":
    results = main(json.loads(sys.argv[1]))
    if int(os.environ.get("RANK", "0")) == 0:
        for result in results:
            print(json.dumps(result))
