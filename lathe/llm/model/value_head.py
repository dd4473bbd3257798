"""The reward model of stage rm: a causal LM with a value head (one linear layer over the last hidden
state, dropout 0.1 before it, as TRL's AutoModelForCausalLMWithValueHead), and its files.

Saved as LLaMA-Factory saves it: the language model as usual (full weights, or the LoRA adapter) and
the head in `value_head.safetensors` beside them, keys `v_head.summary.weight` / `v_head.summary.bias`.
Loading reads the head back from the last adapter folder, or from the model folder.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os

import torch
from torch import nn

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_HEAD_PICKLE = "value_head.bin"  # LLaMA-Factory's non-safetensors name: recognised, never loaded
PREFIX = "pretrained_model."


class ValueHead(nn.Module):
    """hidden state -> dropout -> linear -> one score per position (float32 unless the head is cast)."""

    def __init__(self, hidden_size: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.summary = nn.Linear(hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        output = self.dropout(hidden_states)
        if output.dtype != self.summary.weight.dtype:
            output = output.to(self.summary.weight.dtype)
        return self.summary(output)


class ValueHeadModel(nn.Module):
    """`pretrained_model` (a causal LM or a PEFT model around one) plus `v_head`. forward returns the
    scores, shape (batch, length); the reward of a sequence is the score at its last token."""

    def __init__(self, pretrained_model: nn.Module, dropout: float = 0.1):
        super().__init__()
        self.pretrained_model = pretrained_model
        config = pretrained_model.config
        hidden_size = getattr(config, "word_embed_proj_dim", None) or config.hidden_size
        self.v_head = ValueHead(hidden_size, dropout)  # drawn from the RNG as TRL draws it, after the adapter

    @property
    def config(self):
        return self.pretrained_model.config

    @functools.cached_property
    def _keeps_logits_of_last_position_only(self) -> bool:
        """Whether the causal LM's forward takes transformers' `logits_to_keep` (a PEFT model passes it on)."""
        base = self.pretrained_model
        if hasattr(base, "get_base_model"):
            base = base.get_base_model()
        return "logits_to_keep" in inspect.signature(base.forward).parameters

    def create_or_update_model_card(self, output_dir: str) -> None:
        """PEFT's update of the model card (LoRA): LLaMA-Factory's reward model gets it too (library_name
        peft, PEFT's tags, pipeline_tag), after transformers' card. Without PEFT nothing to add."""
        update = getattr(self.pretrained_model, "create_or_update_model_card", None)
        if update is not None:
            update(output_dir)

    @property
    def supports_gradient_checkpointing(self) -> bool:
        return bool(getattr(self.pretrained_model, "supports_gradient_checkpointing", False))

    @property
    def _no_split_modules(self):  # FSDP's blocks are the language model's
        return getattr(self.pretrained_model, "_no_split_modules", None)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **layer_options) -> None:
        from lathe.train.runtime import enable_gradient_checkpointing

        enable_gradient_checkpointing(
            self.pretrained_model, {**(activation_checkpointing_kwargs or {}), **layer_options}
        )

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs) -> torch.Tensor:
        # labels are not needed (the scores are the output): no language-model loss is computed.
        kwargs.update(output_hidden_states=True, return_dict=True, use_cache=False)
        if self._keeps_logits_of_last_position_only:
            # The scores read the hidden states only: the LM's full-vocabulary logits (TRL's value-head model
            # builds them and drops them; up to 2/3 of an rm step's peak with a large vocabulary) shrink to
            # one position. The hidden states, and so the scores, are the same.
            kwargs.setdefault("logits_to_keep", 1)
        outputs = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        last_hidden_state = outputs.hidden_states[-1]
        if last_hidden_state.device != self.v_head.summary.weight.device:
            last_hidden_state = last_hidden_state.to(self.v_head.summary.weight.device)
        return self.v_head(last_hidden_state).squeeze(-1)

    # ----- files -----

    def save_pretrained(self, save_directory: str, state_dict: dict | None = None, **kwargs) -> None:
        """The language model's files (its save_pretrained: weights or adapter) and value_head.safetensors."""
        from safetensors.torch import save_file

        state_dict = self.state_dict() if state_dict is None else state_dict
        head = {
            name: tensor.detach().cpu().contiguous()
            for name, tensor in state_dict.items()
            if name.startswith("v_head.")
        }
        body = {name[len(PREFIX) :]: tensor for name, tensor in state_dict.items() if name.startswith(PREFIX)}
        os.makedirs(save_directory, exist_ok=True)
        self.pretrained_model.save_pretrained(save_directory, state_dict=body, **kwargs)
        save_file(head, os.path.join(save_directory, VALUE_HEAD_FILE), metadata={"format": "pt"})

    def load_saved_weights(self, folder: str) -> None:
        """Load a folder written by save_pretrained (a checkpoint, when resuming) into this model."""
        from lathe.train.checkpoints.weights import load_model_weights

        load_model_weights(self.pretrained_model, folder)
        if not load_value_head(self, folder):
            raise FileNotFoundError(f"{folder} has no {VALUE_HEAD_FILE}: it was not written for a reward model.")


def load_value_head(model: ValueHeadModel, folder: str) -> bool:
    """Load `folder`/value_head.safetensors into the model's head if the file is there; returns whether it was."""
    from safetensors.torch import load_file

    path = os.path.join(folder, VALUE_HEAD_FILE)
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(folder, VALUE_HEAD_PICKLE)):
            raise ValueError(
                f"{folder} holds the value head as {VALUE_HEAD_PICKLE} (a pickle): lathe loads "
                f"{VALUE_HEAD_FILE} only; convert it with safetensors."
            )
        return False
    weights = load_file(path)
    expected = {"v_head.summary.weight", "v_head.summary.bias"}
    if set(weights) != expected:
        raise ValueError(f"{path} holds {sorted(weights)}; a value head file holds {sorted(expected)}.")
    head = model.v_head.summary
    with torch.no_grad():
        for name, parameter in (("weight", head.weight), ("bias", head.bias)):
            tensor = weights[f"v_head.summary.{name}"]
            if tensor.shape != parameter.shape:
                raise ValueError(
                    f"{path}: v_head.summary.{name} has shape {tuple(tensor.shape)}, the model's "
                    f"head {tuple(parameter.shape)} (another model's value head?)."
                )
            parameter.copy_(tensor.to(parameter.dtype))
    logger.info("Loaded the value head from %s", path)
    return True


def add_value_head(model: nn.Module, model_args) -> ValueHeadModel:
    """Wrap a loaded causal LM; the head is read from the last adapter folder, else from the model folder
    (continuing a reward model), else freshly initialised."""
    wrapped = ValueHeadModel(model)
    from lathe.llm.hub import adapter_folders, model_folder

    folder = (adapter_folders(model_args) or [model_folder(model_args)])[-1]
    load_value_head(wrapped, folder)
    return wrapped
