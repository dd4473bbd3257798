"""Resuming from a checkpoint whose weights were re-laid out as shards (model.safetensors.index.json and
the files it lists), as transformers' tests do to a checkpoint and as large models are saved: the run
continues bit for bit; a missing or truncated shard is an error naming it."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from lathe.train.checkpoints import layout as ckpt
from tests.train.test_resume import assert_resumed_exactly, train


def shard(folder, per_shard: int = 1) -> list[str]:
    """Replace folder's model.safetensors by shards of `per_shard` tensors and an index."""
    state = load_file(os.path.join(folder, ckpt.WEIGHTS_NAME))
    os.remove(os.path.join(folder, ckpt.WEIGHTS_NAME))
    keys = sorted(state)
    groups = [keys[i : i + per_shard] for i in range(0, len(keys), per_shard)]
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for name, group in zip(names, groups):
        save_file({key: state[key] for key in group}, os.path.join(folder, name), metadata={"format": "pt"})
    weight_map = {key: name for name, group in zip(names, groups) for key in group}
    with open(os.path.join(folder, ckpt.WEIGHTS_INDEX_NAME), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return names


@pytest.mark.parametrize("per_shard", [1, 3])
def test_resume_from_a_sharded_checkpoint_is_bitwise_exact(tmp_path, per_shard):
    full = train(tmp_path / "full")
    checkpoint = tmp_path / "full" / "checkpoint-8"
    assert len(shard(checkpoint, per_shard)) == 4 // per_shard + (4 % per_shard > 0)
    assert ckpt.checkpoint_problem(str(checkpoint)) is None
    resumed = train(tmp_path / "resumed", resume=str(checkpoint))
    assert_resumed_exactly(full, resumed, 8)


def test_a_missing_or_truncated_shard_is_named(tmp_path):
    train(tmp_path / "full", max_steps=4)
    checkpoint = tmp_path / "full" / "checkpoint-4"
    names = shard(checkpoint)
    last = checkpoint / names[-1]
    last.write_bytes(last.read_bytes()[:-3])
    with pytest.raises(ValueError, match="checkpoint-4"):
        train(tmp_path / "again", resume=str(checkpoint))
    assert "missing" in ckpt.checkpoint_problem(str(checkpoint))
    os.remove(last)
    assert ckpt.checkpoint_problem(str(checkpoint)) == f"{ckpt.WEIGHTS_NAME} is missing"


class GrowingBuffer(torch.nn.Module):
    """Records what it trained on in a buffer that grows, and resizes it in its own load_state_dict."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 1)
        self.register_buffer("seen", torch.empty(0))

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if "seen" in state_dict and state_dict["seen"].shape != self.seen.shape:
            self.seen = state_dict["seen"].clone()
        return super().load_state_dict(state_dict, strict=strict)

    def forward(self, x, labels=None, sample_id=None):
        self.seen = torch.cat([self.seen, x[:, 0].detach()])
        return {"loss": ((self.fc(x).squeeze(-1) - labels) ** 2).mean()}


def test_a_model_that_overrides_load_state_dict_decides_about_shapes_itself(tmp_path):
    """As in transformers, the file's tensors go to the model's own load_state_dict (lathe's shape check
    would refuse the grown buffer)."""
    full = train(tmp_path / "full", model=GrowingBuffer(), max_steps=4)
    resumed = train(
        tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-4"), model=GrowingBuffer(), max_steps=6
    )
    assert full.model.seen.shape == (8,) and resumed.model.seen.shape == (12,)
    assert torch.equal(resumed.model.seen[:8], full.model.seen)


@pytest.mark.hf
@pytest.mark.parametrize("strict", [True, False])
def test_load_sharded_checkpoint_loads_as_transformers(tmp_path, strict):
    from transformers import trainer_utils

    from lathe.trainer_utils import load_sharded_checkpoint

    source = GrowingBuffer()
    torch.nn.init.normal_(source.fc.weight)
    save_file({"fc.weight": source.fc.weight.detach().clone()}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"fc.bias": source.fc.bias.detach().clone()}, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {"fc.weight": "model-00001-of-00002.safetensors", "fc.bias": "model-00002-of-00002.safetensors"}
    (tmp_path / ckpt.WEIGHTS_INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    results = []
    for load in (load_sharded_checkpoint, trainer_utils.load_sharded_checkpoint):
        target = GrowingBuffer()  # its "seen" buffer is not in the shards: missing, allowed only when not strict
        if strict:
            target = torch.nn.Sequential()
            target.fc = torch.nn.Linear(4, 1)
        result = load(target, str(tmp_path), strict=strict)
        assert torch.equal(target.fc.weight, source.fc.weight) and torch.equal(target.fc.bias, source.fc.bias)
        results.append((sorted(result.missing_keys), sorted(result.unexpected_keys)))
    assert results[0] == results[1] == ([] if strict else ["seen"], [])
    with pytest.raises(RuntimeError, match="missing keys"):
        load_sharded_checkpoint(GrowingBuffer(), str(tmp_path))
    with pytest.raises(ValueError, match="Can't find a checkpoint index"):
        load_sharded_checkpoint(GrowingBuffer(), str(tmp_path / "nowhere"))
