"""Audio and video files made with PyAV's encoders for the multimodal tests and their golden generators (never
LLaMA-Factory's demo media): deterministic signals, encoded to the containers LLaMA-Factory reads."""

from __future__ import annotations

from pathlib import Path

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
    with av.open(str(path), "w") as container:
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
