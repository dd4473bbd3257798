"""Every TRL 1.16 GRPOConfig / RLOOConfig key (the list bench/trl_config_fields.py wrote from TRL; no TRL needed
here) is implemented by lathe with TRL's default, or refused with an error naming it: in a `lathe train` config
(stage grpo / rloo) and in the library's GRPOConfig / RLOOConfig."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lathe.llm.config import parse_train_config

TABLE = json.loads((Path(__file__).resolve().parent / "golden" / "trl_config_fields.json").read_text())
# TRL keys a `lathe train` config spells as another section's key (LLaMA-Factory's name), or reads elsewhere.
ELSEWHERE = {"trust_remote_code": "model", "disable_dropout": "finetuning"}


def other_value(default):
    """A value unlike TRL's default, of the same kind."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 3
    return "something-else" if default is None or isinstance(default, str) else None


def stage_config(tmp_path, stage: str, **keys):
    values = {
        "model_name_or_path": str(tmp_path),
        "stage": stage,
        "dataset": "rows",
        "output_dir": str(tmp_path / "out"),
        "reward_funcs": "r:f",
        "per_device_train_batch_size": 8,
        **keys,
    }
    return parse_train_config(values)


@pytest.mark.parametrize("stage, table", [("grpo", "GRPOConfig"), ("rloo", "RLOOConfig")])
def test_every_trl_key_is_implemented_with_trls_default_or_refused_by_name(tmp_path, stage, table):
    from lathe.llm.config.keys import TRL_GRPO_NOT_IMPLEMENTED
    from lathe.llm.rl import GRPOConfig, RLOOConfig

    library = {f.name: f for f in dataclasses.fields(GRPOConfig if stage == "grpo" else RLOOConfig)}
    config = stage_config(tmp_path, stage)
    implemented, refused = [], []
    for key, default in TABLE[table].items():
        section = getattr(config, ELSEWHERE.get(key, "finetuning"))
        if hasattr(section, key):  # implemented: TRL's default unless set
            value = getattr(section, key)
            assert value == default or (isinstance(default, str) and str(value) == default), (key, value, default)
            implemented.append(key)
        else:
            assert TRL_GRPO_NOT_IMPLEMENTED.get(key, "missing") == default, f"{key}: neither implemented nor refused"
            refused.append(key)
        # The library's config: the key with TRL's default, or a TypeError naming it.
        if key in library:
            assert library[key].default == default, (key, library[key].default, default)
        else:
            with pytest.raises(TypeError, match=key):
                (GRPOConfig if stage == "grpo" else RLOOConfig)(output_dir="unused", **{key: other_value(default)})
    assert "generation_kwargs" in implemented and "use_vllm" in refused
    # TRL's defaults change nothing: accepted. Any other value: one line per key, naming it (all in one error).
    stage_config(tmp_path, stage, **{key: TABLE[table][key] for key in refused})
    with pytest.raises(ValueError) as error:
        stage_config(tmp_path, stage, **{key: other_value(TABLE[table][key]) for key in refused})
    lines = str(error.value).splitlines()
    for key in refused:
        assert any(line.startswith(f"{key} ") and "TRL GRPOConfig key" in line for line in lines), key
