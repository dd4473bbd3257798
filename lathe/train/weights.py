"""Model weights in and out of a folder: safetensors for any module (shared tensors saved once),
save_pretrained / from the files for transformers and PEFT models (sharded with an index when large)."""
from __future__ import annotations

import json
import os

from lathe.train.checkpoint import ADAPTER_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME


def save_model_weights(model, folder: str, state_dict=None) -> None:
    """transformers/peft models: save_pretrained (safetensors, sharded with an index when large);
    any other module: model.safetensors (shared tensors saved once)."""
    os.makedirs(folder, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, state_dict=state_dict)
        return
    from safetensors.torch import save_model

    # save_model drops all but one name of tensors that share memory (tied weights); it only asks
    # its argument for state_dict(), so a given state dict goes through the same rules.
    source = model if state_dict is None else _StateDictSource(state_dict)
    save_model(source, os.path.join(folder, WEIGHTS_NAME), metadata={"format": "pt"})


class _StateDictSource:
    def __init__(self, state_dict: dict):
        self._state_dict = state_dict

    def state_dict(self) -> dict:
        return dict(self._state_dict)  # save_model deletes the duplicate names from what it gets


def load_model_weights(model, folder: str, strict: bool = True) -> None:
    """Load weights saved by save_model_weights (or by transformers) into `model` in place. A model whose
    save_pretrained splits its state over several files (a reward model's value head beside the language
    model) reads them back with its own `load_saved_weights(folder)`."""
    from safetensors.torch import load_file, load_model

    if hasattr(model, "load_saved_weights"):
        model.load_saved_weights(folder)
        return
    adapter = os.path.join(folder, ADAPTER_WEIGHTS_NAME)
    if os.path.isfile(adapter) and hasattr(model, "load_adapter"):
        from peft import set_peft_model_state_dict  # only PEFT models have adapter files

        set_peft_model_state_dict(model, load_file(adapter))
        return
    single = os.path.join(folder, WEIGHTS_NAME)
    if os.path.isfile(single) and not hasattr(model, "save_pretrained"):
        load_model(model, single, strict=strict)
        return
    # transformers drops tied weights from the file; load non-strictly and let tying restore them.
    missing, unexpected = model.load_state_dict(read_model_weights(folder), strict=False)
    check_missing(model, missing, unexpected, folder, strict)


def read_model_weights(folder: str) -> dict:
    """The state dict in `folder`'s model.safetensors, or in the shards its index lists."""
    from safetensors.torch import load_file

    single = os.path.join(folder, WEIGHTS_NAME)
    index = os.path.join(folder, WEIGHTS_INDEX_NAME)
    if os.path.isfile(single):
        return load_file(single)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for shard in shards:
            state.update(load_file(os.path.join(folder, shard)))
        return state
    raise FileNotFoundError(f"No model weights ({WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}) in {folder!r}.")


def check_missing(model, missing, unexpected, folder, strict):
    """Missing keys other than tied weights (transformers drops those from its files) are an error."""
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if isinstance(getattr(model, "_tied_weights_keys", None), dict):
        tied = set(model._tied_weights_keys)
    missing = [k for k in missing if k not in tied]
    if strict and (missing or unexpected):
        raise RuntimeError(f"Weights in {folder!r} do not match the model: missing {missing[:10]}, unexpected {list(unexpected)[:10]}.")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
