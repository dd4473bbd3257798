"""Audio and video files made with PyAV's encoders for the multimodal tests and their golden generators (never
LLaMA-Factory's demo media): deterministic signals, encoded to the containers LLaMA-Factory reads."""

from __future__ import annotations

from pathlib import Path

BITEXACT = {"fflags": "+bitexact"}  # no random stream serial (OGG), no encoder version string: the same bytes each run
# name: (codec, channels, sampling rate, samples): every container LLaMA-Factory reads, mono and stereo,
# rates above, below and at 16 kHz
AUDIO_FILES = {
    "tone.wav": ("pcm_s16le", 1, 16000, 4000),
    "stereo.wav": ("pcm_s16le", 2, 8000, 3000),
    "song.mp3": ("libmp3lame", 2, 44100, 22050),
    "voice.flac": ("flac", 1, 22050, 11025),
    "talk.ogg": ("libopus", 2, 48000, 24000),
    "clip.m4a": ("aac", 1, 32000, 16000),
}


def make_signal(name: str, channels: int, rate: int, samples: int):
    """(channels, samples) float32: a sine per channel (frequency from the name) plus a slow ramp."""
    import numpy as np

    time = np.arange(samples) / rate
    base = 220 + 40 * sum(map(ord, name)) % 500
    rows = [0.4 * np.sin(2 * np.pi * (base + 110 * channel) * time) + 0.1 * time for channel in range(channels)]
    return np.stack(rows).astype("float32")


def write_audio(path: Path, codec: str, channels: int, rate: int, samples: int) -> Path:
    """The signal of make_signal(path.name, ...) encoded with `codec` into path's container."""
    import av
    import numpy as np

    signal = make_signal(Path(path).name, channels, rate, samples)
    layout = "mono" if channels == 1 else "stereo"
    with av.open(str(path), "w", options=BITEXACT) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        step = stream.codec_context.frame_size or 1024
        for start in range(0, samples, step):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(signal[:, start : start + step]), format="fltp", layout=layout
            )
            frame.sample_rate, frame.pts = rate, start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return Path(path)


def write_audio_files(folder: Path) -> dict[str, Path]:
    """Every file of AUDIO_FILES written into folder: name -> path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return {name: write_audio(folder / name, *spec) for name, spec in AUDIO_FILES.items()}


# name: (width, height, frames, frames per second): 5 frames sampled at video_fps 2 (odd: the last repeated) at
# 1.92 frames a second, and 6 at 2.0
VIDEO_FILES = {"walk.mp4": (64, 48, 13, 5), "spin.mp4": (80, 36, 24, 8)}


def make_frame(name: str, index: int, width: int, height: int):
    """(height, width, 3) uint8: a colour gradient that moves with the frame index."""
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    seed = sum(map(ord, name))
    red = (x * 4 + index * 9 + seed) % 256
    green = (y * 5 + index * 3) % 256
    blue = ((x + y) * 2 + seed * 7) % 256
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def write_video(path: Path, width: int, height: int, frames: int, fps: int) -> Path:
    """An MPEG-4 Part 2 video (yuv420p, one thread: the same bytes run to run) of make_frame's frames."""
    import av

    with av.open(str(path), "w", options=BITEXACT) as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.thread_count = 1
        for index in range(frames):
            frame = av.VideoFrame.from_ndarray(make_frame(Path(path).name, index, width, height), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return Path(path)


def write_video_files(folder: Path) -> dict[str, Path]:
    """Every file of VIDEO_FILES written into folder: name -> path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return {name: write_video(folder / name, *spec) for name, spec in VIDEO_FILES.items()}
