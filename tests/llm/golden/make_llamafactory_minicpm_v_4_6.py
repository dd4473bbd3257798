"""Regenerate LLaMA-Factory's encoding of MiniCPM-V 4.6 image rows (minicpm_v_4_6 template) that
tests/llm/test_multimodal_minicpm_v_4_6.py compares lathe against.

    python tests/llm/golden/make_llamafactory_minicpm_v_4_6.py [--lf-package bench/.venv-lf/lib/python3.11/site-packages/llamafactory]

LLaMA-Factory 0.9.5's MiniCPMV4_6Plugin needs transformers' minicpmv4_6 (5.23 has it; LLaMA-Factory's own venv, 5.6,
does not), so its package runs here under lathe's Python (transformers 5.23): `--worker` runs with a folder holding
only a link to LLaMA-Factory's installed `llamafactory` package first on the path, the torchaudio stand-in of
bench/lf_stubs, an `omegaconf` stand-in (its hparams module imports OmegaConf at the top; the data path never uses
it) and torchvision through the test recipe (transformers builds MiniCPMV4_6Processor only with its video
processor). make_llamafactory_families.run_family then runs its rows (one image, two images, one image in a two-turn
chat, no image: the stand-in image) through LLaMA-Factory's plugin, template, SupervisedDatasetProcessor and
MultiModalDataCollatorForSeq2Seq, with the real MiniCPMV4_6Processor at a tiny size (56-pixel scale resolution, up to
4 slices; the PIL image processor) over the committed BPE tokenizer with MiniCPM-V's named image tokens. Writes
tests/llm/golden/llamafactory_minicpm_v_4_6.safetensors (the layout of llamafactory_families.safetensors).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_minicpm_v_4_6.safetensors"
NAMED_TOKENS = {  # MiniCPM-V 4.6's tokenizer names them (MiniCPMV4_6Processor reads them there)
    "image_token": "<image_pad>",
    "video_token": "<video_pad>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
}
OMEGACONF = '"""Stand-in: llamafactory.hparams imports OmegaConf; the data path never uses it."""\n\n\nclass OmegaConf:\n    pass\n'


def _families_generator():
    spec = importlib.util.spec_from_file_location("make_families", HERE / "make_llamafactory_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _families_generator()


def make_tokenizer(family: str = "minicpm_v_4_6"):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(BASE.TOKENIZER), extra_special_tokens=NAMED_TOKENS)


def make_image_processor():
    """MiniCPM-V 4.6's PIL image processor, tiny: 56-pixel scale resolution (2 tokens per 28x56 view), up to 4 slices."""
    from transformers import MiniCPMV4_6ImageProcessorPil

    return MiniCPMV4_6ImageProcessorPil(scale_resolution=56, max_slice_nums=4)


def make_processor(family: str = "minicpm_v_4_6", tokenizer=None):
    """transformers' MiniCPMV4_6Processor (needs torchvision: its video processor)."""
    import transformers as tf

    videos = tf.MiniCPMV4_6VideoProcessor(scale_resolution=56, max_slice_nums=4)
    return tf.MiniCPMV4_6Processor(make_image_processor(), videos, tokenizer)


def make_model(tokenizer):
    """A tiny MiniCPMV4_6ForConditionalGeneration (one vision and one text layer, hidden 16), weights set by name."""
    import transformers as tf

    vision = tf.MiniCPMV4_6VisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
        insert_layer_id=0,
    )
    text = tf.AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        layer_types=["full_attention"],
    )
    ids = tokenizer.convert_tokens_to_ids
    config = tf.MiniCPMV4_6Config(
        vision_config=vision,
        text_config=text,
        image_token_id=ids(NAMED_TOKENS["image_token"]),
        video_token_id=ids(NAMED_TOKENS["video_token"]),
        insert_layer_id=0,
        image_size=56,
    )
    return BASE._same_weights(tf.MiniCPMV4_6ForConditionalGeneration(config)).eval()


def use_in(base) -> None:
    """The families generator (a loaded copy) made to run MiniCPM-V 4.6: its table, tokenizer and processor."""
    base.FAMILIES = {"minicpm_v_4_6": ("minicpm_v_4_6", "image")}
    base.make_tokenizer, base.make_processor = make_tokenizer, make_processor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "bench/.venv-lf/lib/python3.11/site-packages/llamafactory"
    parser.add_argument("--lf-package", default=default, help="LLaMA-Factory 0.9.5's installed package folder")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import llamafactory
        import PIL
        import transformers
        from safetensors.torch import save_file

        use_in(BASE)
        tensors, metadata = {}, {}
        BASE.run_family("minicpm_v_4_6", tensors, metadata)
        versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
        metadata["versions"] = json.dumps({**versions, "pillow": PIL.__version__})
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        (scratch / "llamafactory").symlink_to(os.path.abspath(args.lf_package))
        (scratch / "omegaconf").mkdir()
        (scratch / "omegaconf" / "__init__.py").write_text(OMEGACONF)
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            PYTHONPATH=os.pathsep.join([str(shim), str(scratch), args.stubs, str(site)]),
            TRANSFORMERS_VERBOSITY="error",
            LLAMAFACTORY_VERBOSITY="ERROR",
            DISABLE_VERSION_CHECK="1",
            OMP_NUM_THREADS="1",
        )
        subprocess.run([sys.executable, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
