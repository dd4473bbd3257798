"""A stand-in for Kimi-VL's and Youtu-VL's remote code (processing / modeling files that live in their model
repositories and cannot be had here), written for the tests: copied into a tiny model folder as
`vl_standin.py` and loaded by both lathe and LLaMA-Factory with `trust_remote_code: true` (config.json and
preprocessor_config.json name its classes in `auto_map`).

- Kimi-VL: KimiVLStandInProcessor's image processor is the rule of make_llamafactory_families_standin.py (14-pixel
  patches, sides rounded up to 2 patches, pixel_values one row per patch, image_grid_hws, merge_kernel_size 2x2).
  KimiVLStandInModel has Kimi-VL's module names (vision_tower, multi_modal_projector, language_model: LLaMA-Factory's
  default composite parts, registered for kimi_vl) and forward contract (input_ids with one `<|media_pad|>` per merged
  patch, pixel_values, image_grid_hws, labels: it returns the loss), and a config with vision_config / text_config
  (LLaMA-Factory sets text_config.topk_method and both attention implementations).
- Youtu-VL: YoutuVLStandInProcessor's image processor is transformers' Qwen2VLImageProcessorPil (as
  make_llamafactory_youtu_vl.py). YoutuVLStandInModel takes ONE `<|image_pad|>` per image (LLaMA-Factory's plugin
  does not expand it): the image's merged features are pooled into that position, so the logits stay aligned with
  input_ids; it returns NO loss, the case LLaMA-Factory's patch_youtu_vl_model handles (it computes the shifted
  cross-entropy from the logits).
The language model is MiniCPM-V's stand-in's (no attention: each position sees its embedding and the running mean of
those before it). What the tests compare is how the trainers drive such models, not Kimi-VL's or Youtu-VL's numbers.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel

TILE, PATCH = 28, 14
MODULE = "vl_standin"  # this file's name in the model folder


class KimiVLStandInImageProcessor:
    merge_kernel_size = (2, 2)
    patch_size = PATCH

    def __call__(self, images, return_tensors="pt", **kwargs):
        rows, grids = [], []
        for image in images:
            height, width = 2 * math.ceil(image.height / TILE), 2 * math.ceil(image.width / TILE)
            array = np.asarray(image.convert("RGB").resize((width * PATCH, height * PATCH)), dtype="float32") / 255.0
            pixels = torch.from_numpy(array.copy()).permute(2, 0, 1)
            patches = pixels.reshape(3, height, PATCH, width, PATCH).permute(1, 3, 0, 2, 4).reshape(height * width, -1)
            rows.append(patches)
            grids.append([height, width])
        return {"pixel_values": torch.cat(rows), "image_grid_hws": torch.tensor(grids)}


class _StandInProcessor:
    """A remote-code processor: the image processor and the tokenizer, loaded from and saved to a model folder."""

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoProcessor"):
        """What transformers calls on a remote-code class it loads."""
        cls._auto_class = auto_class

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    def save_pretrained(self, path, **kwargs):
        """preprocessor_config.json naming this class and this code file, as a model folder holds them."""
        os.makedirs(path, exist_ok=True)
        config = {"auto_map": {"AutoProcessor": f"{MODULE}.{type(self).__name__}"}}
        with open(os.path.join(path, "preprocessor_config.json"), "w") as handle:
            json.dump({**config, "processor_class": type(self).__name__}, handle, indent=2)
        if not os.path.exists(os.path.join(path, f"{MODULE}.py")):
            shutil.copyfile(__file__, os.path.join(path, f"{MODULE}.py"))


class KimiVLStandInProcessor(_StandInProcessor):
    def __init__(self, tokenizer=None):
        self.image_processor, self.tokenizer = KimiVLStandInImageProcessor(), tokenizer


class YoutuVLStandInProcessor(_StandInProcessor):
    def __init__(self, tokenizer=None):
        from transformers import Qwen2VLImageProcessorPil

        self.image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 16)
        self.tokenizer = tokenizer


class _TinyLanguageModel(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.mlp = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def logits(self, embeds):
        steps = torch.arange(1, embeds.shape[1] + 1, device=embeds.device).view(1, -1, 1)
        return self.lm_head(torch.tanh(self.mlp(embeds + embeds.cumsum(1) / steps)))


def _shifted_loss(logits, labels):
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


class KimiVLStandInConfig(PretrainedConfig):
    model_type = "kimi_vl"

    def __init__(self, vocab_size=600, hidden_size=16, media_placeholder_token_id=0, **kwargs):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.media_placeholder_token_id = media_placeholder_token_id
        self.vision_config = PretrainedConfig(**_sub_config(kwargs.pop("vision_config", None)))
        self.text_config = PretrainedConfig(**_sub_config(kwargs.pop("text_config", None)))
        PretrainedConfig.__init__(self, **kwargs)


class YoutuVLStandInConfig(PretrainedConfig):
    model_type = "youtu_vl"

    def __init__(self, vocab_size=600, hidden_size=16, image_token_id=0, **kwargs):
        self.vocab_size, self.hidden_size, self.image_token_id = vocab_size, hidden_size, image_token_id
        PretrainedConfig.__init__(self, **kwargs)


def _sub_config(value) -> dict:
    return value.to_dict() if isinstance(value, PretrainedConfig) else dict(value or {})


class _StandInModel(PreTrainedModel, GenerationMixin):
    def _init_weights(self, module):
        """The weights are set from the folder (or by the test): nothing to draw here."""

    def get_input_embeddings(self):
        return self.language_model.embed_tokens

    def set_input_embeddings(self, value):
        self.language_model.embed_tokens = value


class KimiVLStandInModel(_StandInModel):
    """Each image's patches embedded (vision_tower), merged 2x2 (multi_modal_projector) into its `<|media_pad|>` run."""

    config_class = KimiVLStandInConfig

    def __init__(self, config):
        super().__init__(config)
        self.vision_tower = torch.nn.Linear(3 * PATCH * PATCH, config.hidden_size)
        self.multi_modal_projector = torch.nn.Linear(4 * config.hidden_size, config.hidden_size)
        self.language_model = _TinyLanguageModel(config)
        self.post_init()

    def image_features(self, pixel_values, image_grid_hws):
        patches, features, start = self.vision_tower(pixel_values), [], 0
        for height, width in image_grid_hws.tolist():
            grid = patches[start : start + height * width].reshape(height // 2, 2, width // 2, 2, -1)
            features.append(self.multi_modal_projector(grid.permute(0, 2, 1, 3, 4).reshape(height * width // 4, -1)))
            start += height * width
        return torch.cat(features)

    def forward(self, input_ids, attention_mask=None, pixel_values=None, image_grid_hws=None, labels=None, **kwargs):
        from transformers.modeling_outputs import CausalLMOutput

        embeds = self.language_model.embed_tokens(input_ids)
        if pixel_values is not None:
            mask = (input_ids == self.config.media_placeholder_token_id).unsqueeze(-1).expand_as(embeds)
            features = self.image_features(pixel_values.to(embeds.dtype), image_grid_hws)
            embeds = embeds.masked_scatter(mask, features)
        logits = self.language_model.logits(embeds)
        return CausalLMOutput(loss=None if labels is None else _shifted_loss(logits, labels), logits=logits)


class YoutuVLStandInModel(_StandInModel):
    """Each image's patches embedded (vision_model), merged 2x2 (merger) and averaged into its one `<|image_pad|>`."""

    config_class = YoutuVLStandInConfig

    def __init__(self, config):
        super().__init__(config)
        self.vision_model = torch.nn.Linear(3 * 2 * PATCH * PATCH, config.hidden_size)
        self.merger = torch.nn.Linear(4 * config.hidden_size, config.hidden_size)
        self.language_model = _TinyLanguageModel(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None, labels=None, **kwargs):
        """labels are taken and not used: the model returns no loss (LLaMA-Factory patches one in)."""
        from transformers.modeling_outputs import CausalLMOutput

        embeds = self.language_model.embed_tokens(input_ids)
        if pixel_values is not None:
            merged = self.merger(self.vision_model(pixel_values.to(embeds.dtype)).reshape(-1, 4 * embeds.shape[-1]))
            counts = (image_grid_thw.prod(-1) // 4).tolist()
            pooled = torch.stack([part.mean(0) for part in merged.split(counts)])
            mask = (input_ids == self.config.image_token_id).unsqueeze(-1).expand_as(embeds)
            embeds = embeds.masked_scatter(mask, pooled)
        return CausalLMOutput(logits=self.language_model.logits(embeds))
