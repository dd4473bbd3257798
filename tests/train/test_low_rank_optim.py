"""optim=galore_* / apollo_* with optim_target_modules: the same numbers as transformers.Trainer (which builds
them from the same packages), layer-wise variants stepped per parameter in the backward pass with their
schedules, and exact resume from a checkpoint of a layer-wise run."""

import pytest
import torch
from torch import nn

from tests.train.trainer_helpers import library_module

pytest.importorskip("galore_torch")
pytest.importorskip("apollo_torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


class TwoLayer(nn.Module):
    """x -> up (16x8) -> gelu -> down (8x16) -> head (1x8), mean squared error."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.up, self.down, self.head = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 1)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)

    def forward(self, x, labels=None):
        prediction = self.head(torch.nn.functional.gelu(self.down(torch.nn.functional.gelu(self.up(x))))).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def items(count=24):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(count, 8, generator=generator)
    y = x[:, :3].sum(-1) - x[:, 5]
    return [{"x": x[i], "labels": y[i]} for i in range(count)]


def train(library, output_dir, optim, steps=6, resume=None, stop_at=None, **overrides):
    module = library_module(library)
    options = dict(
        output_dir=str(output_dir),
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        optim=optim,
        optim_target_modules=["up", "down"],
        optim_args="rank=2,update_proj_gap=2,scale=0.5",
        per_device_train_batch_size=4,
        learning_rate=0.05,
        lr_scheduler_type="cosine",
        max_steps=steps,
        logging_steps=1,
        seed=0,
        use_cpu=True,
        dataloader_pin_memory=False,
    )
    options.update(overrides)
    model = TwoLayer()
    trainer = module.Trainer(model=model, args=module.TrainingArguments(**options), train_dataset=items())
    if stop_at is not None:  # an interruption after that step (its checkpoint is saved first)

        class Stop(module.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                control.should_training_stop = state.global_step >= stop_at

        trainer.add_callback(Stop())
    trainer.train(resume_from_checkpoint=resume)
    logs = [
        (line["loss"], line["learning_rate"], line.get("grad_norm"))
        for line in trainer.state.log_history
        if "loss" in line
    ]
    return logs, {name: p.detach().clone() for name, p in model.named_parameters()}


# galore_adafactor_layerwise is left out: transformers 5.24 gives its per-parameter Adafactors relative_step=True
# next to an lr and raises; lathe builds them as galore_adafactor does (scale_parameter and relative_step off).
OPTIMS = ["galore_adamw", "galore_adamw_layerwise", "galore_adafactor", "apollo_adamw", "apollo_adamw_layerwise"]


@pytest.mark.hf
@pytest.mark.parametrize("optim", OPTIMS)
def test_low_rank_optimizers_match_transformers(tmp_path, optim):
    pytest.importorskip("transformers")
    # transformers 5.24 never schedules the layer-wise per-parameter rates (it builds the scheduler on the
    # accelerate wrapper, not on its LayerWiseDummyOptimizer): compared at a constant rate, where that does
    # not show; test_layerwise_galore_equals_one_galore_optimizer_with_its_schedule covers the schedule.
    schedule = "constant" if optim.endswith("layerwise") else "cosine"
    lathe_logs, lathe_weights = train("lathe", tmp_path / "lathe", optim, lr_scheduler_type=schedule)
    hf_logs, hf_weights = train("transformers", tmp_path / "hf", optim, lr_scheduler_type=schedule)
    assert lathe_logs == hf_logs
    for name, weight in hf_weights.items():
        assert torch.equal(lathe_weights[name], weight), name


@pytest.mark.parametrize("optim", ["galore_adamw", "galore_adafactor"])
def test_layerwise_galore_equals_one_galore_optimizer_with_its_schedule(tmp_path, optim):
    """Without clipping, stepping each parameter alone inside the backward pass is the same arithmetic as
    one optimizer over all of them, cosine schedule included (each parameter's schedule moves with it)."""
    whole_logs, whole = train("lathe", tmp_path / "whole", optim, max_grad_norm=0.0)
    layerwise_logs, layerwise = train("lathe", tmp_path / "layerwise", optim + "_layerwise", max_grad_norm=0.0)
    assert [line[:2] for line in layerwise_logs] == [line[:2] for line in whole_logs]
    clipped_logs, _ = train("lathe", tmp_path / "clipped", "galore_adamw_layerwise")
    assert {line[2] for line in clipped_logs} == {0.0}  # the gradients are gone by the time the loop clips
    for name, weight in whole.items():
        assert torch.equal(layerwise[name], weight), name


def test_layerwise_run_resumes_exactly(tmp_path):
    _, uninterrupted = train("lathe", tmp_path / "full", "galore_adamw_layerwise")
    train("lathe", tmp_path / "cut", "galore_adamw_layerwise", save_strategy="steps", save_steps=3, stop_at=3)
    logs, resumed = train(
        "lathe",
        tmp_path / "cut",
        "galore_adamw_layerwise",
        save_strategy="steps",
        save_steps=3,
        resume=str(tmp_path / "cut" / "checkpoint-3"),
    )
    assert len(logs) == 6
    for name, weight in uninterrupted.items():
        assert torch.equal(resumed[name], weight), name


def test_low_rank_optimizers_need_target_modules_and_accumulation_of_one(tmp_path):
    with pytest.raises(ValueError, match="optim_target_modules"):
        train("lathe", tmp_path / "a", "galore_adamw", optim_target_modules=None)
    with pytest.raises(ValueError, match="selects no nn.Linear"):
        train("lathe", tmp_path / "b", "apollo_adamw", optim_target_modules=["nothing"])
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be 1"):
        train("lathe", tmp_path / "c", "galore_adamw_layerwise", gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="CUDA"):
        train("lathe", tmp_path / "d", "galore_adamw_8bit")
