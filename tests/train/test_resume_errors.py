"""Resume from a damaged or foreign checkpoint: one clear error that names the file and says what is
wrong, never a bare EOFError, a JSON position without the file, a size-mismatch traceback, or torch's
advice to unpickle with weights_only=False; and nothing in a pickle payload ever runs."""

from __future__ import annotations

import json
import os
import pickle
import traceback
from pathlib import Path

import pytest
import torch
from torch import nn

from lathe import Trainer
from lathe.train.checkpoints import layout as ckpt
from tests.train import crash_worker
from tests.train.trainer_helpers import pad_collate, tiny_llama, token_items, training_args

TORCH_FILES = [ckpt.OPTIMIZER_NAME, ckpt.SCHEDULER_NAME, "rng_state.pth", ckpt.SCALER_NAME]


def trainer_for(output_dir: Path, **arguments) -> Trainer:
    options = {"max_steps": 4, "save_steps": 2, "save_total_limit": None, "fp16": True}  # fp16: scaler.pt too
    options.update(arguments)
    return crash_worker.build_trainer(str(output_dir), {"args": options})


def checkpoint(tmp_path: Path, transformers_form: bool) -> Path:
    """checkpoint-2 of the job; in transformers' form (no lathe manifest) when asked: then nothing
    vouches for its files, and loading them is what must fail clearly."""
    trainer_for(tmp_path / "run", max_steps=2).train()
    folder = tmp_path / "run" / "checkpoint-2"
    if transformers_form:
        (folder / ckpt.MANIFEST_NAME).unlink()
    return folder


def resume_error(folder: Path, **arguments) -> BaseException:
    with pytest.raises(ValueError) as raised:
        trainer_for(folder.parent, **arguments).train(resume_from_checkpoint=str(folder))
    return raised.value


def whole_report(error: BaseException) -> str:
    """Everything a user sees printed for the error, chained exceptions included."""
    return "".join(traceback.format_exception(error))


def assert_never_advises_unpickling(error: BaseException) -> None:
    report = whole_report(error)
    assert "weights_only=False" not in report and "weights_only` set to `False" not in report, report


DAMAGES = {
    "empty": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "random bytes": lambda data: bytes((index * 151 + 7) % 256 for index in range(len(data))),
}
EXPECTED = {
    "empty": "is empty (0 bytes)",
    "truncated": "is corrupt or truncated",
    "random bytes": "refused to unpickle",
}


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("name", TORCH_FILES)
def test_a_damaged_torch_file_in_transformers_form_is_an_error_naming_it(tmp_path, name, damage):
    folder = checkpoint(tmp_path, transformers_form=True)
    path = folder / name
    path.write_bytes(DAMAGES[damage](path.read_bytes()))
    error = resume_error(folder)
    assert str(path) in str(error) and EXPECTED[damage] in str(error), str(error)
    assert error.__cause__ is None and (
        error.__context__ is None or error.__suppress_context__
    )  # no torch traceback under it
    assert_never_advises_unpickling(error)


def test_a_damaged_file_of_a_lathe_checkpoint_is_named_by_the_completeness_check(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=False)
    (folder / ckpt.OPTIMIZER_NAME).write_bytes(b"")
    error = resume_error(folder)
    assert "incomplete or corrupt" in str(error) and f"{ckpt.OPTIMIZER_NAME} has 0 bytes" in str(error)


class Payload:
    """Unpickling it would create the folder `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


@pytest.mark.parametrize("name", [ckpt.OPTIMIZER_NAME, "rng_state.pth"])
@pytest.mark.parametrize("form", ["torch.save", "pickle"])
def test_a_pickle_payload_is_refused_never_run_and_the_unsafe_option_never_suggested(tmp_path, name, form):
    folder = checkpoint(tmp_path, transformers_form=True)
    marker = tmp_path / "code-ran"
    if form == "torch.save":
        torch.save({"state": {}, "param_groups": [], "x": Payload(marker)}, folder / name)
    else:
        (folder / name).write_bytes(pickle.dumps({"python": Payload(marker)}))
    error = resume_error(folder)
    assert not marker.exists()
    assert f"lathe refused to unpickle '{folder / name}'" in str(error)
    if form == "torch.save":
        assert "makedirs" in str(error)  # what it refers to
    assert_never_advises_unpickling(error)


def test_garbage_trainer_state_is_an_error_naming_the_file(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=False)
    state = folder / ckpt.TRAINER_STATE_NAME
    size = state.stat().st_size
    state.write_bytes(b'{"global_step": 2, "epoch": ' + b"x" * (size - 28))  # same size: the manifest still agrees
    assert state.stat().st_size == size
    error = resume_error(folder)
    assert f"'{state}' is not valid JSON (Expecting value: line 1 column 29" in str(error)


def test_garbage_trainer_state_of_a_transformers_checkpoint_is_named(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=True)
    (folder / ckpt.TRAINER_STATE_NAME).write_text('{"global_step": 2, "epoch": xx}')
    error = resume_error(folder)
    assert "incomplete or corrupt" in str(error) and "trainer_state.json is not valid JSON" in str(error)


def test_a_trainer_state_value_of_the_wrong_type_is_named(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=True)
    state = json.loads((folder / ckpt.TRAINER_STATE_NAME).read_text())
    state["global_step"] = "two"
    (folder / ckpt.TRAINER_STATE_NAME).write_text(json.dumps(state))
    error = resume_error(folder)
    assert ckpt.TRAINER_STATE_NAME in str(error) and "global_step is 'two', expected int" in str(error)


def test_swapped_optimizer_and_scheduler_files_are_named(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=True)
    optimizer, scheduler = (folder / ckpt.OPTIMIZER_NAME).read_bytes(), (folder / ckpt.SCHEDULER_NAME).read_bytes()
    (folder / ckpt.OPTIMIZER_NAME).write_bytes(scheduler)
    (folder / ckpt.SCHEDULER_NAME).write_bytes(optimizer)
    error = resume_error(folder)
    assert f"'{folder / ckpt.OPTIMIZER_NAME}' does not fit this run's optimizer" in str(error)


def test_a_scheduler_state_without_its_step_is_not_taken_silently(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=True)
    torch.save({}, folder / ckpt.SCHEDULER_NAME)  # a scheduler's load_state_dict would take it and restart
    error = resume_error(folder)
    assert f"'{folder / ckpt.SCHEDULER_NAME}' does not fit this run's learning-rate scheduler" in str(error)
    assert "last_epoch" in str(error)


def test_an_rng_state_of_another_shape_is_named(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=True)
    torch.save(
        {"python": (3, (1, 2), None), "numpy": [], "cpu": torch.zeros(4, dtype=torch.uint8)}, folder / "rng_state.pth"
    )
    error = resume_error(folder)
    assert f"'{folder / 'rng_state.pth'}' is not an RNG state a Trainer saved" in str(error)


class WiderRegressor(nn.Module):
    """crash_worker.Regressor with 16 hidden units instead of 32."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        prediction = self.net(x).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def test_a_checkpoint_of_another_model_shape_is_one_clear_error(tmp_path):
    folder = checkpoint(tmp_path, transformers_form=False)
    args = trainer_for(tmp_path / "run").args
    trainer = Trainer(model=WiderRegressor(), args=args, train_dataset=crash_worker.dataset())
    with pytest.raises(ValueError) as raised:
        trainer.train(resume_from_checkpoint=str(folder))
    message = str(raised.value)
    assert f"The weights in '{folder / ckpt.WEIGHTS_NAME}' do not fit the model: 3 tensor(s)" in message
    assert "net.0.weight: [32, 8] in the file, [16, 8] in the model" in message
    assert "net.3.weight: [1, 32] in the file, [1, 16] in the model" in message


def llama_trainer(output_dir: Path, model, **overrides) -> Trainer:
    args = training_args(output_dir, max_steps=2, save_strategy="steps", save_steps=2, **overrides)
    return Trainer(model=model, args=args, train_dataset=token_items(), data_collator=pad_collate)


@pytest.mark.hf
@pytest.mark.slow
def test_a_transformers_model_checkpoint_of_another_size_names_the_tensors(tmp_path):
    llama_trainer(tmp_path, tiny_llama(intermediate_size=64)).train()
    with pytest.raises(ValueError) as raised:
        llama_trainer(tmp_path, tiny_llama(intermediate_size=48)).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-2")
        )
    message = str(raised.value)
    assert f"'{tmp_path / 'checkpoint-2' / ckpt.WEIGHTS_NAME}' do not fit the model: 6 tensor(s)" in message
    assert "model.layers.0.mlp.gate_proj.weight: [64, 32] in the file, [48, 32] in the model" in message


@pytest.mark.hf
@pytest.mark.slow
def test_a_lora_adapter_of_another_rank_names_the_adapter_file_and_tensors(tmp_path):
    from peft import LoraConfig, get_peft_model

    def lora(rank: int):
        return get_peft_model(tiny_llama(), LoraConfig(task_type="CAUSAL_LM", r=rank, target_modules=["q_proj"]))

    llama_trainer(tmp_path, lora(4)).train()
    with pytest.raises(ValueError) as raised:
        llama_trainer(tmp_path, lora(8)).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    message = str(raised.value)
    assert f"'{tmp_path / 'checkpoint-2' / ckpt.ADAPTER_WEIGHTS_NAME}' do not fit the model: 4 tensor(s)" in message
    assert (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight: [4, 32] in the file, [8, 32] in the model"
        in message
    )
    assert "LoRA adapter of another rank" in message
