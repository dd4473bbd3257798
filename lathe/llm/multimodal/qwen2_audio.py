"""The Qwen2-Audio family (qwen2_audio template) as LLaMA-Factory 0.9.5 encodes audio: each waveform goes through
the Whisper feature extractor (padded to its full window), and its `<audio>` becomes `<|audio_bos|>`, one
`<|AUDIO|>` per encoder output frame (the mel frames halved by the encoder's stride-2 convolution, then by
its pooling), `<|audio_eos|>`. The collator adds input_features and feature_attention_mask."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, audio_processor_inputs, composite, placeholder_runs
from lathe.llm.multimodal.images import AUDIO_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = None, "<|AUDIO|>"
COMPOSITES = {"qwen2_audio": composite(vision=("audio_tower",))}  # as LLaMA-Factory registers them


def audio_token_count(feature_frames: int) -> int:
    """Encoder output frames for `feature_frames` mel frames (Qwen2-Audio's convolution, then pooling)."""
    after_convolution = (feature_frames - 1) // 2 + 1
    return (after_convolution - 2) // 2 + 1


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<audio>` replaced by its bos, audio tokens and eos."""
    if not audios:
        return [dict(message) for message in messages]
    frames = audio_processor_inputs(audios, processor, settings)["feature_attention_mask"].sum(-1).tolist()
    bos, eos = processor.audio_bos_token, processor.audio_eos_token
    return placeholder_runs(
        messages, AUDIO_PLACEHOLDER, lambda k: f"{bos}{AUDIO_TOKEN * audio_token_count(frames[k])}{eos}"
    )


def media_tokens(processor) -> tuple[str, ...]:
    return (processor.audio_bos_token, AUDIO_TOKEN, processor.audio_eos_token)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """input_features (audios, mel bins, frames) and feature_attention_mask (audios, frames)."""
    return audio_processor_inputs(audios, processor, settings)


class Qwen2AudioPlugin(ModulePlugin):
    """LLaMA-Factory's Qwen2-Audio plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "qwen2_audio"
    packs = False
    no_packing = (
        "transformers' Qwen2-Audio picks the audio positions with a 2-D attention mask and packed rows keep a 4-D "
        "one (LLaMA-Factory 0.9.5's neat packing fails there too: IndexError, too many indices)"
    )
