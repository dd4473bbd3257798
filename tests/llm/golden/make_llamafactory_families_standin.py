"""Regenerate LLaMA-Factory's encoding of image rows for Kimi-VL, whose processor cannot be built here (it is remote
code in the model repository). tests/llm/test_multimodal_families_standin.py compares lathe against it. (Llama 4 and
LFM2-VL, whose processors need torchvision, run their real processors through the torchvision test recipe:
make_llamafactory_torchvision_families.py.)

    python tests/llm/golden/make_llamafactory_families_standin.py [--python bench/.venv-lf/bin/python]

Both sides get the same processor STAND-IN (vl_remote_code.py: a deterministic image processor with the outputs and
attributes the plugin reads: image_grid_hws and merge_kernel_size), so what is compared is LLaMA-Factory's token and
collator path, not the real processor's pixels. Runs in LLaMA-Factory 0.9.5's environment (`--worker`) as
make_llamafactory_families.py does (its rows, images and tokenizer); writes
tests/llm/golden/llamafactory_families_standin.safetensors (the layout of llamafactory_families.safetensors).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_families_standin.safetensors"
FAMILIES = {"kimi_vl": ("kimi_vl", "image")}
TOKENS = {"kimi_vl": ["<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>"]}


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _module("make_families", HERE / "make_llamafactory_families.py")
make_image, messages_of, CUTOFF_LEN, ROWS = BASE.make_image, BASE.messages_of, BASE.CUTOFF_LEN, BASE.ROWS


# The stand-in image processor is the remote-code stand-in's (vl_remote_code.py, whose Kimi-VL model trains on it):
# 14-pixel patches, (rows, columns) per image in image_grid_hws (each side an even number of patches, so the 2x2
# merge kernel divides them), pixel_values one row per patch.
KimiVLStandInImageProcessor = _module("vl_remote_code", HERE / "vl_remote_code.py").KimiVLStandInImageProcessor


def settings_of(family: str) -> dict:
    return {"image_max_pixels": BASE.IMAGE_MAX_PIXELS, "image_min_pixels": BASE.IMAGE_MIN_PIXELS}


def make_tokenizer(family: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BASE.TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": TOKENS[family]})
    return tokenizer


def make_processor(family: str, tokenizer):
    from types import SimpleNamespace

    if family == "kimi_vl":
        return SimpleNamespace(image_processor=KimiVLStandInImageProcessor(), tokenizer=tokenizer)
    raise ValueError(f"{family}: no stand-in (Llama 4 and LFM2-VL: make_llamafactory_torchvision_families.py)")


def run_family(family: str, tensors: dict, metadata: dict) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    tokenizer = make_tokenizer(family)
    processor = make_processor(family, tokenizer)
    data_args = DataArguments(template=FAMILIES[family][0], cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    for key, value in settings_of(family).items():
        setattr(processor, key, value)
    images = [[make_image(name) for name in row["images"]] for row in ROWS]
    for index, row in enumerate(ROWS):
        expanded = template.mm_plugin.process_messages(messages_of(row), images[index], [], [], processor)
        metadata[f"{family}.messages.{index}"] = json.dumps(expanded)
    batch = {
        "_prompt": [messages_of(row)[:-1] for row in ROWS],
        "_response": [messages_of(row)[-1:] for row in ROWS],
        "_system": [""] * len(ROWS),
        "_tools": [""] * len(ROWS),
        "_images": [items or None for items in images],
        "_videos": [None] * len(ROWS),
        "_audios": [None] * len(ROWS),
    }
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    encoded = encoder.preprocess_dataset(batch)
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template, processor=processor, model=None, tokenizer=tokenizer, pad_to_multiple_of=8
    )
    features = []
    for index in range(len(ROWS)):
        feature = {key: encoded[key][index] for key in ("input_ids", "labels", "attention_mask")}
        for key, value in feature.items():
            tensors[f"{family}.example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        features.append({**feature, **({"images": images[index]} if images[index] else {})})
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        for key, value in collator([dict(feature) for feature in chosen]).items():
            tensors[f"{family}.{prefix}.{key}"] = value.detach().contiguous().clone()
    # A pair's pixel_values that are its rows' single ones joined are left out (a smaller file): the test joins them.
    derived = {}
    for pair in range(len(features) // 2):
        name, rows = f"{family}.pair.{pair}.pixel_values", [2 * pair, 2 * pair + 1]
        parts = [tensors[f"{family}.single.{row}.pixel_values"] for row in rows]
        if len({part.shape[1:] for part in parts}) == 1 and torch.equal(torch.cat(parts), tensors[name]):
            del tensors[name]
            derived[name] = rows
    metadata[f"{family}.derived"] = json.dumps(derived)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument(
        "--pillow", default="bench/.cache/pillow12", help="Pillow 12.3 (see make_llamafactory_mrope_families.py)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import llamafactory
        import PIL
        import transformers
        from safetensors.torch import save_file

        tensors, metadata = {}, {}
        for family in FAMILIES:
            run_family(family, tensors, metadata)
        versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
        metadata["versions"] = json.dumps({**versions, "pillow": PIL.__version__})
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(os.path.abspath(path) for path in (args.pillow, args.stubs) if os.path.isdir(path)),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
