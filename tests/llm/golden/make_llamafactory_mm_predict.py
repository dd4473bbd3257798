"""Regenerate LLaMA-Factory 0.9.5's generated_predictions.jsonl on Qwen2-VL image rows that
tests/llm/test_multimodal_predict.py compares `lathe train` (do_predict, predict_with_generate) against.

    python tests/llm/golden/make_llamafactory_mm_predict.py [--python bench/.venv-lf/bin/python]
        [--stubs bench/lf_stubs:<a folder with lathe's Pillow>]

Runs this file in LLaMA-Factory's environment (`--worker`; lathe is not imported there): the tiny Qwen2-VL model
folder (its weight matrices scaled, make_model_folder), images and mllm_demo rows of tests/llm/multimodal_cases.py, with make_llamafactory_qwen2vl_train.py's
image-only processor (no torchvision here), through LLaMA-Factory's own run_exp with KEYS (greedy decoding of a few
tokens from the untrained model). Writes tests/llm/golden/llamafactory_mm_predict.json: the lines of its
generated_predictions.jsonl and its predict metrics' sample count, with the versions. Pillow versions resample
differently: run it with the Pillow of lathe's environment on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_mm_predict.json"
# over multimodal_cases.train_config: no training, generation on the four mllm_demo rows (three with images)
KEYS = {
    "do_train": False,
    "do_predict": True,
    "predict_with_generate": True,
    "eval_dataset": "mllm_demo",
    "per_device_eval_batch_size": 2,
    "max_new_tokens": 6,
    "do_sample": False,
}


WEIGHT_SCALE = 8  # the tiny random model's matrices scaled up: its greedy tokens then depend on the image


def make_model_folder(path: Path, cases) -> Path:
    """multimodal_cases' tiny Qwen2-VL folder with every weight matrix x WEIGHT_SCALE (at the initial scale its greedy
    tokens are nearly the same whatever the image: a test could not tell whether the pixels reached generate)."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    cases.make_model_folder(path)
    model = Qwen2VLForConditionalGeneration.from_pretrained(str(path))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.mul_(WEIGHT_SCALE)
    model.save_pretrained(str(path))
    return path


def run_llamafactory() -> dict:
    sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[2])]  # the data folder's video: tests.llm.media_files
    import llamafactory
    import make_llamafactory_qwen2vl_train as train_gen
    import multimodal_cases as cases
    import PIL
    import transformers
    from llamafactory.train.tuner import run_exp
    from transformers import AutoProcessor, Qwen2VLImageProcessor

    def image_only(path, *args, **kwargs):
        return train_gen._processor_class()(Qwen2VLImageProcessor.from_pretrained(path), None)

    AutoProcessor.from_pretrained = staticmethod(image_only)
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        data = cases.make_data_folder(root / "data")
        model = make_model_folder(root / "model", cases)
        config = cases.train_config(model, data, root / "out", **KEYS)
        for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers", "dataset"):
            config.pop(key)
        config.update(bf16=False, fp16=False, plot_loss=False)
        run_exp(config)
        lines = (root / "out" / "generated_predictions.jsonl").read_text().splitlines()
        metrics = json.loads((root / "out" / "predict_results.json").read_text())
    return {
        "versions": {
            "llamafactory": llamafactory.__version__,
            "transformers": transformers.__version__,
            "pillow": PIL.__version__,
        },
        "predictions": [json.loads(line) for line in lines],
        "predict_samples": len(lines),
        "metric_keys": sorted(metrics),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(), indent=1) + "\n")
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=args.stubs,
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
