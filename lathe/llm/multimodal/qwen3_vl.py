"""The Qwen3-VL family (qwen3_vl templates: Qwen3-VL, Qwen3.5/3.6) as LLaMA-Factory 0.9.5 encodes images and videos:
Qwen2-VL's images (qwen2_vl.py); each video a run per temporal patch, `<t seconds>` + `<|vision_start|>` +
`<|video_pad|>` x (h*w / merge_size^2) + `<|vision_end|>`, t the mean time of the patch's frames (Qwen3VLProcessor's
timestamps), the grid from Qwen3-VL's video smart_resize; the video processor called with LLaMA-Factory's metadata of
the sampled frames (do_sample_frames off)."""

from __future__ import annotations

from dataclasses import dataclass

from lathe.llm.multimodal.base import Composite
from lathe.llm.multimodal.images import VIDEO_PLACEHOLDER
from lathe.llm.multimodal.qwen2_vl import (
    LANGUAGE_MODEL_KEYS,
    LORA_CONFLICT_KEYS,
    PROJECTOR_KEYS,
    VIDEO_TOKEN,
    VISION_END,
    VISION_START,
    Qwen2VLPlugin,
    expand_placeholders,
    image_inputs,  # noqa: F401  (with expand_placeholders: the serving path's image functions, inference/vision.py)
    video_grid,
)


def frame_timestamps(frames_indices: list[float], video_fps: float, merge_size: int) -> list[float]:
    """Seconds of each temporal patch of a Qwen3-VL video (Qwen3VLProcessor._calculate_timestamps, as LLaMA-Factory
    calls it with the video processor's merge_size): the indices (in units of 1 / video_fps) padded to a multiple of
    merge_size with the last one, turned into seconds, and each group's first and last averaged."""
    indices = list(frames_indices)
    if len(indices) % merge_size:
        indices.extend(indices[-1] for _ in range(merge_size - len(indices) % merge_size))
    seconds = [index / video_fps for index in indices]
    return [(seconds[i] + seconds[i + merge_size - 1]) / 2 for i in range(0, len(seconds), merge_size)]


QWEN3_VL = Composite(
    ("visual.pos_embed", "visual.patch_embed", "visual.blocks", "visual.deepstack_merger_list"),
    PROJECTOR_KEYS,
    LANGUAGE_MODEL_KEYS,
    LORA_CONFLICT_KEYS,
)


@dataclass
class Qwen3VLPlugin(Qwen2VLPlugin):
    """LLaMA-Factory's Qwen3VLPlugin (Qwen3-VL, Qwen3.5/3.6 templates): Qwen2-VL's image tokens; each video a run per
    temporal patch, `<t seconds>` + `<|vision_start|>` + `<|video_pad|>` x (h*w / merge_size^2) + `<|vision_end|>`
    (t: the mean time of the patch's frames, one decimal); its vision tower adds position embeddings and deepstack
    mergers (frozen with freeze_vision_tower).

    LLaMA-Factory 0.9.5 reads a video's timestamps by the index of the message that holds it and gives every video
    of a row the first one's frame count (a second video in a later message fails there, two different videos in
    one message get the first's times); lathe times and counts each video by its own frames, which is the same
    for a row's first video and what Qwen3VLProcessor writes."""

    name = "qwen3_vl"
    kinds = ("image", "video")
    composites = {"qwen3_vl": QWEN3_VL, "qwen3_vl_moe": QWEN3_VL}

    def _video_grid(self, media: dict):
        import torch

        videos = media.get("video") or []
        grids = [video_grid(video, self.video_processor, self.settings, qwen3=True) for video in videos]
        return torch.tensor(grids, dtype=torch.long).reshape(-1, 3)

    def _video_runs(self, grid) -> int:
        return int(grid[0])

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        expanded = expand_placeholders(messages, self._grid(media), self.image_processor.merge_size)
        videos = media.get("video") or []
        if not videos:
            return expanded
        grids, merge = self._video_grid(media), self.video_processor.merge_size
        runs = []
        for video, grid in zip(videos, grids):
            stamps = frame_timestamps(video.frames_indices, self.settings.video_fps, merge)
            tokens = f"{VISION_START}{VIDEO_TOKEN * (int(grid[1:].prod()) // merge**2)}{VISION_END}"
            runs.append("".join(f"<{stamps[frame]:.1f} seconds>{tokens}" for frame in range(int(grid[0]))))
        used, out = 0, []
        for message in expanded:
            content = message["content"]
            while VIDEO_PLACEHOLDER in content:
                if used >= len(runs):
                    raise ValueError(f"more {VIDEO_PLACEHOLDER} placeholders than videos ({len(runs)})")
                content = content.replace(VIDEO_PLACEHOLDER, runs[used], 1)
                used += 1
            out.append({**message, "content": content})
        return out

    def video_metadata(self, videos: list) -> list[dict]:
        """What LLaMA-Factory tells Qwen3VLVideoProcessor of each video (the frames are sampled already)."""
        fps = self.settings.video_fps
        return [
            {"fps": fps, "duration": v.duration, "total_num_frames": len(v.frames), "frames_indices": v.frames_indices}
            for v in videos
        ]

    def video_inputs(self, videos: list) -> dict:
        """pixel_values_videos and video_grid_thw; the processor's video_metadata (not a model input) left out."""
        if not videos:
            return {}
        inputs = dict(
            self.video_processor(
                videos=[video.frames for video in videos],
                video_metadata=self.video_metadata(videos),
                fps=self.settings.video_fps,
                return_metadata=True,
                do_sample_frames=False,  # LLaMA-Factory's frames, as sampled
                return_tensors="pt",
            )
        )
        inputs.pop("video_metadata", None)
        if "second_per_grid_ts" in (getattr(self.processor, "model_input_names", None) or ()):
            temporal = getattr(self.image_processor, "temporal_patch_size", 2)
            inputs["second_per_grid_ts"] = [temporal / video.fps for video in videos]
        return inputs
