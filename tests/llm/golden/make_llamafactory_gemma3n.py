"""Regenerate LLaMA-Factory 0.9.5's losses and three-step trainings of a tiny Gemma 3n (Gemma3nForConditionalGeneration,
whose vision tower is timm's MobileNetV5) that tests/llm/test_multimodal_gemma3n.py compares lathe against.

    python tests/llm/golden/make_llamafactory_gemma3n.py [--python bench/.venv-lf/bin/python]

Runs this same file in LLaMA-Factory's environment (`--worker`; lathe is not imported there) with torchvision and timm
through the test recipe (tests/llm/torchvision_recipe.py), the torchaudio stand-in and Pillow 12.3 first on the path
(`--pillow`). The processor, tokenizer and rows are the families golden's (make_llamafactory_families.py: 28x28
images, 4 mel bins, an image and an audio in one row and a row without either); the model is make_model's tiny one,
every weight set by a generator seeded by its name (make_llamafactory_families._same_weights). Records, as JSON in
llamafactory_gemma3n.json: for each row alone and for the pair, the ids LLaMA-Factory's SupervisedDatasetProcessor and
MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8, with the model) make and the model's loss on that batch; then
LLaMA-Factory's `run_exp` for three steps of one batch of both rows (CASES): losses, grad norms, trainable and total
parameter counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_gemma3n.json"
TEMPLATE = "gemma3n"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
# case -> keys over train_config; full tuning keeps LLaMA-Factory's default frozen vision tower (and audio tower)
# `lora_target: all` stops in LLaMA-Factory 0.9.5 (recorded): its linear-module search yields the bare name "0" (the
# text model's altup_projections.0, an nn.Linear in a ModuleList), which peft then matches to the decoder layer
# `layers.0` and refuses; the attention projections named are the LoRA run both sides train.
CASES = {
    "gemma3n_full": {},
    "gemma3n_lora": LORA,
    "gemma3n_lora_attention": {**LORA, "lora_target": "q_proj,k_proj,v_proj,o_proj"},
}
STOPS = ("gemma3n_lora",)  # the cases LLaMA-Factory stops on
# The smallest MobileNetV5 encoder a saved config can hold: timm's registered `mobilenetv5_300m_enc` (its 84-block
# list is fixed in timm's code) with every width scaled down to timm's floor of 8 (16 in the last stage) and an 8-channel
# stem. timm does take a replaced block list (`block_args`), but rewrites those dicts in place while building (it pops
# block_type, adds layer classes), so the config can no longer be saved or built again, and LLaMA-Factory's run_exp
# saves it. The fusion adapter's output width is fixed at 2048 in timm (MobileNetV5Encoder.num_features), so the vision
# hidden size stays 2048; a 2x2 output resolution gives 4 soft tokens per image, the processor's image_seq_length.
VISION_MODEL_ARGS = {"channel_multiplier": 0.01, "stem_size": 8, "msfa_output_resolution": 2}
VISION_SOFT_TOKENS, AUDIO_SOFT_TOKENS = 4, 3  # the families golden's Gemma3nProcessor (image / audio_seq_length)


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAMILIES = _module("make_families", HERE / "make_llamafactory_families.py")
ROWS = FAMILIES.MIXED_ROWS


def make_tokenizer():
    return FAMILIES.make_tokenizer("gemma3n")


def make_processor(tokenizer):
    return FAMILIES.make_processor("gemma3n", tokenizer)


def make_model(tokenizer):
    """A tiny Gemma3nForConditionalGeneration: one text layer of hidden 16 (AltUp's 2 streams, per-layer inputs of 4,
    LAuReL rank 2, no shared key-value layers, no activation sparsity), the smallest MobileNetV5 above (1.3M parameters), a one-layer
    conformer audio tower of hidden 16 over the extractor's 4 mel bins, 3 features per audio. The media embedders' vocabularies (4 each) sit
    right after the tokenizer's and the text vocabulary holds them, as Gemma 3n's 262,144 + 128 + 128 (the model pads
    short audio features with the embedding of the last id, text vocab_size - 1). Every weight set by
    name (_same_weights), so transformers 5.6 and 5.23 hold one model."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    ids = tokenizer.convert_tokens_to_ids
    text_vocab = len(tokenizer)
    text = tf.Gemma3nTextConfig(
        vocab_size=text_vocab + 8,
        vocab_size_per_layer_input=text_vocab,
        hidden_size=16,
        hidden_size_per_layer_input=4,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        layer_types=["full_attention"],
        altup_num_inputs=2,
        laurel_rank=2,
        num_kv_shared_layers=0,
        activation_sparsity_pattern=[0.0],
    )
    vision = tf.Gemma3nVisionConfig(model_args=dict(VISION_MODEL_ARGS), vocab_size=4, vocab_offset=text_vocab)
    audio = tf.Gemma3nAudioConfig(
        vocab_size=4,
        vocab_offset=text_vocab + 4,
        input_feat_size=4,
        hidden_size=16,
        conf_num_attention_heads=2,
        conf_num_hidden_layers=1,
        sscp_conv_channel_size=[4, 4],
        # the extractor pads every waveform to 30 s (3000 frames): two time strides of 8 and one frame in 16 kept
        # give the processor's 3 soft tokens (Gemma 3n's 2, 2 and 4 give its 188)
        sscp_conv_stride_size=[[8, 1], [8, 1]],
        conf_reduction_factor=16,
    )
    config = tf.Gemma3nConfig(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        audio_soft_tokens_per_image=AUDIO_SOFT_TOKENS,
        vision_soft_tokens_per_image=VISION_SOFT_TOKENS,
        boi_token_id=ids("<start_of_image>"),
        eoi_token_id=ids("<end_of_image>"),
        image_token_id=ids("<image_soft_token>"),
        boa_token_id=ids("<start_of_audio>"),
        eoa_token_id=ids("<end_of_audio>"),
        audio_token_id=ids("<audio_soft_token>"),
    )
    return FAMILIES._same_weights(tf.Gemma3nForConditionalGeneration(config)).eval()


def weights_sum(model) -> float:
    return float(sum(parameter.detach().double().sum() for parameter in model.parameters()))


def batch_names() -> dict:
    """batch name -> the row indexes it holds: each row alone and the pair."""
    return {"single.0": [0], "single.1": [1], "pair.0": [0, 1]}


def run_losses() -> dict:
    """LLaMA-Factory's encoding and collation of each batch and the tiny model's loss on it."""
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    tokenizer = make_tokenizer()
    processor = make_processor(tokenizer)
    data_args = DataArguments(template=TEMPLATE, cutoff_len=FAMILIES.CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    for key, value in FAMILIES.settings_of("gemma3n").items():  # LLaMA-Factory's patch_processor
        setattr(processor, key, value)
    media = [FAMILIES.media_of("gemma3n", row) for row in ROWS]
    batch = {
        "_prompt": [FAMILIES.messages_of(row)[:-1] for row in ROWS],
        "_response": [FAMILIES.messages_of(row)[-1:] for row in ROWS],
        "_system": [""] * len(ROWS),
        "_tools": [""] * len(ROWS),
        "_images": [item["images"] or None for item in media],
        "_videos": [None] * len(ROWS),
        "_audios": [item["audios"] or None for item in media],
    }
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    encoded = encoder.preprocess_dataset(batch)
    model = make_model(tokenizer)
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template, processor=processor, model=model, tokenizer=tokenizer, pad_to_multiple_of=8
    )
    features = []
    for index in range(len(ROWS)):
        feature = {key: encoded[key][index] for key in ("input_ids", "labels", "attention_mask")}
        feature.update(images=encoded["images"][index], videos=None, audios=encoded["audios"][index])
        features.append(feature)
    out = {"weights": weights_sum(model), "processor": type(processor.image_processor).__name__, "batches": {}}
    for name, indexes in batch_names().items():
        collated = collator([dict(features[index]) for index in indexes])
        with torch.no_grad():
            loss = model(**collated).loss.item()
        out["batches"][name] = {
            "keys": sorted(collated),
            "input_ids": collated["input_ids"].tolist(),
            "labels": collated["labels"].tolist(),
            "loss": loss,
        }
    return out


def write_folders(root: Path, fix_tokenizer) -> tuple[Path, Path]:
    """(model folder, data folder): the tiny model, processor and tokenizer saved, and both rows as dataset "rows"
    (the image as PNG, the audio as 32-bit PCM WAV). fix_tokenizer(tokenizer, template) is lathe's or LLaMA-Factory's
    template fix, run before the model is built (the vocabulary it sizes)."""
    tokenizer = make_tokenizer()
    processor = make_processor(tokenizer)
    fix_tokenizer(tokenizer, TEMPLATE)
    folder, data = root / "model", root / "data"
    make_model(tokenizer).save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    data.mkdir(parents=True)
    rows = []
    for row in ROWS:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        for name in row["images"]:
            FAMILIES.make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        for name in row["audios"]:
            FAMILIES.write_wav(data / f"{name}.wav", FAMILIES.make_audio(name))
            item.setdefault("audios", []).append(f"{name}.wav")
        rows.append(item)
    (data / "rows.json").write_text(json.dumps(rows))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages", "images": "images", "audios": "audios"}
    info = {"rows": {"file_name": "rows.json", "formatting": "sharegpt", "columns": columns, "tags": tags}}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return folder, data


def train_config(model: Path, data: Path, output: Path, **keys) -> dict:
    """Three steps of one batch of both rows, on CPU, with the families golden's media settings."""
    return {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(data),
        "template": TEMPLATE,
        "cutoff_len": FAMILIES.CUTOFF_LEN,
        **FAMILIES.settings_of("gemma3n"),
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


def run_training(root: Path) -> dict:
    """LLaMA-Factory's run_exp on each case: logged losses and grad norms, trainable and total parameter counts."""
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    class Count(TrainerCallback):
        counts = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    results, folders = {}, write_folders(root, fix_tokenizer)
    for name, keys in CASES.items():
        config = train_config(*folders, root / name, **keys)
        for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
            config.pop(key)
        config.update(bf16=False, fp16=False, plot_loss=False)
        count = Count()
        try:
            run_exp(config, callbacks=[count])
        except Exception as error:  # recorded: the docs say what lathe does instead
            traceback.print_exc()
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        history = json.loads((root / name / "trainer_state.json").read_text())["log_history"]
        results[name] = {
            "loss": [entry["loss"] for entry in history if "loss" in entry],
            "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
            "trainable": count.counts[0],
            "total": count.counts[1],
        }
    return results


def run_llamafactory(train: bool) -> dict:
    import llamafactory
    import PIL
    import timm
    import torchvision
    import transformers

    make_train = _module("make_families_train", HERE / "make_llamafactory_families_train.py")
    make_train._wav_reader()  # no CPU torchaudio: the WAV files read as torchaudio.load reads them
    out = {"losses": run_losses()}
    if train:
        with tempfile.TemporaryDirectory() as root:
            out["train"] = run_training(Path(root))
    out["versions"] = {
        "llamafactory": llamafactory.__version__,
        "transformers": transformers.__version__,
        "torchvision": torchvision.__version__,
        "timm": timm.__version__,
        "pillow": PIL.__version__,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--pillow", default=str(HERE.parents[2] / "bench/.cache/pillow12"), help="Pillow 12.3")
    parser.add_argument("--no-train", action="store_true", help="skip the run_exp cases")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(not args.no_train), indent=1) + "\n")
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import timm_path, torchvision_paths

    shim, site = torchvision_paths()
    paths = [str(shim), args.pillow, args.stubs, str(site), str(timm_path())]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(path for path in paths if os.path.isdir(path)),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
        OMP_NUM_THREADS="1",
    )
    command = [args.python, __file__, "--worker"]
    subprocess.run(command + (["--no-train"] if args.no_train else []), check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
