"""Regenerate LLaMA-Factory's reading of audio files (MP3, FLAC, OGG, M4A, WAV; mono and stereo; 8 to 48 kHz) that
tests/llm/test_multimodal_audio.py compares lathe against.

    python tests/llm/golden/make_llamafactory_audio.py [--python bench/.venv-lf/bin/python] [--torchaudio WHEEL]

The files are made with PyAV's encoders (tests/llm/media_files.py). Runs this same file in LLaMA-Factory 0.9.5's
environment (`--worker`, where lathe is not imported) with a `torchaudio` stand-in package built here from
torchaudio's own wheel (downloaded with `pip download --no-deps torchaudio==2.11.0` unless given): its
`functional.resample` is torchaudio's code (the three resampling functions of torchaudio/functional/functional.py,
taken from the wheel as written), and its `load` decodes with FFmpeg through PyAV to float32 (channels, samples),
as torchaudio >= 2.9's load does through torchcodec (whose wheels need FFmpeg's shared libraries, absent here).
LLaMA-Factory's Qwen2AudioPlugin then regularizes each file (`_regularize_audios`: mono mean, resample to 16 kHz),
expands `<audio>` and computes input_features with a tiny WhisperFeatureExtractor (16 mel bins, 1-second window).
Writes tests/llm/golden/llamafactory_audio.safetensors: `wave.<file>` (the regularized waveform), `features.<file>`,
`mask.<file>`, and the expanded messages and versions in the metadata.
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_audio.safetensors"
TORCHAUDIO = "2.11.0"
RESAMPLE_FUNCTIONS = ("_get_sinc_resample_kernel", "_apply_sinc_resample_kernel", "resample")
LOAD = '''
def load(uri, *args, **kwargs):
    """torchaudio >= 2.9's load (torchcodec's AudioDecoder.get_all_samples) through PyAV: float32 planar samples
    of the first audio stream at its own rate, shape (channels, samples)."""
    import av
    import numpy as np
    import torch

    with av.open(uri, "r") as container:
        stream = container.streams.audio[0]
        chunks, resampler, rate = [], None, stream.sample_rate
        for frame in container.decode(stream):
            if resampler is None:
                rate = frame.sample_rate
                resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=rate)
            chunks += [item.to_ndarray() for item in resampler.resample(frame)]
        chunks += [item.to_ndarray() for item in resampler.resample(None)]
    return torch.from_numpy(np.concatenate(chunks, axis=1).astype(np.float32)), rate
'''


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_stand_in(wheel: Path, folder: Path) -> None:
    """folder/torchaudio: `load` above and `functional.resample` as torchaudio's wheel writes it."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("torchaudio/functional/functional.py").decode()
    tree = ast.parse(source)
    kept = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in RESAMPLE_FUNCTIONS]
    assert len(kept) == len(RESAMPLE_FUNCTIONS), "torchaudio's resampling functions moved"
    functions = "\n\n".join(ast.get_source_segment(source, node) for node in kept)
    header = "import math\nimport warnings\nfrom typing import Optional\n\nimport torch\nfrom torch import Tensor\n"
    header += "_CPU = torch.device('cpu')\n\n"
    package = folder / "torchaudio"
    package.mkdir(parents=True, exist_ok=True)
    (package / "functional.py").write_text(header + functions + "\n")
    (package / "__init__.py").write_text(
        f'"""torchaudio {TORCHAUDIO}: resample and load only."""\nfrom . import functional\n' + LOAD
    )


def run_llamafactory(folder: Path) -> tuple[dict, dict]:
    import torch
    import transformers
    from llamafactory.data.mm_plugin import get_mm_plugin

    families = _module("make_families", HERE / "make_llamafactory_families.py")
    files = _module("media_files", HERE.parent / "media_files.py")
    tokenizer = families.make_tokenizer("qwen2_audio")
    processor = families.make_processor("qwen2_audio", tokenizer)
    processor.audio_sampling_rate = families.SAMPLING_RATE
    plugin = get_mm_plugin("qwen2_audio", audio_token="<|AUDIO|>")
    tensors, metadata = {}, {}
    for name in files.AUDIO_FILES:
        path = str(folder / name)
        metadata[f"sha256.{name}"] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        wave = plugin._regularize_audios([path], sampling_rate=families.SAMPLING_RATE)["audios"][0]
        tensors[f"wave.{name}"] = torch.from_numpy(wave).contiguous()
        inputs = plugin.get_mm_inputs([], [], [path], [0], [0], [1], [[]], processor)
        tensors[f"features.{name}"] = inputs["input_features"].contiguous()
        tensors[f"mask.{name}"] = inputs["feature_attention_mask"].contiguous()
        messages = [{"role": "user", "content": "<audio>What is this?"}]
        metadata[f"messages.{name}"] = plugin.process_messages(messages, [], [], [path], processor)[0]["content"]
    import av
    import llamafactory

    metadata["versions"] = json.dumps(
        {
            "llamafactory": llamafactory.__version__,
            "transformers": transformers.__version__,
            "av": av.__version__,
            "torchaudio_resample": TORCHAUDIO,
        }
    )
    return tensors, metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--torchaudio", default="", help=f"torchaudio {TORCHAUDIO}'s wheel (downloaded if not given)")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from safetensors.torch import save_file

        tensors, metadata = run_llamafactory(Path(args.worker))
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        wheel = args.torchaudio
        if not wheel:
            pip = [sys.executable, "-m", "pip", "download", "--no-deps", f"torchaudio=={TORCHAUDIO}", "-d"]
            subprocess.run([*pip, str(scratch)], check=True)
            wheel = glob.glob(str(scratch / "torchaudio-*.whl"))[0]
        write_stand_in(Path(wheel), scratch / "stubs")
        _module("media_files", HERE.parent / "media_files.py").write_audio_files(scratch / "media")
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(scratch / "stubs"), TRANSFORMERS_VERBOSITY="error")
        subprocess.run([args.python, __file__, "--worker", str(scratch / "media")], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
