"""Regenerate LLaMA-Factory 0.9.5's three-step training runs of the families beside Qwen2-VL (LLaVA-1.5, LLaVA-NeXT,
Gemma 3, PaliGemma, Llama 3.2 Vision, Qwen2-Audio) that tests/llm/test_multimodal_families_train.py compares
`lathe train` against.

    python tests/llm/golden/make_llamafactory_families_train.py [--python /tmp/mm-lf-venv/bin/python]

Runs this file in LLaMA-Factory's environment (`--worker`; lathe is not imported there): each family's tiny
random-weight model, processor, tokenizer and two-row dataset as make_llamafactory_families.write_folders saves them,
trained by LLaMA-Factory's own `run_exp` with CASES' keys over train_config. Writes
tests/llm/golden/llamafactory_families_train.json: per case the logged losses and grad norms, and the trainable and
total parameter counts when training starts (or the error LLaMA-Factory stopped with).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_families_train.json"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
# case -> (family, keys over train_config); full tuning keeps LLaMA-Factory's default frozen vision tower
CASES = {
    "llava_full": ("llava", {}),
    "llava_next_full": ("llava_next", {}),
    "gemma3_full": ("gemma3", {}),
    "paligemma_full": ("paligemma", {}),
    "mllama_full": ("mllama", {}),
    "qwen2_audio_full": ("qwen2_audio", {}),
    "llava_lora": ("llava", LORA),
    "qwen2_audio_lora": ("qwen2_audio", LORA),
    "gemma3_lora": ("gemma3", LORA),
    "mllama_lora": ("mllama", LORA),
    "paligemma_open_tower": ("paligemma", {"freeze_vision_tower": False}),
    "llava_projector_only": ("llava", {"freeze_language_model": True, "freeze_multi_modal_projector": False}),
    "qwen2_audio_open_tower": ("qwen2_audio", {"freeze_vision_tower": False}),
    "llava_dpo": ("llava", {**LORA, "stage": "dpo", "dataset": "pairs", "pref_beta": 0.1}),
    "qwen2_audio_dpo": ("qwen2_audio", {**LORA, "stage": "dpo", "dataset": "pairs", "pref_beta": 0.1}),
    "llava_kto": ("llava", {**LORA, "stage": "kto", "dataset": "kto", "pref_beta": 0.1}),
    "qwen2_audio_kto": ("qwen2_audio", {**LORA, "stage": "kto", "dataset": "kto", "pref_beta": 0.1}),
}


def families_generator():
    spec = importlib.util.spec_from_file_location("make_families", HERE / "make_llamafactory_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_config(gen, family: str, model: Path, data: Path, output: Path, **keys) -> dict:
    """Three steps (sft unless keys say) of one batch of the family's two rows, on CPU, the families golden's media settings."""
    return {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(data),
        "template": gen.FAMILIES[family][0],
        "cutoff_len": gen.CUTOFF_LEN,
        **gen.settings_of(family),
        "output_dir": str(output),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-2,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "use_cpu": True,
        "preprocessing_num_workers": None,
        "dataloader_num_workers": 0,
        **keys,
    }


def _wav_reader() -> None:
    """LLaMA-Factory's plugins read audio files with torchaudio.load, and no CPU torchaudio exists here (the stubs'
    torchaudio raises on use): its mm_plugin module is given a `load` that reads the 32-bit PCM WAV files written
    here as torchaudio does ((channels, samples) float32, divided by 2**31). No resampling is reached: the files
    are at audio_sampling_rate."""
    from types import SimpleNamespace

    import numpy as np
    import torch
    from llamafactory.data import mm_plugin

    def load(path):
        import wave

        with wave.open(str(path), "rb") as handle:
            assert handle.getsampwidth() == 4, path
            frames = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i4")
            rate, channels = handle.getframerate(), handle.getnchannels()
        samples = (frames.astype("float32") / 2**31).reshape(-1, channels).T
        return torch.from_numpy(np.ascontiguousarray(samples)), rate

    mm_plugin.torchaudio = SimpleNamespace(load=load)


def run_llamafactory(names: list[str]) -> dict:
    import llamafactory
    import transformers
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    gen = families_generator()
    _wav_reader()

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    class Count(TrainerCallback):
        counts = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    results = {"versions": {"transformers": transformers.__version__, "llamafactory": llamafactory.__version__}}
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        for name in names:
            family, keys = CASES[name]
            model, data, _ = gen.write_folders(root / name, family, fix_tokenizer)
            config = train_config(gen, family, model, data, root / name / "out", **keys)
            for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
                config.pop(key)
            config.update(bf16=False, fp16=False, plot_loss=False)
            count = Count()
            try:
                run_exp(config, callbacks=[count])
            except Exception as error:  # recorded: the docs say what lathe's test does instead
                traceback.print_exc()
                results[name] = {"error": f"{type(error).__name__}: {error}"}
                continue
            with open(root / name / "out" / "trainer_state.json") as handle:
                history = json.load(handle)["log_history"]
            results[name] = {
                "loss": [entry["loss"] for entry in history if "loss" in entry],
                "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
                "trainable": count.counts[0],
                "total": count.counts[1],
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="/tmp/mm-lf-venv/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="/tmp/mm-lf-stubs", help="the torchaudio stand-in")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        results = run_llamafactory(args.cases.split(","))
        if GOLDEN.exists():  # a subset of cases updates only those
            results = {**json.loads(GOLDEN.read_text()), **results}
        GOLDEN.write_text(json.dumps(results, indent=1) + "\n")
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
    subprocess.run([args.python, __file__, "--worker", "--cases", args.cases], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
