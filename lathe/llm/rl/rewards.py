"""Reward functions of GRPO: resolved from callables, `module:function` names or reward-model folders, and
called with TRL's convention `f(prompts=, completions=, completion_ids=, **columns) -> list[float | None]`
(every other dataset column but lathe's prompt_ids as a keyword argument, one value per completion; None means
"not applicable").
A reward model scores prompt + completion and its first logit is the reward."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import torch


class RewardFunctionError(ValueError):
    """A reward function raised or returned the wrong number of rewards: names it and the dataset row (a
    ValueError, so that `lathe train` stops with this one line; --traceback shows the function's own)."""


def resolve_reward_function(spec, search_dirs=()):
    """A callable or nn.Module for `spec`: itself when callable; `module:function` imported from
    `search_dirs` first (e.g. the config file's folder), then the working directory, then sys.path; a
    folder holding a sequence-classification model, or a `stage: rm` output (value_head.safetensors beside the
    causal LM or its adapter: lathe.llm.rl.reward_models)."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward_funcs: expected a callable, 'module:function' or a model folder; got {spec!r}.")
    if os.path.isdir(spec):
        from lathe.llm.rl.reward_models import is_value_head_folder, load_value_head_reward

        if is_value_head_folder(spec):  # stage rm's output: a causal LM and its value head
            return load_value_head_reward(spec)
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(spec, num_labels=1)
        model.eval().requires_grad_(False)
        return model
    if ":" not in spec:
        raise ValueError(
            f"reward_funcs: {spec!r} is neither a folder nor 'module:function' (e.g. 'rewards:exact_match')."
        )
    module_name, _, function_name = spec.partition(":")
    module = _import_module(module_name, [*search_dirs, os.getcwd()])
    function = getattr(module, function_name, None)
    if function is None or not callable(function):
        raise ValueError(
            f"reward_funcs: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function "
            f"{function_name!r}."
        )
    return function


def _import_module(name: str, search_dirs: list):
    relative = Path(*name.split(".")).with_suffix(".py")
    for folder in search_dirs:
        path = Path(folder) / relative
        if path.is_file():
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name and not name.startswith(f"{error.name}."):
            raise  # the module exists but an import inside it failed: show that error
        places = ", ".join(str(folder) for folder in search_dirs)
        raise ValueError(f"reward_funcs: no module {name!r} in {places} or on sys.path.") from None


def reward_function_name(function) -> str:
    """TRL's names: a model's folder name, a function's __name__, a partial's function name."""
    if isinstance(function, torch.nn.Module):
        if getattr(function, "reward_name", None):
            return function.reward_name
        return str(getattr(function.config, "_name_or_path", "") or type(function).__name__).rstrip("/").split("/")[-1]
    inner = getattr(function, "func", function)
    return getattr(inner, "__name__", type(inner).__name__)


def compute_rewards(
    functions, names, tokenizers, inputs, prompts, completions, completion_ids, extras, row_ids=None, token_ids=None
):
    """(completions, functions) rewards, NaN where a function returned None. token_ids: (prompt ids, pad id),
    for stage rm's reward models, which score the sampled tokens."""
    rewards = torch.zeros(len(prompts), len(functions))
    columns = {
        key: [row[key] for row in inputs]
        for key in inputs[0]
        if key not in ("prompt", "prompt_ids", "completion", "completion_ids")
    }
    columns.update(extras)
    for index, (function, name, tokenizer) in enumerate(zip(functions, names, tokenizers)):
        if getattr(function, "scores_token_ids", False):
            from lathe.llm.rl.reward_models import score_token_ids

            rewards[:, index] = score_token_ids(function, token_ids[0], completion_ids, token_ids[1])
            continue
        if isinstance(function, torch.nn.Module):
            rewards[:, index] = _score_with_model(function, tokenizer, prompts, completions)
            continue
        try:
            values = function(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        except Exception as error:
            row = _failing_row(function, prompts, completions, completion_ids, columns, row_ids)
            raise RewardFunctionError(
                f"reward function {name!r} raised {type(error).__name__}: {error}{row}"
            ) from error
        rewards[:, index] = torch.tensor(checked_rewards(name, values, len(prompts)), dtype=torch.float32)
    return rewards


def checked_rewards(name: str, values, count: int) -> list[float]:
    """A reward function's answer as `count` floats (NaN for None), or RewardFunctionError naming the function,
    what is expected (a list[float] of the batch's length) and what came back."""
    expected = (
        f"reward function {name!r} must return a list[float] of {count} rewards (one per completion, None to skip)"
    )
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise RewardFunctionError(f"{expected}; it returned {type(values).__name__} {_short(values)}.")
    values = list(values.flatten() if isinstance(values, torch.Tensor) else values)
    if len(values) != count:
        raise RewardFunctionError(f"{expected}; it returned {len(values)} values: {_short(values)}.")
    floats = []
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if value is not None and (isinstance(value, (str, bytes)) or not hasattr(value, "__float__")):
            raise RewardFunctionError(
                f"{expected}; item {position} is {type(value).__name__} {_short(value)} (in {_short(values)})."
            )
        floats.append(float("nan") if value is None else float(value))
    return floats


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _failing_row(function, prompts, completions, completion_ids, columns, row_ids) -> str:
    """Where the batch call failed, the first completion that fails alone (its dataset row and prompt)."""
    for position in range(len(prompts)):
        one = {key: [value[position]] for key, value in columns.items() if isinstance(value, list)}
        one.update({key: value for key, value in columns.items() if not isinstance(value, list)})
        try:
            function(
                prompts=[prompts[position]],
                completions=[completions[position]],
                completion_ids=[completion_ids[position]],
                **one,
            )
        except Exception:
            row = f" (dataset row {row_ids[position]})" if row_ids is not None else ""
            return f"; first failing completion{row}: prompt {prompts[position]!r}"
    return ""


def _score_with_model(model, tokenizer, prompts, completions) -> torch.Tensor:
    if isinstance(prompts[0], list):  # conversations: the reward model's own chat template
        texts = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
    else:
        texts = [p + c for p, c in zip(prompts, completions)]
    encoded = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(**{key: value.to(device) for key, value in encoded.items()}).logits
    return logits[:, 0].float().cpu()
