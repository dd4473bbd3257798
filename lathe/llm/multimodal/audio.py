"""Audio named by a data row, read as LLaMA-Factory 0.9.5 reads it (`_regularize_audios`): decoded with FFmpeg
(PyAV here; torchaudio >= 2.9's `load` decodes through FFmpeg too) to float32 samples in [-1, 1], channels
averaged to mono, then resampled to `audio_sampling_rate` with torchaudio's windowed-sinc resampler (the same
kernel, computed in the waveform's dtype). Any container FFmpeg reads: WAV, MP3, FLAC, OGG, M4A, ...

PyAV (`av` on PyPI) is imported here only, when the first audio file is read."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from lathe.llm.multimodal.images import UndecodableMedia


def import_av():
    """The PyAV module, or one line saying how to install it."""
    try:
        import av
    except ImportError as error:
        raise ImportError(
            "audio and video files are decoded with PyAV (FFmpeg): pip install av  (or pip install 'lathe[media]')"
        ) from error
    return av


def decode_audio(source: Any):
    """(float32 tensor of shape (channels, samples), sampling rate) of an audio file or file-like object: every
    frame of its first audio stream, converted to float planar at the stream's own rate and layout (what
    torchcodec's AudioDecoder.get_all_samples, torchaudio.load's decoder, returns)."""
    import numpy as np
    import torch

    av = import_av()
    if isinstance(source, str) and not os.path.isfile(source):
        raise FileNotFoundError(f"audio file {source!r} not found")
    try:
        with av.open(source, "r") as container:
            streams = container.streams.audio
            if not streams:
                raise ValueError(f"{source}: no audio stream in this file")
            stream = streams[0]
            resampler, chunks, rate = None, [], stream.sample_rate
            for frame in container.decode(stream):
                if resampler is None:
                    rate = frame.sample_rate
                    resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=rate)
                chunks += [converted.to_ndarray() for converted in resampler.resample(frame)]
            if resampler is not None:
                chunks += [converted.to_ndarray() for converted in resampler.resample(None)]
    except av.error.FFmpegError as error:
        file = source if isinstance(source, str) else None
        raise UndecodableMedia(f"{source}: FFmpeg cannot decode this audio ({error})", file) from None
    if not chunks:
        raise UndecodableMedia(
            f"{source}: the audio stream holds no samples", source if isinstance(source, str) else None
        )
    samples = np.concatenate([chunk.reshape(chunk.shape[0], -1) for chunk in chunks], axis=1)
    declared = _declared_wav_frames(source)
    if declared is not None and samples.shape[1] < declared:
        # FFmpeg decodes what a cut file still holds without a word: a PCM header states the exact length.
        file = source if isinstance(source, str) else None
        what = f"audio file {source!r}" if file else "audio bytes"
        raise UndecodableMedia(f"{what} is truncated ({samples.shape[1]} of {declared} samples).", file)
    return torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)), int(rate)


def _declared_wav_frames(source) -> int | None:
    """The frame count a WAV file's header declares, or None (not a WAV path, or a header Python cannot read).
    Only WAV is held to its header: compressed streams' lengths are estimates (an MP3 without a Xing header)."""
    import wave

    if not isinstance(source, str):
        return None
    try:
        with wave.open(source, "rb") as handle:
            return handle.getnframes()
    except (wave.Error, EOFError, OSError):
        return None


def sinc_resample_kernel(orig_freq: int, new_freq: int, dtype, lowpass_filter_width: int = 6, rolloff: float = 0.99):
    """(kernel of shape (new_freq, 1, taps), width) for frequencies already divided by their gcd: torchaudio's
    "sinc_interp_hann" kernel (a sinc lowpass at rolloff x the lower Nyquist, under a squared-cosine window)."""
    import torch

    base_freq = min(orig_freq, new_freq) * rolloff
    width = math.ceil(lowpass_filter_width * orig_freq / base_freq)
    idx = torch.arange(-width, width + orig_freq, dtype=dtype)[None, None] / orig_freq
    t = torch.arange(0, -new_freq, -1, dtype=dtype)[:, None, None] / new_freq + idx
    t *= base_freq
    t = t.clamp_(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t *= math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernels *= window * (base_freq / orig_freq)
    return kernels, width


def resample(waveform, orig_freq: int, new_freq: int):
    """`waveform` (..., time), a float tensor, from orig_freq to new_freq Hz as torchaudio.functional.resample does
    with its defaults (the output holds ceil(new_freq * length / orig_freq) samples)."""
    import torch

    if orig_freq <= 0 or new_freq <= 0:
        raise ValueError(f"sampling rates must be positive, got {orig_freq} and {new_freq}")
    if orig_freq == new_freq:
        return waveform
    gcd = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd
    kernel, width = sinc_resample_kernel(orig, new, waveform.dtype)
    shape = waveform.size()
    flat = waveform.reshape(-1, shape[-1])
    length = flat.shape[-1]
    padded = torch.nn.functional.pad(flat, (width, width + orig))
    out = torch.nn.functional.conv1d(padded[:, None], kernel, stride=orig)
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)
    out = out[..., : int(torch.ceil(torch.as_tensor(new * length / orig)))]
    return out.view(shape[:-1] + out.shape[-1:])


def load_audio(source: Any, sampling_rate: int):
    """A mono float32 numpy waveform at `sampling_rate` from an audio file (path, bytes or file-like): LLaMA-Factory's
    `_regularize_audios` for one item that is not already an array."""
    from io import BytesIO

    if isinstance(source, (bytes, bytearray)):
        source = BytesIO(source)
    audio, rate = decode_audio(source)
    if audio.shape[0] > 1:
        audio = audio.mean(dim=0, keepdim=True)
    if rate != sampling_rate:
        audio = resample(audio, rate, sampling_rate)
    return audio.squeeze(0).numpy()


def waveform(audio: Any, sampling_rate: int):
    """A mono waveform at `sampling_rate` from a row's audio: a numpy array (taken as it is, as LLaMA-Factory takes
    it), an audio file's path / bytes / {"bytes", "path"} (decoded and resampled as above), or {"array",
    "sampling_rate"} as datasets decodes audio (averaged to mono and resampled the same way)."""
    import numpy as np
    import torch

    if isinstance(audio, np.ndarray):
        return audio
    if isinstance(audio, Mapping) and "array" in audio:
        array = torch.as_tensor(np.asarray(audio["array"], dtype=np.float32))
        array = array.mean(dim=0, keepdim=True) if array.ndim > 1 else array[None]
        rate = int(audio.get("sampling_rate") or sampling_rate)
        return (resample(array, rate, sampling_rate) if rate != sampling_rate else array).squeeze(0).numpy()
    if isinstance(audio, Mapping):
        audio = audio.get("bytes") if audio.get("bytes") is not None else audio.get("path")
    if isinstance(audio, (str, bytes, bytearray)) or hasattr(audio, "read"):
        return load_audio(audio, sampling_rate)
    raise ValueError(f"expected an audio file path, bytes or a waveform (numpy array), got {type(audio).__name__}")
