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

- a video (frames sampled as for Qwen2-VL, through the processor's video processor) between vision bos / eos, with
  video_second_per_grid (temporal patch / sampled fps) for the positions; with use_audio_in_video each `<video>`
  must be followed by its `<audio>` (the video's own sound, a file of the audios column) and the two become one
  run: vision bos, audio bos, then per 2-second chunk (position_id_per_seconds * 2 temporal positions, the
  processor's get_chunked_index) that chunk's video tokens and audio tokens, audio eos, vision eos.
  position_id_per_seconds is 25 unless the processor object itself was given one (`positions_per_second`).

The two templates name different tokens (LLaMA-Factory registers both under "qwen2_omni"; lathe's qwen3_omni
templates name the "qwen3_omni" family, which differs only in them). transformers builds the Omni processors (their
video processor) only with torchvision: a video row without it stops naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lathe.llm.multimodal.base import PLACEHOLDERS, Composite
from lathe.llm.multimodal.common import audio_processor_inputs, media_cut_reason, media_token_counts
from lathe.llm.multimodal.images import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from lathe.llm.multimodal.mrope import packed_rope_positions, rope_index_function, sliced
from lathe.llm.multimodal.qwen2_vl import LORA_CONFLICT_KEYS, Qwen2VLPlugin
from lathe.llm.multimodal.qwen3_vl import QWEN3_VL
from lathe.llm.multimodal.video import check_torchvision

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


def processor_names(processor) -> tuple[str, str]:
    """The processor's class name and, for the parts lathe loads without torchvision (encode.ProcessorParts), the
    folder's processor_class."""
    return type(processor).__name__, getattr(processor, "processor_class", "") or ""


def positions_per_second(processor) -> float:
    """The temporal positions per second LLaMA-Factory 0.9.5 chunks a use_audio_in_video run by:
    `getattr(processor, "position_id_per_seconds", 25)`, where no Omni processor of its transformers (<= 5.6) has
    the attribute. transformers 5.23's processors carry it as a class default (Qwen3OmniMoeProcessor: 13.0, which
    cuts audio chunks at 26 tokens instead of 50), so only a value set on the processor object itself is read."""
    return vars(processor).get("position_id_per_seconds", 25) if hasattr(processor, "__dict__") else 25


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


def _expand(content: str, placeholder: str, runs: dict, used: dict) -> str:
    """content with each `placeholder` replaced by its next run (used: how many of each were taken so far)."""
    parts = content.split(placeholder)
    if len(parts) - 1 + used[placeholder] > len(runs[placeholder]):
        raise ValueError(f"more {placeholder} placeholders than media ({len(runs[placeholder])})")
    content = parts[0]
    for part in parts[1:]:
        content += runs[placeholder][used[placeholder]] + part
        used[placeholder] += 1
    return content


@dataclass
class Qwen2OmniPlugin(Qwen2VLPlugin):
    """LLaMA-Factory's Qwen2OmniPlugin for images and audio, with the qwen2_omni template's tokens."""

    name = "qwen2_omni"
    kinds = ("image", "video", "audio")
    # packed rows: each example's positions alone (its images, videos and audio), where LLaMA-Factory 0.9.5 refuses
    # ("Omni models are not supported for packed sequences for now")
    packs = True
    options = ("use_audio_in_video",)
    composites = {"qwen2_5_omni_thinker": QWEN2_5_OMNI, "qwen3_omni_moe_thinker": QWEN3_OMNI}
    tokens = {
        "image": "<|IMAGE|>",
        "video": "<|VIDEO|>",
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
        return audio_token_counts(mask.sum(-1).tolist(), QWEN3_PROCESSOR in processor_names(self.processor))

    @property
    def omni_video_processor(self):
        processor = getattr(self.processor, "video_processor", None)
        if processor is None:
            check_torchvision("a video row")
            raise ValueError(
                f"the model's processor ({type(self.processor).__name__}) has no video processor: load the model "
                "folder's processor with torchvision installed (video_preprocessor_config.json)"
            )
        return processor

    def video_inputs(self, videos: list) -> dict:
        """pixel_values_videos, video_grid_thw and video_second_per_grid (temporal patch over the sampled fps)."""
        import torch

        if not videos:
            return {}
        inputs = dict(self.omni_video_processor(videos=[video.frames for video in videos], return_tensors="pt"))
        temporal = getattr(self.image_processor, "temporal_patch_size", 2)
        inputs["video_second_per_grid"] = torch.tensor([temporal / video.fps for video in videos])
        return inputs

    def _interleaved(self, video_grid, seconds_per_grid, audio_count: int) -> str:
        """A video and its audio as one run: per chunk of position_id_per_seconds * 2 temporal positions, the
        chunk's video tokens then its audio tokens (LLaMA-Factory's use_audio_in_video layout)."""
        import torch

        t, merge = self.tokens, self.image_processor.merge_size
        per_second = positions_per_second(self.processor)
        audio_index = torch.arange(audio_count)
        frames, height, width = (int(side) for side in video_grid)
        video_index = (
            torch.arange(frames).view(-1, 1, 1).expand(-1, height // merge, width // merge).flatten()
            * seconds_per_grid
            * per_second
        ).long()
        video_chunks = self.processor.get_chunked_index(video_index, per_second * 2)
        audio_chunks = self.processor.get_chunked_index(audio_index, per_second * 2)
        text = t["vision_bos"] + t["audio_bos"]
        for chunk in range(max(len(video_chunks), len(audio_chunks))):
            if chunk < len(video_chunks):
                text += t["video"] * (video_chunks[chunk][1] - video_chunks[chunk][0])
            if chunk < len(audio_chunks):
                text += t["audio"] * (audio_chunks[chunk][1] - audio_chunks[chunk][0])
        return text + t["audio_eos"] + t["vision_eos"]

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        """Each `<image>`, `<audio>` and `<video>` replaced by its run of tokens, in order over all messages; with
        use_audio_in_video a video and the `<audio>` after it become one interleaved run."""
        t, merge_length = self.tokens, self.image_processor.merge_size**2
        images, videos, audios = (media.get(kind) or [] for kind in ("image", "video", "audio"))
        grid, audio_counts = self._grid(media), self._audio_counts(audios)
        video = self.video_inputs(videos)
        video_grid = video.get("video_grid_thw", [])
        runs = {
            IMAGE_PLACEHOLDER: [
                f"{t['vision_bos']}{t['image'] * (int(g.prod()) // merge_length)}{t['vision_eos']}" for g in grid
            ],
            AUDIO_PLACEHOLDER: [f"{t['audio_bos']}{t['audio'] * count}{t['audio_eos']}" for count in audio_counts],
            VIDEO_PLACEHOLDER: [
                f"{t['vision_bos']}{t['video'] * (int(g.prod()) // merge_length)}{t['vision_eos']}" for g in video_grid
            ],
        }
        together = self.settings.use_audio_in_video and audios and videos
        if together and len(videos) != len(audios):
            raise ValueError(
                f"use_audio_in_video: {len(videos)} video(s) but {len(audios)} audio(s): each video needs its audio"
            )
        used, expanded = dict.fromkeys(runs, 0), []
        for message in messages:
            content = _expand(message["content"], IMAGE_PLACEHOLDER, runs, used)
            if together:
                while VIDEO_PLACEHOLDER in content:
                    video_at = content.find(VIDEO_PLACEHOLDER)
                    if content.find(AUDIO_PLACEHOLDER, video_at) == -1:
                        raise ValueError(
                            f"use_audio_in_video: each {VIDEO_PLACEHOLDER} must be followed by an {AUDIO_PLACEHOLDER}"
                        )
                    k = used[VIDEO_PLACEHOLDER]
                    seconds = video["video_second_per_grid"][k]
                    run = self._interleaved(video_grid[k], seconds, audio_counts[used[AUDIO_PLACEHOLDER]])
                    content = content.replace(VIDEO_PLACEHOLDER, run, 1).replace(AUDIO_PLACEHOLDER, "", 1)
                    used[VIDEO_PLACEHOLDER] += 1
                    used[AUDIO_PLACEHOLDER] += 1
            else:
                content = _expand(content, AUDIO_PLACEHOLDER, runs, used)
                content = _expand(content, VIDEO_PLACEHOLDER, runs, used)
            expanded.append({**message, "content": content})
        return expanded

    def cut_reason(self, input_ids: list[int], media: dict) -> str | None:
        # videos before audio: with use_audio_in_video each video takes the audio after it
        placeholders = "".join(PLACEHOLDERS[kind] * len(media.get(kind) or []) for kind in ("image", "video", "audio"))
        if not placeholders:
            return None
        expanded = self.process_messages([{"role": "user", "content": placeholders}], media)
        tokens = tuple(self.tokens[name] for name in ("image", "video", "vision_eos", "audio", "audio_eos"))
        return media_cut_reason(input_ids, media_token_counts(expanded, tokens), self.tokenizer)

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids=None) -> dict:
        """pixel_values / image_grid_thw, input_features / feature_attention_mask, and position_ids (the text row,
        then mrope's three) and rope_deltas from the thinker's get_rope_index, as LLaMA-Factory's collator makes them."""
        import torch

        images, videos, audios = (
            [item for row in media_rows for item in row.get(kind) or []] for kind in ("image", "video", "audio")
        )
        inputs = dict(self.image_processor(images, return_tensors="pt")) if images else {}
        inputs.update(self.video_inputs(videos))
        inputs.update(audio_processor_inputs(audios, self.processor, self.settings))
        self._check_tokens(batch["input_ids"], inputs.get("image_grid_thw"), self.tokens["image"], "image")
        self._check_tokens(batch["input_ids"], inputs.get("video_grid_thw"), self.tokens["video"], "video")
        if "position_ids" in batch:  # packed rows: positions per example, no rope_deltas (as Qwen2-VL's)
            positions = self._packed_positions(model, batch, inputs)
            inputs["position_ids"] = torch.cat([positions[:1], positions], dim=0)
            return inputs
        positions, rope_deltas = self._rope_positions(model, batch, inputs)
        inputs["position_ids"] = torch.cat([positions[:1], positions], dim=0)
        inputs["rope_deltas"] = rope_deltas
        return inputs

    def _packed_positions(self, model, batch: dict, inputs: dict):
        """The thinker's positions of each packed example alone, given its images, videos and audio (taken in order by
        their tokens: an audio's tokens are its encoder frames, wherever use_audio_in_video interleaves them)."""
        import torch

        image, video, audio = self.tokenizer.convert_tokens_to_ids(
            [self.tokens[k] for k in ("image", "video", "audio")]
        )
        queues = self.token_queues(inputs, {image: "image_grid_thw", video: "video_grid_thw"})
        mask = inputs.get("feature_attention_mask")
        qwen3 = QWEN3_PROCESSOR in processor_names(self.processor)
        queues[audio] = [] if mask is None else audio_token_counts(mask.sum(-1).tolist(), qwen3)

        def rope(ids, spans):
            part = {
                "image_grid_thw": sliced(inputs.get("image_grid_thw"), spans[image]),
                "video_grid_thw": sliced(inputs.get("video_grid_thw"), spans[video]),
                "video_second_per_grid": sliced(inputs.get("video_second_per_grid"), spans[video]),
                "feature_attention_mask": sliced(mask, spans[audio]),
            }
            return self._rope_positions(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, part)[0]

        return packed_rope_positions(batch["input_ids"], batch["position_ids"], queues, rope)

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
            video_grid_thw=inputs.get("video_grid_thw"),
            attention_mask=mask,
            use_audio_in_video=self.settings.use_audio_in_video,
            audio_seqlens=None if audio_mask is None else audio_mask.sum(dim=1),
            second_per_grids=inputs.get("video_second_per_grid"),
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
        "video": "<|video_pad|>",
        "audio": "<|audio_pad|>",
        "vision_bos": "<|vision_start|>",
        "vision_eos": "<|vision_end|>",
        "audio_bos": "<|audio_start|>",
        "audio_eos": "<|audio_end|>",
    }
