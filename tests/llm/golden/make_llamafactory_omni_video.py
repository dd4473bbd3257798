"""Regenerate LLaMA-Factory 0.9.5's encoding of Qwen2.5-Omni and Qwen3-Omni video rows (with and without
use_audio_in_video) made with the REAL processor, that tests/llm/test_multimodal_mrope_families.py compares lathe
against under the torchvision test recipe.

    python tests/llm/golden/make_llamafactory_omni_video.py [--python bench/.venv-lf/bin/python]

make_llamafactory_mrope_families.py records these rows with a stand-in video processor (transformers builds
Qwen2VLVideoProcessor and Qwen2_5OmniProcessor only with torchvision). This runs its `run_family` for the video
families in LLaMA-Factory's environment (`--worker`; lathe not imported) with torchvision through the test recipe
(tests/llm/torchvision_recipe.py) and Pillow 12.3 (`--pillow`, as that generator), the processor being
transformers' own Qwen2_5OmniProcessor or, for Qwen3-Omni (the qwen3_omni_nothink template's tokens, the tiny
Qwen3-Omni thinker), Qwen3OmniMoeProcessor (`make_processor`; LLaMA-Factory reads the class name for the audio token
count): Qwen2VLImageProcessor (the torchvision backend that AutoProcessor's use_fast picks there),
Qwen2VLVideoProcessor, the same Whisper feature extractor, and the tokenizer with the model's named special tokens.
The Qwen3-Omni rows are only here (the stand-in golden has Qwen3-Omni's image and audio rows); with them, the
messages of one more use_audio_in_video row whose audio (3 s) spans more than one 2-second chunk of audio tokens
(`LONG_AUDIO_ROW`, `long_audio_processor`: a 4-second feature window), where the chunk size shows. Writes
tests/llm/golden/llamafactory_omni_video.safetensors in the same layout (`<family>.example.<i>.*`,
`<family>.single.<i>.*`, `<family>.pair.<b>.*`, `derived`, messages, versions).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_omni_video.safetensors"
FAMILIES = ("qwen2_omni_video", "qwen2_omni_video_apart", "qwen3_omni_video", "qwen3_omni_video_apart")
# the tokenizer attributes the Omni processors read (a Qwen2.5-Omni / Qwen3-Omni folder's tokenizer_config names them)
NAMED_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}
QWEN3_NAMED_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}


def mrope_generator():
    spec = importlib.util.spec_from_file_location("make_mrope", HERE / "make_llamafactory_mrope_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a video and 3 s of its audio: 39 Qwen3-Omni audio tokens, more than one 2-second chunk's 26
LONG_AUDIO_ROW = {"messages": [("user", "<video><audio>What happens?"), ("assistant", "four")], "videos": ["spin.mp4"]}
LONG_AUDIO_FAMILY = "qwen3_omni_video"


def long_audio(gen):
    """LONG_AUDIO_ROW's audio: 3 seconds of a deterministic sine plus a ramp."""
    import numpy as np

    time = np.arange(3 * gen.BASE.SAMPLING_RATE) / gen.BASE.SAMPLING_RATE
    return (0.5 * np.sin(2 * np.pi * 330 * time) + 0.1 * time).astype("float32")


def long_audio_processor(gen, tokenizer):
    """make_processor's Qwen3OmniMoeProcessor with a 4-second feature window (the 3-second audio whole)."""
    import transformers as tf

    processor = make_processor(gen, tokenizer, LONG_AUDIO_FAMILY)
    processor.feature_extractor = tf.WhisperFeatureExtractor(
        feature_size=16, chunk_length=4, sampling_rate=gen.BASE.SAMPLING_RATE
    )
    return processor


def long_audio_messages(gen, folder: Path) -> list[dict]:
    """LLaMA-Factory's expanded messages of LONG_AUDIO_ROW (use_audio_in_video, the qwen3_omni_nothink template)."""
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    tokenizer = gen.make_tokenizer(LONG_AUDIO_FAMILY)
    processor = long_audio_processor(gen, tokenizer)
    for key, value in gen.settings_of(LONG_AUDIO_FAMILY).items():
        setattr(processor, key, value)
    data_args = DataArguments(template=gen.spec_of(LONG_AUDIO_FAMILY)[0], cutoff_len=gen.CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    videos = [str(folder / name) for name in LONG_AUDIO_ROW["videos"]]
    messages = gen.messages_of(LONG_AUDIO_ROW)
    return template.mm_plugin.process_messages(messages, [], videos, [long_audio(gen)], processor)


def make_processor(gen, tokenizer, family: str = "qwen2_omni_video"):
    """transformers' Qwen2_5OmniProcessor (Qwen3OmniMoeProcessor for the qwen3_omni families) with the stand-in's
    budgets: 14-pixel patches merged 2x2 (images at most 56x56 pixels, frames at most 16 merged patches), Whisper's
    extractor with 16 mel bins; needs torchvision."""
    import transformers as tf

    qwen3 = family.startswith("qwen3_omni")
    tokenizer._set_model_specific_special_tokens(special_tokens=QWEN3_NAMED_TOKENS if qwen3 else NAMED_TOKENS)
    size = {"shortest_edge": 28 * 28, "longest_edge": 56 * 56}
    images = tf.Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, size=size)
    videos = tf.Qwen2VLVideoProcessor(min_pixels=28 * 28, max_pixels=28 * 28 * 16)
    features = tf.WhisperFeatureExtractor(feature_size=16, chunk_length=1, sampling_rate=gen.BASE.SAMPLING_RATE)
    return (tf.Qwen3OmniMoeProcessor if qwen3 else tf.Qwen2_5OmniProcessor)(images, videos, features, tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument("--pillow", default="bench/.cache/pillow12", help="Pillow 12.3 (see the mrope generator)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import hashlib
        import tempfile

        import llamafactory
        import PIL
        import torchvision
        import transformers
        from safetensors.torch import save_file

        gen = mrope_generator()
        gen.make_processor = lambda family, tokenizer: make_processor(gen, tokenizer, family)  # run_family's processor
        tensors, metadata = {}, {}
        with tempfile.TemporaryDirectory() as folder:
            for name, path in gen.media_files().write_video_files(Path(folder)).items():
                metadata[f"sha256.{name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
            for family in FAMILIES:
                gen.run_family(family, tensors, metadata, Path(folder))
            metadata["long_audio.messages"] = json.dumps(long_audio_messages(gen, Path(folder)))
        versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
        versions.update(pillow=PIL.__version__, torchvision=torchvision.__version__)
        metadata["versions"] = json.dumps(versions)
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    paths = [str(shim)] + [os.path.abspath(path) for path in (args.pillow, args.stubs) if os.path.isdir(path)]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([*paths, str(site)]),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
        OMP_NUM_THREADS="1",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
