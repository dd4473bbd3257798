"""`lathe train` (stage sft) with the families beside Qwen2-VL: each family's tiny random-weight model, processor and
tokenizer (built by tests/llm/golden/make_llamafactory_families.py) saved in a folder, the golden's first two rows
written as a dataset (images as PNG, audio as 32-bit PCM WAV), two steps of one batch of both rows. The first step's
loss is the loss of LLaMA-Factory 0.9.5's collated batch of the same rows (tests/llm/golden/
llamafactory_families.safetensors, "pair.0") on the same model; the second step trained on it."""

import importlib.util
import json
import wave
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.llm.test_multimodal_families import GEN, GOLDEN_DIR, golden_batch  # noqa: E402  (the golden generator, loaded once)

FAMILIES = ["llava", "llava_next", "gemma3", "paligemma", "mllama", "qwen2_audio"]


def _write_wav(path: Path, samples) -> None:
    """32-bit PCM: the golden's float32 waveform to within 2**-31."""
    import numpy as np

    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(4)
        handle.setframerate(GEN.SAMPLING_RATE)
        handle.writeframes(np.round(samples.astype("float64") * 2**31).astype("<i4").tobytes())


def _folders(root: Path, family: str) -> tuple[Path, Path, float]:
    """(model folder, data folder, the golden batch's loss on the model)."""
    from safetensors import safe_open

    from lathe.llm.config.train import DataArguments
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tokenizer = GEN.make_tokenizer(family)
    # the processor's and the template's tokens first (the golden's order): the model's vocabulary holds them
    processor = GEN.make_processor(family, tokenizer)
    get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.FAMILIES[family][0]))
    model = GEN.make_model(family, tokenizer)
    with safe_open(str(GOLDEN_DIR / "llamafactory_families.safetensors"), "pt") as f:
        tensors, metadata = {key: f.get_tensor(key) for key in f.keys()}, f.metadata()
    batch = golden_batch(tensors, metadata, family, "pair.0")
    with torch.no_grad():  # in training mode, as the trainer runs it (PaliGemma's prefix attention needs it)
        reference = model.train()(**batch).loss.item()
    folder, data = root / "model", root / "data"
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    data.mkdir()
    rows = []
    for row in GEN.rows_of(family)[:2]:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        for name in row.get("images", []):
            GEN.make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        for name in row.get("audios", []):
            _write_wav(data / f"{name}.wav", GEN.make_audio(name))
            item.setdefault("audios", []).append(f"{name}.wav")
        rows.append(item)
    kind = "audios" if "audios" in rows[0] else "images"
    (data / "rows.json").write_text(json.dumps(rows))
    info = {
        "file_name": "rows.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", kind: kind},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    }
    (data / "dataset_info.json").write_text(json.dumps({"rows": info}))
    return folder, data, reference


@pytest.mark.parametrize("family", FAMILIES)
def test_lathe_train_two_sft_steps_start_at_llamafactory_loss(family, tmp_path):
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train

    model, data, reference = _folders(tmp_path, family)
    config = {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(data),
        "template": GEN.FAMILIES[family][0],
        "cutoff_len": GEN.CUTOFF_LEN,
        **GEN.settings_of(family),
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 2,
        "learning_rate": 1.0e-2,
        "max_steps": 2,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "dataloader_num_workers": 0,
    }
    run_train(parse_train_config(config))
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 2 and losses[0] == pytest.approx(reference, abs=1e-4)
    assert losses[1] < losses[0]  # the second step saw the trained weights (same batch, lr 1e-2)


def test_paligemma_image_prefix_counts_against_cutoff_len(tmp_path):
    """LLaMA-Factory counts the image prefix first: the encoded row, prefix included, is at most cutoff_len."""
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.setup import load_data

    model, data, _ = _folders(tmp_path, "paligemma")
    keys = {"model_name_or_path": str(model), "stage": "sft", "do_train": True, "dataset": "rows"}
    keys.update(dataset_dir=str(data), template="paligemma", cutoff_len=16, output_dir=str(tmp_path / "out"))
    tokenizer, _, datasets = load_data(parse_train_config({**keys, "use_cpu": True}), stage="sft")
    rows = datasets["train_dataset"]["input_ids"]
    image = tokenizer.convert_tokens_to_ids("<image>")
    assert [len(ids) for ids in rows] == [16, 16]
    assert [ids.count(image) for ids in rows] == [4, 8] and rows[1][:8] == [image] * 8  # 4 tokens per image


@pytest.mark.parametrize(
    "family, package", [("pixtral", "torchvision"), ("intern_vl", "torchvision"), ("gemma3n", "timm")]
)
def test_a_family_whose_processor_needs_a_missing_package_names_it(family, package):
    from types import SimpleNamespace

    from lathe.llm.multimodal.encode import MediaEncoder

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    template = SimpleNamespace(name=family, multimodal=family)
    encoder = MediaEncoder(template, None, "unused", processor=SimpleNamespace())
    with pytest.raises(ValueError, match=f"the {family} family needs {package} .*pip install {package}"):
        _ = encoder.plugin
