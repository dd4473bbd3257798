"""From the Train form to the YAML `lathe train` runs: LLaMA Board's defaults, the methods and their keys,
values parsed and checked (paths under the root, trust_remote_code confirmed), the file saved."""

from __future__ import annotations

import json
import os
import re

from lathe.llm.webui.paths import PathError, check_config_paths, check_dataset_files, checked_model, inside

STAGES = ("sft", "pt", "rm", "dpo", "kto", "grpo")
# The keys each stage adds to the form (besides the method's): GRPO's reward functions, sampling and objective.
STAGE_KEYS = {
    "grpo": ["reward_funcs", "num_generations", "max_completion_length", "beta", "loss_type", "temperature"],
}
# finetuning_type and quantization per method; the keys each method shows in the form.
METHODS = {
    "full": ({"finetuning_type": "full"}, []),
    "freeze": ({"finetuning_type": "freeze"}, ["freeze_trainable_layers", "freeze_trainable_modules"]),
    "lora": ({"finetuning_type": "lora"}, ["lora_rank", "lora_alpha", "lora_dropout", "lora_target"]),
    "qlora": (
        {"finetuning_type": "lora", "quantization_bit": 4},
        ["lora_rank", "lora_alpha", "lora_dropout", "lora_target", "quantization_bit"],
    ),
    "oft": ({"finetuning_type": "oft"}, ["oft_rank", "oft_block_size", "oft_target"]),
}
# LLaMA Board's defaults for the keys the form shows (LLaMA-Factory's webui/components/train.py).
DEFAULTS = {
    "learning_rate": 5e-5,
    "num_train_epochs": 3.0,
    "max_grad_norm": 1.0,
    "max_samples": 100000,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 8,
    "lr_scheduler_type": "cosine",
    "cutoff_len": 2048,
    "val_size": 0,
    "logging_steps": 5,
    "save_steps": 100,
    "warmup_steps": 0,
    "freeze_trainable_layers": 2,
    "freeze_trainable_modules": "all",
    "lora_rank": 8,
    "lora_alpha": 16,
    "lora_dropout": 0,
    "lora_target": "all",
    "quantization_bit": 4,
    "oft_rank": 0,
    "oft_block_size": 32,
    "oft_target": "all",
    # stage grpo: TRL 1.16's defaults (reward_funcs has none: `module:function` names or reward-model folders)
    "reward_funcs": "",
    "num_generations": 8,
    "max_completion_length": 512,
    "beta": 0.0,
    "loss_type": "dapo",
    "temperature": 1.0,
}
CONFIG_FOLDER = "configs"  # under the root: the YAML files the page saves and runs
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
MAX_KEYS = 300


def parse_value(text):
    """A form field's text as YAML would read it (numbers, true/false, lists); other types pass through."""
    import yaml

    if not isinstance(text, str):
        return text
    stripped = text.strip()
    if stripped == "":
        return None
    for number in (int, float):  # before YAML, which reads 2e-4 (no dot) as a string
        try:
            return number(stripped)
        except ValueError:
            pass
    try:
        value = yaml.safe_load(stripped)  # safe_load: data only, never objects or code
    except yaml.YAMLError:
        return stripped
    return value if isinstance(value, (int, float, bool, str, list)) else stripped


def build_config(root: str, form: dict) -> dict:
    """The config the form describes: method keys, then the fields, then the "all keys" editor; empty
    fields left out; paths checked under root; trust_remote_code only with its confirmation."""
    if not isinstance(form, dict) or not isinstance(form.get("values", {}), dict):
        raise ValueError("the form must be a JSON object with a 'values' object.")
    method = form.get("method") or "lora"
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}.")
    values = dict(METHODS[method][0])
    values.update({"do_train": True, "stage": "sft", "report_to": "none", "plot_loss": True})
    fields = dict(form.get("values") or {})
    fields.update(_extra_keys(form.get("extra", "")))
    if len(fields) > MAX_KEYS:
        raise ValueError(f"too many keys ({len(fields)}; at most {MAX_KEYS}).")
    for key, text in fields.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", key):
            raise ValueError(f"{key!r} is not a config key (lowercase letters, digits and _).")
        value = parse_value(text)
        if value is not None:
            values[key] = value
    if form.get("action") == "predict":  # LLaMA Board's Evaluate & Predict: the datasets become eval_dataset
        values.update(do_train=False, do_predict=True, predict_with_generate=True)
        values.setdefault("eval_dataset", values.pop("dataset", None))
        values.pop("plot_loss", None)
    elif form.get("action", "train") != "train":
        raise ValueError(f"action: expected train or predict, got {form.get('action')!r}.")
    if values.get("stage") not in STAGES:
        raise ValueError(f"stage: expected one of {', '.join(STAGES)}, got {values.get('stage')!r}.")
    for key in ("model_name_or_path", "output_dir", "eval_dataset" if form.get("action") == "predict" else "dataset"):
        if not values.get(key):
            raise ValueError(f"{key} is required.")
    if values.get("trust_remote_code") and not form.get("confirm_remote_code"):
        raise ValueError("trust_remote_code runs Python code from the model folder: confirm it in the form to go on.")
    # lathe train imports reward modules from the config's folder, then its working directory (the root)
    values = check_config_paths(root, values, search_dirs=(inside(root, CONFIG_FOLDER), root))
    _check_datasets(root, values)
    return values


def _check_datasets(root: str, values: dict) -> None:
    """The files the chosen datasets name in dataset_info.json stay under the root too."""
    dataset_dir = values.get("dataset_dir") or inside(root, "data", "dataset_dir")
    path = os.path.join(dataset_dir, "dataset_info.json")
    if not os.path.isfile(path):
        return  # lathe train says which dataset it cannot find
    with open(path, encoding="utf-8") as f:
        try:
            info = json.load(f)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError(f"{path}: not a JSON object of datasets.") from None
    names = [
        name.strip()
        for key in ("dataset", "eval_dataset")
        for name in (values.get(key) if isinstance(values.get(key), list) else str(values.get(key) or "").split(","))
        if isinstance(name, str) and name.strip()
    ]
    check_dataset_files(root, dataset_dir, info, names, where=path)


def _extra_keys(text) -> dict:
    """The "all keys" editor: YAML `key: value` lines (a mapping), read with safe_load."""
    import yaml

    if not text or not str(text).strip():
        return {}
    try:
        mapping = yaml.safe_load(str(text))
    except yaml.YAMLError as error:
        raise ValueError(f"all keys: not YAML ({str(error).splitlines()[0]}).") from None
    if not isinstance(mapping, dict):
        raise ValueError("all keys: expected `key: value` lines.")
    return mapping


def config_yaml(values: dict) -> str:
    import yaml

    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True)


def run_name(root: str, values: dict) -> str:
    """The run's name: its output_dir relative to the root."""
    from lathe.llm.webui.paths import relative

    return relative(root, values["output_dir"])


def save_config(root: str, values: dict) -> str:
    """Write the YAML under root/configs/, named after the output folder; its path."""
    name = run_name(root, values).replace("/", "_")
    if not NAME.match(name):
        raise ValueError(f"output_dir {values['output_dir']!r} gives no usable config name.")
    folder = inside(root, CONFIG_FOLDER)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(config_yaml(values))
    return path


def list_datasets(root: str, dataset_dir: str) -> dict:
    """dataset_info.json's entries under root/dataset_dir: name -> its description."""
    path = os.path.join(inside(root, dataset_dir or "data", "dataset_dir"), "dataset_info.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no dataset_info.json in {dataset_dir!r}.")
    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    if not isinstance(info, dict):
        raise ValueError(f"{dataset_dir}/dataset_info.json: expected an object of datasets.")
    return info


def suggest_template(root: str, model: str) -> list[str]:
    """Templates whose rendering the tokenizer's own chat_template reproduces (lathe/llm/templates/check.py)."""
    from transformers import AutoTokenizer

    from lathe.llm.templates.check import matching_templates

    where = checked_model(root, model)
    if not os.path.isdir(where):
        raise PathError(f"model_name_or_path: {model!r} is not a folder under the root (hub ids: type the template).")
    tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    if not getattr(tokenizer, "chat_template", None):
        return []
    return matching_templates(tokenizer)


def list_models(root: str) -> list[str]:
    """Folders under root (two levels) holding a config.json: model folders and adapters."""
    from lathe.llm.webui.paths import relative

    found = []
    real = os.path.realpath(root)
    for folder, subfolders, files in os.walk(real):
        depth = folder[len(real) :].count(os.sep)
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and depth < 3]
        if "config.json" in files or "adapter_config.json" in files:
            found.append(relative(root, folder))
    return sorted(found)[:500]
