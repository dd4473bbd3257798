"""The Qwen2.5-Omni / Qwen3-Omni family (qwen2_omni template; qwen3_omni, qwen3_omni_nothink) as LLaMA-Factory 0.9.5's
Qwen2OmniPlugin encodes images and audio:

- an image as Qwen2-VL's (the same preparation and grid) between the template's vision bos / eos tokens;
- an audio through the Whisper feature extractor (padded to its full window), its `<audio>` becoming audio bos,
  one audio token per encoder output frame, audio eos. The frame count is Qwen2.5-Omni's (the mel frames halved
  by the stride-2 convolution, then by the pooling) unless the processor is a Qwen3OmniMoeProcessor: there each
  full 100-frame window makes 13 tokens and the rest goes through three stride-2 steps (LLaMA-Factory decides by
  the processor's class name, and so does lathe);
- the collator adds pixel_values, image_grid_thw, input_features, feature_attention_mask and the model's 3-D
  rotary positions (the thinker's get_rope_index with the audio lengths; rope_deltas less each row's padding).

The two templates name different tokens (LLaMA-Factory registers both under "qwen2_omni"; lathe's qwen3_omni
templates name the "qwen3_omni" family, which differs only in them). Videos, and use_audio_in_video (a video's
own audio interleaved with its frames), are not implemented here: such a row or key stops with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from lathe.llm.multimodal.base import PLACEHOLDERS, Composite
from lathe.llm.multimodal.common import audio_processor_inputs, media_cut_reason, media_token_counts
from lathe.llm.multimodal.images import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER
from lathe.llm.multimodal.qwen2_vl import LORA_CONFLICT_KEYS, QWEN3_VL, Qwen2VLPlugin, rope_index_function

QWEN3_PROCESSOR = "Qwen3OmniMoeProcessor"  # LLaMA-Factory counts Qwen3-Omni's audio tokens by this class name
SILENCE_SAMPLES = 1600  # LLaMA-Factory's stand-in audio: 1600 samples of silence
QWEN2_5_OMNI = Composite(
    ("visual.patch_embed", "visual.blocks", "audio_tower"),
    ("visual.merger", "audio_tower.proj"),
    ("model", "lm_head"),
    LORA_CONFLICT_KEYS,
)
QWEN3_OMNI = Composite(
    (*QWEN3_VL.vision_keys, "audio_tower"), QWEN2_5_OMNI.projector_keys, ("model", "lm_head"), LORA_CONFLICT_KEYS
)


def audio_token_counts(feature_lengths, qwen3: bool) -> list[int]:
    """Encoder output frames for each audio's mel frame count (LLaMA-Factory's arithmetic for the two models)."""
    counts = []
    for frames in (int(length) for length in feature_lengths):
        if qwen3:
            rest = (frames % 100 - 1) // 2 + 1
            counts.append(((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // 100) * 13)
        else:
            counts.append(((frames - 1) // 2 + 1 - 2) // 2 + 1)
    return counts


@dataclass
class Qwen2OmniPlugin(Qwen2VLPlugin):
    """LLaMA-Factory's Qwen2OmniPlugin for images and audio, with the qwen2_omni template's tokens."""

    name = "qwen2_omni"
    kinds = ("image", "audio")
    missing = {"video": "the Omni models' video tokens (and use_audio_in_video) are not implemented in lathe yet"}
    composites = {"qwen2_5_omni_thinker": QWEN2_5_OMNI, "qwen3_omni_moe_thinker": QWEN3_OMNI}
    tokens = {
        "image": "<|IMAGE|>",
        "audio": "<|AUDIO|>",
        "vision_bos": "<|vision_bos|>",
        "vision_eos": "<|vision_eos|>",
        "audio_bos": "<|audio_bos|>",
        "audio_eos": "<|audio_eos|>",
    }

    def regularize(self, kind: str, items: list, where: str = "") -> list:
        if kind != "audio":
            return super().regularize(kind, items, where)
        from lathe.llm.multimodal.audio import waveform

        try:
            return [waveform(item, self.settings.audio_sampling_rate) for item in items]
        except (OSError, ValueError) as error:
            raise ValueError(f"{where}: {error}") from None

    def _audio_counts(self, audios: list) -> list[int]:
        if not audios:
            return []
        mask = audio_processor_inputs(audios, self.processor, self.settings)["feature_attention_mask"]
        return audio_token_counts(mask.sum(-1).tolist(), type(self.processor).__name__ == QWEN3_PROCESSOR)

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        """Each `<image>` and `<audio>` replaced by its run of tokens, in order over all messages."""
        t = self.tokens
        grid, merge_length = self._grid(media), self.image_processor.merge_size**2
        runs = {
            IMAGE_PLACEHOLDER: [
                f"{t['vision_bos']}{t['image'] * (int(g.prod()) // merge_length)}{t['vision_eos']}" for g in grid
            ],
            AUDIO_PLACEHOLDER: [
                f"{t['audio_bos']}{t['audio'] * count}{t['audio_eos']}"
                for count in self._audio_counts(media.get("audio") or [])
            ],
        }
        expanded = []
        used = dict.fromkeys(runs, 0)
        for message in messages:
            content = message["content"]
            for placeholder, texts in runs.items():
                parts = content.split(placeholder)
                if len(parts) - 1 + used[placeholder] > len(texts):
                    raise ValueError(f"more {placeholder} placeholders than media ({len(texts)})")
                content = parts[0]
                for part in parts[1:]:
                    content += texts[used[placeholder]] + part
                    used[placeholder] += 1
            expanded.append({**message, "content": content})
        return expanded

    def cut_reason(self, input_ids: list[int], media: dict) -> str | None:
        placeholders = "".join(PLACEHOLDERS[kind] * len(items) for kind, items in media.items())
        if not placeholders:
            return None
        expanded = self.process_messages([{"role": "user", "content": placeholders}], media)
        tokens = (self.tokens["image"], self.tokens["vision_eos"], self.tokens["audio"], self.tokens["audio_eos"])
        return media_cut_reason(input_ids, media_token_counts(expanded, tokens), self.tokenizer)

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids=None) -> dict:
        """pixel_values / image_grid_thw, input_features / feature_attention_mask, and position_ids (the text row,
        then mrope's three) and rope_deltas from the thinker's get_rope_index, as LLaMA-Factory's collator makes them."""
        import torch

        images = [image for row in media_rows for image in row.get("image") or []]
        audios = [audio for row in media_rows for audio in row.get("audio") or []]
        inputs = dict(self.image_processor(images, return_tensors="pt")) if images else {}
        inputs.update(audio_processor_inputs(audios, self.processor, self.settings))
        self._check_tokens(batch["input_ids"], inputs.get("image_grid_thw"), self.tokens["image"], "image")
        positions, rope_deltas = self._rope_positions(model, batch, inputs)
        inputs["position_ids"] = torch.cat([positions[:1], positions], dim=0)
        inputs["rope_deltas"] = rope_deltas
        return inputs

    def _rope_positions(self, model, batch: dict, inputs: dict):
        import torch

        input_ids, mask = batch["input_ids"], (batch["attention_mask"] >= 1).float()
        if mask.sum() == 0:
            length = input_ids.shape[-1]
            positions = torch.arange(length).view(1, 1, length).expand(3, *input_ids.shape).contiguous()
            return positions, torch.zeros(input_ids.shape[0])
        get_rope_index = rope_index_function(model)
        if get_rope_index is None:
            raise ValueError(f"{type(model).__name__} has no get_rope_index: it is not a Qwen Omni thinker model")
        audio_mask = inputs.get("feature_attention_mask")
        positions, rope_deltas = get_rope_index(
            input_ids=input_ids,
            image_grid_thw=inputs.get("image_grid_thw"),
            video_grid_thw=None,
            attention_mask=mask,
            use_audio_in_video=False,
            audio_seqlens=None if audio_mask is None else audio_mask.sum(dim=1),
        )
        # the thinker's deltas count each row's padding; LLaMA-Factory takes it off
        return positions, rope_deltas - (1 - mask).sum(dim=-1).unsqueeze(-1)

    def stand_in(self) -> dict:
        import numpy as np

        return {**super().stand_in(), "audio": [np.zeros(SILENCE_SAMPLES)]}


@dataclass
class Qwen3OmniPlugin(Qwen2OmniPlugin):
    """The qwen3_omni templates' tokens (LLaMA-Factory's Qwen2OmniPlugin with image_token <|image_pad|>, ...)."""

    name = "qwen3_omni"
    tokens = {
        "image": "<|image_pad|>",
        "audio": "<|audio_pad|>",
        "vision_bos": "<|vision_start|>",
        "vision_eos": "<|vision_end|>",
        "audio_bos": "<|audio_start|>",
        "audio_eos": "<|audio_end|>",
    }
