"""Measures one configuration's peak memory for tests/llm/test_memory_plan.py, in a process of its own:
CPU peak RSS (VmHWM) above the RSS of the loaded process, over a few training steps of a model built
from its config with lathe.llm's method setup, and the memory plan of the same run. Prints one JSON line.

    python tests/llm/memory_probe.py '[{"vocab": 8000, "hidden": 128, ..., "batch": 4, "seq_len": 256, "keys": {...}}, ...]'
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
    if spec.get("saved"):
        from transformers import AutoConfig, AutoModelForCausalLM

        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def train(spec: dict, steps: int, folder: str | None = None):
    """Build the model as `lathe train` does and train it `steps` steps on random rows; returns the model and config."""
    import torch

    from lathe.llm.config import parse_train_config
    from lathe.llm.model.loader import load_model
    from lathe.llm.workflows.setup import checkpointing_for
    from lathe.train.trainer import Trainer

    keys = {
        "model_name_or_path": folder or model_folder(spec),
        "train_from_scratch": not spec.get("saved"),
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
    checkpointing_for(model, config.training)
    generator = torch.Generator().manual_seed(0)
    shape = (spec["batch"] * steps, spec["seq_len"])
    rows = [
        {"input_ids": ids, "labels": ids.clone()} for ids in torch.randint(0, spec["vocab"], shape, generator=generator)
    ]
    Trainer(model=model, args=config.training, train_dataset=rows).train()
    return model, config


def measure(spec: dict) -> dict:
    """In a forked child: peak RSS above the child's own starting RSS (the high-water mark reset first)."""
    from lathe.llm.memory_plan import Settings, estimate_memory
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
    )
    plan = estimate_memory(model, settings)
    terms = {key: value for key, value in vars(plan).items() if isinstance(value, int) and not isinstance(value, bool)}
    return {"measured": measured, "planned": plan.peak, "plan": terms}


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
    return [in_child(measure, spec) for spec in specs]


def warm_up(specs: list[dict]) -> None:
    """The loaded process: every module imported and the code paths run once, on a tiny model of the same kind."""
    tiny = {"vocab": 64, "hidden": 16, "intermediate": 16, "layers": 1, "heads": 2, "kv_heads": 1, "batch": 1}
    for keys in {json.dumps(spec.get("keys", {}), sort_keys=True) for spec in specs}:
        saved = "quantization_bit" in keys
        for checkpointing in {spec["checkpointing"] for spec in specs}:
            train({**tiny, "seq_len": 8, "checkpointing": checkpointing, "saved": saved, "keys": json.loads(keys)}, 2)


if __name__ == "__main__":
    for result in main(json.loads(sys.argv[1])):
        print(json.dumps(result))
