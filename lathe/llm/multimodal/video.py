"""Videos named by a data row, read as LLaMA-Factory 0.9.5 reads them: frames sampled with PyAV at `video_fps`
(at most `video_maxlen`, evenly spread over the stream: `_get_video_sample_indices`), each frame fitted into
video_min_pixels..video_max_pixels like an image, and the timing the Qwen families need (frames per second of
the sample, the stream's duration, each frame's timestamp in units of 1 / video_fps).

transformers' video processors need torchvision; where it does not import, a video row stops with one line
naming it (check_torchvision)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from lathe.llm.multimodal.audio import import_av


@dataclass
class Video:
    """One regularized video: its frames (PIL images) and LLaMA-Factory's timing of them."""

    frames: list
    fps: float  # frames sampled per second of the stream (fps_per_video)
    duration: float  # seconds
    frames_indices: list = field(default_factory=list)  # sample index / stream fps * video_fps (Qwen3-VL timestamps)
    width: int = 0  # the stream's frame size, before any resize
    height: int = 0
    sample_count: int = 0  # frames sampled from the stream (before the Qwen families' even-count padding)


def check_torchvision(what: str = "video input") -> None:
    """One clear line when torchvision does not import (transformers' video processors are built on it)."""
    try:
        import torchvision  # noqa: F401
    except Exception as error:  # noqa: BLE001 (an ImportError, or a CUDA build's RuntimeError beside a CPU torch)
        raise ValueError(
            f"{what} needs torchvision (transformers' video processors use it), which does not import here "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}): "
            "pip install torchvision (the build for your torch)"
        ) from None


def sample_indices(total_frames: int, seconds: float, video_fps: float, video_maxlen: int) -> list[int]:
    """LLaMA-Factory's frame choice: floor(seconds * video_fps) frames (at least 1, at most the stream's frames and
    video_maxlen), spread evenly from the first to the last frame (numpy linspace, truncated to int32)."""
    import numpy as np

    if total_frames == 0:  # a stream that does not know its length
        return np.linspace(0, video_maxlen - 1, video_maxlen).astype(np.int32).tolist()
    count = max(1, math.floor(seconds * video_fps))
    count = min(total_frames, video_maxlen, count)
    return np.linspace(0, total_frames - 1, count).astype(np.int32).tolist()


def read_video(source: Any, video_fps: float, video_maxlen: int, even: bool = False) -> Video:
    """The sampled frames of a video file (path, bytes, {"bytes", "path"} or file-like) and their timing; `even`: the Qwen families repeat
    the last frame of an odd count (their processors group frames in pairs)."""
    from io import BytesIO

    av = import_av()
    if isinstance(source, dict):  # datasets' {"bytes", "path"}
        source = source["bytes"] if source.get("bytes") is not None else source.get("path")
    if isinstance(source, (bytes, bytearray)):
        source = BytesIO(source)
    if isinstance(source, str) and not os.path.isfile(source):
        raise FileNotFoundError(f"video file {source!r} not found")
    try:
        with av.open(source, "r") as container:
            stream = next((item for item in container.streams if item.type == "video"), None)
            if stream is None:
                raise ValueError(f"{source}: no video stream in this file")
            seconds = None if stream.duration is None else float(stream.duration * stream.time_base)
            # LLaMA-Factory reads the duration unconditionally here (a stream without one fails there too)
            indices = sample_indices(stream.frames, seconds if seconds is not None else 0.0, video_fps, video_maxlen)
            average_fps = float(stream.average_rate) if stream.average_rate else video_fps
            wanted, frames = set(indices), []
            container.seek(0)
            for number, frame in enumerate(container.decode(stream)):
                if number in wanted:
                    frames.append(frame.to_image())
            width, height = stream.width, stream.height
    except av.error.FFmpegError as error:
        raise ValueError(f"{source}: FFmpeg cannot decode this video ({error})") from None
    if not frames:
        raise ValueError(f"{source}: no frame could be decoded")
    if seconds is None:
        fps, duration = video_fps, len(frames) / video_fps
    else:
        fps, duration = len(indices) / seconds, seconds
    sampled = len(indices)
    if even and len(frames) % 2:
        frames.append(frames[-1])
    stamps = [index / average_fps * video_fps for index in indices]
    return Video(frames, fps, duration, stamps, width, height, sampled)
