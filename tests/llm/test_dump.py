"""`lathe data preview CONFIG --dump FILE`: every example (after cutoff, dataset order) and the training
collator's tensors for each example alone and for each pair, as safetensors; how lathe and LLaMA-Factory
are compared tensor for tensor."""

import json

import pytest

pytest.importorskip("datasets")
pytest.importorskip("safetensors")


@pytest.fixture
def data_dir(tmp_path):
    rows = [
        {"instruction": f"What is {a} plus {b}?", "input": "", "output": f"{a} plus {b} is {a + b}." * (1 + a % 3)}
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 0)]
    ]
    (tmp_path / "add.json").write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"add": {"file_name": "add.json"}}))
    return tmp_path


def _config(model_dir, data_dir, tmp_path, write_yaml, **extra):
    values = {
        "model_name_or_path": model_dir,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "dataset": "add",
        "dataset_dir": str(data_dir),
        "template": "chatml",
        "cutoff_len": 24,
        "output_dir": str(tmp_path / "out"),
        "overwrite_cache": True,
        **extra,
    }
    return write_yaml(tmp_path / "config.yaml", values)


def test_dump_writes_examples_singles_and_pairs(tiny_model_dir, data_dir, tmp_path, write_yaml, capsys, monkeypatch):
    from safetensors import safe_open

    from lathe.llm.commands import data_preview_command

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = _config(tiny_model_dir, data_dir, tmp_path, write_yaml)
    dump = tmp_path / "dump.safetensors"
    assert data_preview_command(config, [], num_examples=1, dump=str(dump)) == 0
    assert f"Wrote 5 examples and the collator's tensors for each one and 2 pairs to {dump}" in capsys.readouterr().out

    with safe_open(str(dump), "pt") as f:
        keys = set(f.keys())
        tensors = {key: f.get_tensor(key) for key in keys}
        metadata = f.metadata() or {}
    assert not [key for key in metadata if key.startswith("error.")]
    for index in range(5):
        ids, labels, mask = (tensors[f"example.{index}.{c}"] for c in ("input_ids", "labels", "attention_mask"))
        assert ids.dtype == labels.dtype == mask.dtype == __import__("torch").int64
        assert len(ids) <= 24 and mask.tolist() == [1] * len(ids)  # cutoff applied before the dump
        assert (labels != -100).sum() > 0 and (labels == -100).sum() > 0  # the prompt is not trained
        single = tensors[f"single.{index}.input_ids"]
        # training pads to a multiple of 8 (LLaMA-Factory's pad_to_multiple_of with do_train) on the right
        assert single.shape == (1, -(-len(ids) // 8) * 8)
        assert single[0, : len(ids)].tolist() == ids.tolist()
        assert tensors[f"single.{index}.labels"][0, len(ids) :].eq(-100).all()
        assert tensors[f"single.{index}.attention_mask"][0].sum() == len(ids)
    assert "example.5.input_ids" not in keys and "pair.2.input_ids" not in keys  # the odd last example has no pair
    for pair in range(2):
        lengths = [len(tensors[f"example.{2 * pair + side}.input_ids"]) for side in (0, 1)]
        batch = tensors[f"pair.{pair}.input_ids"]
        assert batch.shape == (2, -(-max(lengths) // 8) * 8)
        assert tensors[f"pair.{pair}.attention_mask"].sum(-1).tolist() == lengths
        for side in (0, 1):
            assert batch[side, : lengths[side]].tolist() == tensors[f"example.{2 * pair + side}.input_ids"].tolist()
    assert any(len(tensors[f"example.{i}.input_ids"]) == 24 for i in range(5))  # some rows were cut


def test_dump_keeps_non_tensor_values_and_collator_errors_in_metadata(tmp_path):
    import torch
    from safetensors import safe_open

    from lathe.llm.data.dump import dump_examples

    rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "attention_mask": [1, 1, 1]}] * 3

    def collator(features):
        if len(features) == 2:
            raise ValueError("pairs are refused")
        return {"input_ids": torch.tensor([features[0]["input_ids"]]), "max_length": len(features[0]["input_ids"])}

    path = tmp_path / "dump.safetensors"
    assert dump_examples(rows, collator, str(path)) == {"examples": 3, "pairs": 1, "errors": 1}
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
        assert f.get_tensor("single.2.input_ids").tolist() == [[1, 2, 3]]
        assert "pair.0.input_ids" not in set(f.keys())
    assert metadata["json.single.0.max_length"] == "3"
    assert metadata["error.pair.0"] == "ValueError: pairs are refused"


def test_dump_refuses_a_stage_it_cannot_collate(tiny_model_dir, data_dir, tmp_path, write_yaml, capsys, monkeypatch):
    from lathe.llm.commands import data_preview_command

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = _config(tiny_model_dir, data_dir, tmp_path, write_yaml)
    code = data_preview_command(config, ["stage=dpo"], num_examples=0, dump=str(tmp_path / "d.safetensors"))
    err = capsys.readouterr().err
    assert code == 2 and "--dump supports stage sft and pt, not 'dpo'" in err
