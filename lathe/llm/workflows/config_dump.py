"""The configuration `lathe train` prints first: the keys the user set, as written, then only what lathe
resolved differently from LLaMA-Factory's defaults (never transformers' own resolved noise such as
accelerator_config, `debug: []` or `report_to: []`)."""

from __future__ import annotations

import dataclasses

__all__ = ["format_config"]


def _changed(instance) -> dict:
    changed = {}
    for field in dataclasses.fields(instance):
        if not field.init or field.name.startswith("_"):
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(instance, field.name)
        plain = getattr(value, "value", value)
        if plain == default or (isinstance(default, str) and [default] == plain):
            continue
        if default is None and plain in (False, [], "") and name_is_training(instance):
            continue  # TrainingArguments resolving an unset option to its off value
        changed[field.name] = "<hidden>" if field.name.endswith("hub_token") else plain  # never print a secret
    return changed


def name_is_training(instance) -> bool:
    return hasattr(instance, "to_json_string")


# Values LLaMA-Factory resolves the same way when they are not set (derived from other keys, or its own
# defaults over transformers'), and lathe's own keys at their default: not news in the dump.
PEER_RESOLVED = {
    "accelerator_config", "activation_checkpointing", "activation_checkpointing_kwargs", "chunked_cross_entropy",
    "debug", "generation_max_length", "gradient_checkpointing", "gradient_checkpointing_kwargs", "label_names",
    "lora_alpha", "media_dir", "packing", "remove_unused_columns", "report_to",
}  # fmt: skip


# A field lathe fills from another key the user wrote (transformers 5 reads a warmup_ratio as warmup_steps < 1).
CONVERTED_FROM = {"warmup_steps": "warmup_ratio"}


def _shown(key: str, value) -> str:
    return "<hidden>" if key.endswith("hub_token") else value  # never print a secret


def format_config(config) -> str:
    """The configuration as the user wrote it (file and command line, per section, each value as written:
    warmup_ratio stays warmup_ratio), then what lathe resolved differently from LLaMA-Factory's defaults."""
    given = dict(config.given)
    lines = ["Configuration (the keys you set, as written):"]
    sections = ("model", "data", "finetuning", "training", "generating")
    placed = set()
    for name in sections:
        fields = {field.name for field in dataclasses.fields(getattr(config, name))}
        keys = [key for key in given if key in fields and key not in placed]
        placed.update(keys)
        if keys:
            lines.append(f"  {name}:")
            lines += [f"    {key}: {_shown(key, given[key])}" for key in keys]
    rest = [key for key in given if key not in placed]
    if rest:
        lines.append("  run:")
        lines += [f"    {key}: {_shown(key, given[key])}" for key in rest]
    resolved = []
    for name in sections:
        changed = _changed(getattr(config, name))
        resolved += [
            f"    {key}: {changed[key]}"
            for key in sorted(changed)
            if key not in given and key not in PEER_RESOLVED and CONVERTED_FROM.get(key) not in given
        ]
    if resolved:
        lines.append("  resolved by lathe (not set, and not LLaMA-Factory's default):")
        lines += resolved
    return "\n".join(lines)
