"""Seq2SeqTrainer: evaluation and prediction that generate text (predict_with_generate), with
generation settings from Seq2SeqTrainingArguments or per call."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

from lathe.train.trainer import Trainer


class Seq2SeqTrainer(Trainer):
    """Trainer whose evaluate()/predict() accept generation kwargs (max_length, num_beams, ...)
    and, with args.predict_with_generate, return generated token ids as predictions."""

    # transformers' Seq2SeqTrainer gathers evaluation results with accelerate's gather, not
    # gather_for_metrics: a short last batch's loss is counted eval_batch_size times in eval_loss.
    _trims_last_eval_batch = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self.args, "generation_config", None) is not None:  # Seq2SeqTrainingArguments.generation_config
            self.model.generation_config = self.load_generation_config(self.args.generation_config)

    @staticmethod
    def load_generation_config(gen_config_arg):
        """A GenerationConfig from Seq2SeqTrainingArguments.generation_config: a GenerationConfig (copied), or a
        generation_config.json file or the folder holding one; checked strictly, as in transformers."""
        try:
            from transformers import GenerationConfig
        except ImportError as error:
            raise ImportError("generation_config needs transformers: pip install 'lathe[llm]'") from error
        if isinstance(gen_config_arg, GenerationConfig):
            config = copy.deepcopy(gen_config_arg)
        else:
            path = Path(gen_config_arg)
            if path.is_file():
                config = GenerationConfig.from_pretrained(path.parent, path.name)
            elif path.is_dir():
                config = GenerationConfig.from_pretrained(path)
            else:
                raise ValueError(
                    f"generation_config={str(gen_config_arg)!r} is neither a GenerationConfig, a file nor a folder; "
                    "lathe works offline and does not download it from the Hub."
                )
        try:
            config.validate(strict=True)
        except ValueError as error:
            raise ValueError(str(error) + "\n\nFix these issues to train your model.") from error
        return config

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs):
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test", **gen_kwargs):
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def _generation_kwargs(self, gen_kwargs: dict) -> dict:
        gen_kwargs = dict(gen_kwargs)
        if gen_kwargs.get("max_length") is None and gen_kwargs.get("max_new_tokens") is None:
            gen_kwargs["max_length"] = getattr(self.args, "generation_max_length", None)
        if gen_kwargs.get("num_beams") is None:
            gen_kwargs["num_beams"] = getattr(self.args, "generation_num_beams", None)
        return {k: v for k, v in gen_kwargs.items() if v is not None}

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None, **gen_kwargs):
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(
                model, inputs, prediction_loss_only=prediction_loss_only, ignore_keys=ignore_keys
            )
        if not hasattr(model, "generate"):
            raise ValueError(
                f"predict_with_generate=True needs a model with generate(); {type(model).__name__} has none."
            )
        has_labels = "labels" in inputs
        inputs = self._prepare_inputs(inputs)
        gen_kwargs = dict(gen_kwargs or getattr(self, "_gen_kwargs", {}))
        for name in ("num_beams", "max_length"):  # as transformers: None leaves them to the generation config
            if name in gen_kwargs and gen_kwargs[name] is None:
                del gen_kwargs[name]
        generation_inputs = dict(inputs)
        generation_inputs.pop("labels", None)
        if (
            "decoder_input_ids" in generation_inputs
            and has_labels
            and inputs["labels"].shape == inputs["decoder_input_ids"].shape
        ):
            # decoder inputs made from the labels (teacher forcing) must not prime generation
            generation_inputs.pop("decoder_input_ids")
            generation_inputs.pop("decoder_attention_mask", None)
        whole_weights = self._whole_weights_for_generation()
        if whole_weights is not None:  # no collectives while decoding, so no lock-step between ranks either
            gen_kwargs = {"synced_gpus": False, **gen_kwargs}
        with torch.no_grad(), whole_weights or contextlib.nullcontext():
            generated = model.generate(**generation_inputs, **gen_kwargs)
        self._fill_generation_defaults()
        generated = self._pad_to_generation_length(generated)
        loss = None
        labels = None
        if has_labels:
            with torch.no_grad():
                loss = self.compute_loss(model, inputs).detach().mean()
            labels = self._pad_to_generation_length(inputs["labels"])
        if self.args.prediction_loss_only:
            return loss, None, None
        return loss, generated, labels

    def _fill_generation_defaults(self) -> None:
        """What transformers' Seq2SeqTrainer does to the model's generation_config after each
        generate(): `_from_model_config` set False and every unset parameter given its default, so
        the generation_config.json saved afterwards (checkpoints, final folder) lists them all."""
        config = getattr(self.model, "generation_config", None)
        if config is None or not hasattr(config, "_get_default_generation_params"):
            return
        if getattr(config, "_from_model_config", False):
            config._from_model_config = False
        config.update(**config._get_default_generation_params(), defaults_only=True)

    def _pad_to_generation_length(self, tensor: torch.Tensor) -> torch.Tensor:
        """Pad to the model's generation_config max_length (or max_new_tokens + 1), as transformers
        pads generations and labels, so every batch concatenates to one width."""
        config = getattr(self.model, "generation_config", None)
        max_length = getattr(config, "max_length", None)
        max_new_tokens = getattr(config, "max_new_tokens", None)
        if max_length is not None and tensor.shape[-1] < max_length:
            return self._pad_tensors_to_max_len(tensor, max_length)
        if max_new_tokens is not None and tensor.shape[-1] < max_new_tokens + 1:
            return self._pad_tensors_to_max_len(tensor, max_new_tokens + 1)
        return tensor

    def _pad_tensors_to_max_len(self, tensor: torch.Tensor, max_length: int) -> torch.Tensor:
        config = getattr(self.model, "config", None)
        pad_id = getattr(self.processing_class, "pad_token_id", None)
        if pad_id is None:
            pad_id = getattr(config, "pad_token_id", None)
        if pad_id is None:
            pad_id = getattr(config, "eos_token_id", None)
        if isinstance(pad_id, (list, tuple)):
            pad_id = pad_id[0]
        if pad_id is None:
            raise ValueError("Padding generated ids needs a pad_token_id (set it on the tokenizer or model.config).")
        padded = tensor.new_full((tensor.shape[0], max_length), pad_id)
        padded[:, : tensor.shape[-1]] = tensor
        return padded

    def _whole_weights_for_generation(self):
        """ZeRO-3 or FSDP2 on several processes: every forward gathers each layer's weights from all ranks, so a
        rank whose generations finished early would leave the others waiting in the gather (transformers'
        synced_gpus lock-step mode, the alternative, fails with a mask size mismatch in transformers 5.23
        once one rank is done). Gather the whole model once for the generate call instead: decoding then
        runs without collectives, at the memory cost of one full copy of the weights per rank. None
        when the weights are whole already."""
        from lathe.train.parallel import distributed

        if distributed.world_size() <= 1:
            return None
        from lathe.train.parallel import fsdp

        if fsdp.is_sharded(self.model):  # the same for FSDP2 (transformers turns synced_gpus on for it)
            return fsdp.whole_weights(self.model, fsdp.settings_from_args(self.args).reshard_after_forward)
        from lathe.train.parallel import deepspeed_zero

        if not deepspeed_zero.partitions_weights(getattr(self, "_zero_engine", None)):
            return None
        return deepspeed_zero.gathered_parameters(self.model)
