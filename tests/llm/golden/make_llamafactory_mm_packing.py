"""Regenerate LLaMA-Factory's packed Qwen2-VL image rows that tests/llm/test_multimodal_packing.py compares lathe
against.

    python tests/llm/golden/make_llamafactory_mm_packing.py [--python bench/.venv-lf/bin/python] [--families]
    (the families' cases were made with --stubs /work/main/bench/lf_stubs and --pillow bench/.cache/pillow12)

Runs this same file in LLaMA-Factory's environment (`--worker`, where lathe is not imported). The image rows of
make_llamafactory_qwen2vl.py (its images, tokenizer, image processor and tiny random Qwen2-VL; a larger pixel budget) go through
LLaMA-Factory 0.9.5's `PackedSupervisedDatasetProcessor` (DataArguments lower cutoff_len by one when packing and
pad every packed row to cutoff_len) and its sft collator `SFTDataCollatorWith4DAttentionMask` as run_sft builds it
(pad_to_multiple_of=8; block_diag_attn = neat_packing; the model's attention implementation, eager here), one
batch of all packed rows per case:

- `neat.*`: neat_packing: true, the image rows (mrope positions computed per packed example);
- `plain.*`: packing: true (examples attend to each other; mrope positions over the whole packed row);
- `unaligned.*`: as neat with cutoff_len 121 (rows of 121 tokens that pad_to_multiple_of lengthens to 128);
- `text.*`: neat_packing: true on rows without images (the collator's stand-in image goes into a packed row).

Writes tests/llm/golden/llamafactory_mm_packing.safetensors: `<case>.rows.<key>` (the processor's packed rows,
key: input_ids, labels, attention_mask, position_ids; `<case>.rows.images`: how many images each row holds), the
collated tensors `<case>.<key>`, `loss.<case>` (the tiny model's loss on the batch) and, in the metadata,
`error.<case>` where LLaMA-Factory fails, `json.<case>.packing_params` and the versions; `json.train`: three sft steps
of LLaMA-Factory's own run_exp with neat_packing (TRAIN_KEYS) on make_llamafactory_qwen2vl_train.py's model folder
and data: logged losses and grad norms.

`--families` (added into the same file, the cases above kept): every other family LLaMA-Factory packs, on the
rows, processors and tiny models of make_llamafactory_families.py, make_llamafactory_mrope_families.py and
make_llamafactory_families_standin.py / packing_standins.py (FAMILY_SOURCES), each family's rows neat-packed into cutoff_len FAMILY_CUTOFF_LEN
and collated as one batch: `family.<family>.rows.<key>` (the packed rows), `family.<family>.<key>` (every collated
tensor but the 4-D mask, which is the rows' segment ids made block-diagonal) and `error.family.<family>` where
LLaMA-Factory fails (the collator, or the tiny model on its batch: `loss.family.<family>` where it runs).

Run it with the Pillow of lathe's environment on PYTHONPATH (pip install --target a folder; `--stubs
bench/lf_stubs:that/folder`): Pillow versions resample differently.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_mm_packing.safetensors"
CUTOFF_LEN = 120  # LLaMA-Factory packs into 119 and pads to 120 (a multiple of 8: the collator pads no further)
IMAGE_ROWS = [0, 1, 2, 0, 2]  # make_llamafactory_qwen2vl.ROWS by index: three rows with images, two again
TEXT_ROWS = [3, 3]
IMAGE_MAX_PIXELS = 84 * 56  # larger than make_llamafactory_qwen2vl's: images of 2 to 6 tokens, mrope rows that differ
# `lathe train`'s case: the four mllm_demo rows packed into rows of 119 (LLaMA-Factory lowers cutoff_len by one)
TRAIN_KEYS = {"neat_packing": True, "cutoff_len": 120, "per_device_train_batch_size": 1}
CASES = {  # name: (neat_packing, rows, cutoff_len)
    "neat": (True, IMAGE_ROWS, CUTOFF_LEN),
    "plain": (False, IMAGE_ROWS, CUTOFF_LEN),
    "unaligned": (True, IMAGE_ROWS, CUTOFF_LEN + 1),  # rows of 121, padded to 128 by the collator
    "text": (True, TEXT_ROWS, CUTOFF_LEN),
}


FAMILY_CUTOFF_LEN = 256  # packed rows of at most 255 tokens, padded to 256
FAMILY_SOURCES = {  # family: the generator its rows, processor and tiny model come from
    **dict.fromkeys(
        ["llava", "llava_next", "gemma3", "paligemma", "mllama", "pixtral", "intern_vl", "qwen2_audio", "gemma3n"],
        "make_llamafactory_families.py",
    ),
    **dict.fromkeys(["glm4v", "ernie_vl", "qwen2_omni"], "make_llamafactory_mrope_families.py"),
    "kimi_vl": "make_llamafactory_families_standin.py",
    **dict.fromkeys(["llama4", "lfm2_vl"], "packing_standins.py"),  # stand-ins: the real ones need torchvision
}
MROPE_FAMILIES = ("glm4v", "ernie_vl", "qwen2_omni")  # LLaMA-Factory's collator needs the model for positions
RUNNABLE = ("llava", "llava_next", "gemma3", "paligemma", "mllama", "qwen2_audio", *MROPE_FAMILIES)  # a tiny model


def family_source(family: str):
    """The generator module of `family` and its golden rows and media: (module, template, rows, media_of(row))."""
    import importlib.util

    path = HERE / FAMILY_SOURCES[family]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "rows_of"):
        return module, module.FAMILIES[family][0], module.rows_of(family), lambda row: module.media_of(family, row)
    rows = module.ROWS  # the stand-in generator: image rows only
    return (
        module,
        module.FAMILIES[family][0],
        rows,
        lambda row: {"images": [module.make_image(n) for n in row["images"]]},
    )


def family_examples(module, rows, media_of) -> dict:
    """The rows as the processors' batched columns (media objects in _images / _audios)."""
    media = [media_of(row) for row in rows]
    return {
        "_prompt": [module.messages_of(row)[:-1] for row in rows],
        "_response": [module.messages_of(row)[-1:] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        "_images": [item.get("images") or None for item in media],
        "_videos": [None] * len(rows),
        "_audios": [item.get("audios") or None for item in media],
    }


def run_llamafactory_families(tensors: dict, metadata: dict) -> None:
    """Each family's rows neat-packed and collated by LLaMA-Factory 0.9.5 (FAMILY_SOURCES; module docstring)."""
    import torch
    from llamafactory.data.collator import SFTDataCollatorWith4DAttentionMask
    from llamafactory.data.processor.supervised import PackedSupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    for family in FAMILY_SOURCES:
        module, template_name, rows, media_of = family_source(family)
        tokenizer = module.make_tokenizer(family)
        processor = module.make_processor(family, tokenizer)
        for key, value in module.settings_of(family).items():
            setattr(processor, key, value)
        data_args = DataArguments(template=template_name, cutoff_len=FAMILY_CUTOFF_LEN, packing=True, neat_packing=True)
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        packer = PackedSupervisedDatasetProcessor(
            template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
        )
        packed = packer.preprocess_dataset(family_examples(module, rows, media_of))
        name = f"family.{family}"
        for key in ("input_ids", "labels", "attention_mask", "position_ids"):
            tensors[f"{name}.rows.{key}"] = torch.tensor(packed[key], dtype=torch.int64)
        metadata[f"json.{name}.packing_params"] = json.dumps(packed["packing_params"])
        model = module.make_model(family, tokenizer) if family in RUNNABLE else None
        if model is not None:
            model.config._attn_implementation = "eager"
        collator = SFTDataCollatorWith4DAttentionMask(
            template=template,
            processor=processor,
            model=model if family in MROPE_FAMILIES else None,
            tokenizer=tokenizer,
            pad_to_multiple_of=8,
            label_pad_token_id=-100,
            block_diag_attn=True,
            neat_packing=True,
            attn_implementation="eager",
            compute_dtype=torch.float32,
        )
        features = []
        for index in range(len(packed["input_ids"])):
            feature = {key: packed[key][index] for key in ("input_ids", "labels", "attention_mask", "position_ids")}
            feature.update(packing_params=packed["packing_params"][index])
            feature.update({key: packed[key][index] for key in ("images", "audios") if packed[key][index]})
            features.append(feature)
        try:
            out = collator(features)
        except Exception as error:  # noqa: BLE001 - recorded: where LLaMA-Factory itself fails
            metadata[f"error.{name}"] = f"{type(error).__name__}: {error}"
            continue
        for key, value in out.items():
            if isinstance(value, torch.Tensor) and key != "attention_mask":
                tensors[f"{name}.{key}"] = value.detach().contiguous().clone()
        if model is not None:
            try:
                with torch.no_grad():
                    tensors[f"loss.{name}"] = model(**out).loss.detach().reshape(1).float()
            except Exception as error:  # noqa: BLE001 - recorded: the model fails on LLaMA-Factory's batch
                metadata[f"error.{name}"] = f"{type(error).__name__}: {error}"


def base():
    """make_llamafactory_qwen2vl.py (its rows, images, tokenizer, model), from here or from the tests' package."""
    try:
        from tests.llm.golden import make_llamafactory_qwen2vl
    except ImportError:  # the worker: this folder is sys.path[0]
        sys.path.insert(0, str(HERE))
        import make_llamafactory_qwen2vl
    return make_llamafactory_qwen2vl


def rows_of(indexes: list[int]) -> list[dict]:
    return [base().ROWS[index] for index in indexes]


def run_llamafactory() -> tuple[dict, dict]:
    from types import SimpleNamespace

    import llamafactory
    import torch
    import transformers
    from llamafactory.data.collator import SFTDataCollatorWith4DAttentionMask
    from llamafactory.data.processor.supervised import PackedSupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    gen = base()
    tensors, metadata = {}, {}
    for case, (neat, indexes, cutoff_len) in CASES.items():
        tokenizer = gen.make_tokenizer()
        data_args = DataArguments(template="qwen2_vl", cutoff_len=cutoff_len, packing=True, neat_packing=neat)
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        processor = SimpleNamespace(
            image_processor=gen.make_image_processor(),
            image_max_pixels=IMAGE_MAX_PIXELS,
            image_min_pixels=gen.IMAGE_MIN_PIXELS,
            model_input_names=["input_ids", "attention_mask", "pixel_values", "image_grid_thw"],
        )
        rows = rows_of(indexes)
        batch = {
            "_prompt": [gen.messages_of(row)[:-1] for row in rows],
            "_response": [gen.messages_of(row)[-1:] for row in rows],
            "_system": [""] * len(rows),
            "_tools": [""] * len(rows),
            "_images": [[gen.make_image(name) for name in row["images"]] or None for row in rows],
            "_videos": [None] * len(rows),
            "_audios": [None] * len(rows),
        }
        packer = PackedSupervisedDatasetProcessor(
            template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
        )
        packed = packer.preprocess_dataset(batch)
        for key in ("input_ids", "labels", "attention_mask", "position_ids"):
            tensors[f"{case}.rows.{key}"] = torch.tensor(packed[key], dtype=torch.int64)
        tensors[f"{case}.rows.images"] = torch.tensor([len(images or []) for images in packed["images"]])
        model = gen.make_model(tokenizer)
        model.config._attn_implementation = "eager"
        collator = SFTDataCollatorWith4DAttentionMask(
            template=template,
            processor=processor,
            model=model,
            tokenizer=tokenizer,
            pad_to_multiple_of=8,
            label_pad_token_id=-100,
            block_diag_attn=neat,
            neat_packing=neat,
            attn_implementation="eager",
            compute_dtype=torch.float32,
        )
        features = []
        for index in range(len(packed["input_ids"])):
            feature = {key: packed[key][index] for key in ("input_ids", "labels", "attention_mask", "position_ids")}
            feature["images"] = packed["images"][index]
            if neat:
                feature["packing_params"] = packed["packing_params"][index]
            features.append(feature)
        if neat:
            metadata[f"json.{case}.packing_params"] = json.dumps(packed["packing_params"])
        try:
            out = collator([dict(feature) for feature in features])
            with torch.no_grad():
                tensors[f"loss.{case}"] = model(**out).loss.detach().reshape(1).float()
        except Exception as error:  # noqa: BLE001 - recorded: where LLaMA-Factory itself fails
            metadata[f"error.{case}"] = f"{type(error).__name__}: {error}"
            continue
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{case}.{key}"] = value.detach().contiguous().clone()
    import PIL

    metadata["versions"] = json.dumps(
        {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__, "pillow": PIL.__version__}
    )
    return tensors, metadata


def run_llamafactory_training() -> dict:
    """Three sft steps of LLaMA-Factory's run_exp with neat_packing on make_llamafactory_qwen2vl_train.py's folder,
    data and processor (TRAIN_KEYS over multimodal_cases.train_config): logged losses and grad norms."""
    import tempfile

    sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[2])]  # the data folder's video: tests.llm.media_files
    import make_llamafactory_qwen2vl_train as train_gen
    import multimodal_cases as cases
    from llamafactory.train.tuner import run_exp
    from transformers import AutoProcessor, Qwen2VLImageProcessor

    def image_only(path, *args, **kwargs):
        return train_gen._processor_class()(Qwen2VLImageProcessor.from_pretrained(path), None)

    AutoProcessor.from_pretrained = staticmethod(image_only)
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        data = cases.make_data_folder(root / "data")
        model = cases.make_model_folder(root / "model")
        config = cases.train_config(model, data, root / "out", **TRAIN_KEYS)
        for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
            config.pop(key)
        config.update(bf16=False, fp16=False, plot_loss=False)
        run_exp(config)
        history = json.loads((root / "out" / "trainer_state.json").read_text())["log_history"]
    return {
        "loss": [entry["loss"] for entry in history if "loss" in entry],
        "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--families", action="store_true", help="only the families' cases, added into the file")
    parser.add_argument("--pillow", default=str(HERE.parents[2] / "bench/.cache/pillow12"), help="Pillow 12.3's copy")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from safetensors.torch import save_file

        if args.families:
            from safetensors import safe_open

            with safe_open(str(GOLDEN), "pt") as f:
                kept = [key for key in f.keys() if not key.startswith(("family.", "loss.family."))]
                tensors = {key: f.get_tensor(key) for key in kept}
                metadata = {key: value for key, value in f.metadata().items() if ".family." not in key}
            run_llamafactory_families(tensors, metadata)
        else:
            tensors, metadata = run_llamafactory()
            metadata["json.train"] = json.dumps(run_llamafactory_training())
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    paths = [os.path.abspath(path) for path in (args.pillow, *args.stubs.split(os.pathsep)) if os.path.isdir(path)]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(paths),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    subprocess.run([args.python, __file__, "--worker", *(["--families"] if args.families else [])], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
