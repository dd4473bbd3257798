"""LLaMA-Factory 0.9.5's multimodal keys: the processor settings (its ProcessorArguments, part of the model
arguments) and which towers of a vision-language model train (part of the finetuning arguments)."""

from __future__ import annotations

from dataclasses import dataclass, field


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class ProcessorArguments:
    """How images, videos and audio are prepared before the family's processor (LLaMA-Factory's defaults)."""

    image_max_pixels: int = field(default=768 * 768, metadata=_help("Images above this many pixels are scaled down."))
    image_min_pixels: int = field(default=32 * 32, metadata=_help("Images below this many pixels are scaled up."))
    image_do_pan_and_scan: bool = field(default=False, metadata=_help("Gemma 3: pan and scan crops of each image."))
    crop_to_patches: bool = field(default=False, metadata=_help("InternVL: crop each image into patches."))
    video_max_pixels: int = field(default=256 * 256, metadata=_help("Video frames above this many pixels shrink."))
    video_min_pixels: int = field(default=16 * 16, metadata=_help("Video frames below this many pixels grow."))
    video_fps: float = field(default=2.0, metadata=_help("Frames sampled per second of video."))
    video_maxlen: int = field(default=128, metadata=_help("At most this many frames per video."))
    use_audio_in_video: bool = field(default=False, metadata=_help("Qwen2.5-Omni: the video's audio track too."))
    audio_sampling_rate: int = field(default=16000, metadata=_help("Audio is resampled to this rate (Hz)."))

    def check_media_pixels(self) -> None:
        if self.image_max_pixels < self.image_min_pixels:
            raise ValueError("image_max_pixels cannot be smaller than image_min_pixels")
        if self.video_max_pixels < self.video_min_pixels:
            raise ValueError("video_max_pixels cannot be smaller than video_min_pixels")


@dataclass
class TowerArguments:
    """Which parts of a vision-language model train (full, freeze and LoRA tuning; LLaMA-Factory's defaults)."""

    freeze_vision_tower: bool = field(default=True, metadata=_help("Keep the vision (or audio) tower frozen."))
    freeze_multi_modal_projector: bool = field(
        default=True, metadata=_help("Keep the projector between the towers frozen.")
    )
    freeze_language_model: bool = field(default=False, metadata=_help("Keep the language model frozen."))
