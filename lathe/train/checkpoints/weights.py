"""Model weights in and out of a folder: safetensors for any module (shared tensors saved once),
save_pretrained / from the files for transformers and PEFT models (sharded with an index when large)."""

from __future__ import annotations

import json
import os

from lathe.train.checkpoints.layout import ADAPTER_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, CheckpointFileError


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
    from safetensors.torch import load_model

    if hasattr(model, "load_saved_weights"):
        model.load_saved_weights(folder)
        return
    adapter = os.path.join(folder, ADAPTER_WEIGHTS_NAME)
    if os.path.isfile(adapter) and hasattr(model, "load_adapter"):
        from peft import get_peft_model_state_dict, set_peft_model_state_dict  # only PEFT models have adapter files

        weights = _read_safetensors(adapter)
        check_shapes(get_peft_model_state_dict(model), _shapes(weights), adapter)  # keys as the adapter file names them
        set_peft_model_state_dict(model, weights)
        return
    single = os.path.join(folder, WEIGHTS_NAME)
    if os.path.isfile(single) and not hasattr(model, "save_pretrained"):
        if not _loads_its_own_way(model):  # an override (e.g. resizing a growing buffer) decides about shapes
            check_shapes(model.state_dict(), _safetensors_shapes(single), single)
        load_model(model, single, strict=strict)
        return
    # transformers drops tied weights from the file; load non-strictly and let tying restore them.
    weights = read_model_weights(folder)
    source = single if os.path.isfile(single) else os.path.join(folder, WEIGHTS_INDEX_NAME)
    check_shapes(model.state_dict(), _shapes(weights), source)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    check_missing(model, missing, unexpected, folder, strict)


def check_shapes(expected: dict, found: dict, source: str) -> None:
    """One clear error, naming `source` and every tensor whose shape in `found` (name -> shape)
    differs from the model's tensor in `expected` (a checkpoint of another model size, or a LoRA
    adapter of another rank), instead of torch's size-mismatch traceback."""
    different = [
        (name, found[name], tuple(tensor.shape))
        for name, tensor in expected.items()
        if name in found and found[name] != tuple(tensor.shape)
    ]
    if not different:
        return
    listed = "; ".join(
        f"{name}: {list(saved)} in the file, {list(model)} in the model" for name, saved, model in different[:8]
    )
    more = f"; and {len(different) - 8} more" if len(different) > 8 else ""
    raise CheckpointFileError(
        f"The weights in {source!r} do not fit the model: {len(different)} tensor(s) have other shapes ({listed}{more}). "
        "Is it a checkpoint of another model configuration, or a LoRA adapter of another rank?"
    )


def _shapes(weights: dict) -> dict:
    return {name: tuple(tensor.shape) for name, tensor in weights.items()}


def _safetensors_shapes(path: str) -> dict:
    """Tensor shapes from the file's header, without reading the data."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointFileError(
            f"{path!r} is not a readable safetensors file ({error}); the checkpoint is corrupt."
        ) from None


def _read_safetensors(path: str) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointFileError(
            f"{path!r} is not a readable safetensors file ({error}); the checkpoint is corrupt."
        ) from None


def _loads_its_own_way(model) -> bool:
    """Whether the model's class overrides load_state_dict (transformers hands it the file's tensors as they are)."""
    import torch

    return type(model).load_state_dict is not torch.nn.Module.load_state_dict


def read_model_weights(folder: str) -> dict:
    """The state dict in `folder`'s model.safetensors, or in the shards its index lists."""
    single = os.path.join(folder, WEIGHTS_NAME)
    index = os.path.join(folder, WEIGHTS_INDEX_NAME)
    if os.path.isfile(single):
        return _read_safetensors(single)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointFileError(
                f"{index!r} is not a safetensors index ({error!r}); the checkpoint is corrupt."
            ) from None
        state = {}
        for shard in shards:
            state.update(_read_safetensors(os.path.join(folder, shard)))
        return state
    raise FileNotFoundError(f"No model weights ({WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}) in {folder!r}.")


def check_missing(model, missing, unexpected, folder, strict):
    """Missing keys other than tied weights (transformers drops those from its files) are an error."""
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if isinstance(getattr(model, "_tied_weights_keys", None), dict):
        tied = set(model._tied_weights_keys)
    missing = [k for k in missing if k not in tied]
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"Weights in {folder!r} do not match the model: missing {missing[:10]}, unexpected {list(unexpected)[:10]}."
        )
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def load_sharded_checkpoint(model, folder: str, strict: bool = True, prefer_safe: bool = True):
    """transformers.trainer_utils.load_sharded_checkpoint: load the shards an index lists into `model`, one
    shard in memory at a time; with `strict`, keys that differ are an error before anything loads. Shards
    are safetensors or, from pytorch_model.bin.index.json, torch files read with weights_only=True. Returns
    (missing_keys, unexpected_keys) as load_state_dict does."""
    import torch

    from lathe.train.checkpoints import loading

    indexes = {
        True: os.path.join(folder, WEIGHTS_INDEX_NAME),
        False: os.path.join(folder, "pytorch_model.bin.index.json"),
    }
    present = {safe: os.path.isfile(path) for safe, path in indexes.items()}
    if not any(present.values()):
        raise ValueError(
            f"Can't find a checkpoint index ({WEIGHTS_INDEX_NAME} or pytorch_model.bin.index.json) in {folder}."
        )
    safe = present[True] and (prefer_safe or not present[False])
    with open(indexes[safe], encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    model_keys = model.state_dict().keys()
    missing = [key for key in model_keys if key not in weight_map]
    unexpected = [key for key in weight_map if key not in model_keys]
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(model).__name__}: missing keys {missing}, unexpected keys "
            f"{unexpected} (index {indexes[safe]!r})."
        )
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(folder, shard)
        model.load_state_dict(
            _read_safetensors(path) if safe else loading.safe_torch_load(path, map_location="cpu"), strict=False
        )
    return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)
