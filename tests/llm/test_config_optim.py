"""The optimizer and loss keys (lathe.llm.config.optim): LLaMA-Factory's defaults, and an error wherever
LLaMA-Factory would silently drop one of two keys or cannot run the combination."""

import logging

import pytest
import torch

from lathe.llm.config.train import parse_train_config

BASE = {"model_name_or_path": "some/folder", "dataset": "demo", "output_dir": "out", "finetuning_type": "full"}


def test_llamafactory_defaults_and_comma_lists():
    finetuning = parse_train_config({**BASE, "use_galore": True, "galore_target": "q_proj, v_proj"}).finetuning
    assert finetuning.galore_target == ["q_proj", "v_proj"] and finetuning.apollo_target == ["all"]
    assert (finetuning.galore_rank, finetuning.galore_update_interval, finetuning.galore_scale) == (16, 200, 2.0)
    assert (finetuning.apollo_rank, finetuning.apollo_scale, finetuning.apollo_proj) == (16, 32.0, "random")
    assert (finetuning.badam_mode, finetuning.badam_switch_mode, finetuning.badam_switch_interval) == (
        "layer",
        "ascending",
        50,
    )
    assert (finetuning.asft_alpha, finetuning.eaft_alpha) == (0.1, 1.0)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"use_galore": True, "use_badam": True}, "use_galore and use_badam each choose the optimizer"),
        ({"use_adam_mini": True, "use_muon": True}, "use_adam_mini and use_muon each choose the optimizer"),
        ({"use_galore": True, "finetuning_type": "lora"}, "use_galore trains full weights .* lora"),
        ({"use_dft_loss": True, "use_eaft_loss": True}, "use_dft_loss and use_eaft_loss each replace the loss"),
        ({"use_dft_loss": True, "stage": "pt"}, "use_dft_loss .*changes the sft loss; stage pt"),
        ({"use_asft_loss": True, "finetuning_type": "lora"}, "use_asft_loss .*reference model.*full or freeze"),
        (
            {"use_galore": True, "galore_layerwise": True, "gradient_accumulation_steps": 4},
            "galore_layerwise .*gradient_accumulation_steps: 1 \\(got 4\\)",
        ),
        ({"use_badam": True, "badam_mode": "ratio", "badam_update_ratio": 0.0}, "badam_update_ratio must be above 0"),
        ({"galore_proj_type": "diagonal"}, "galore_proj_type: expected one of"),
        ({"use_apollo": True, "apollo_rank": 0}, "apollo_rank must be a positive integer"),
    ],
)
def test_contradictions_are_errors_naming_the_keys(values, message):
    with pytest.raises(ValueError, match=message):
        parse_train_config({**BASE, **values})


def test_galore_with_deepspeed_is_refused_as_in_llamafactory(tmp_path):
    pytest.importorskip("deepspeed")
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2}}')
    with pytest.raises(ValueError, match="use_galore / use_apollo .*deepspeed"):
        parse_train_config({**BASE, "use_galore": True, "deepspeed": str(path)})


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(10, 8)
        self.up_proj, self.norm, self.lm_head = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 10)


def _optimizer(**values):
    from lathe.llm.methods.optimizers import create_custom_optimizer

    config = parse_train_config({**BASE, **values})
    return create_custom_optimizer(Tiny(), config.training, config.finetuning)


def test_apollo_scale_front_reaches_the_optimizer():
    """LLaMA-Factory 0.9.5 puts it in the param group, where apollo-torch never reads it; here it is the
    constructor argument apollo-torch reads."""
    pytest.importorskip("apollo_torch")
    assert _optimizer(use_apollo=True, apollo_scale_front=True).scale_front is True
    assert _optimizer(use_apollo=True).scale_front is False


def test_galore_groups_and_unsupported_optim():
    pytest.importorskip("galore_torch")
    optimizer = _optimizer(use_galore=True, galore_rank=2, weight_decay=0.1, optim="adamw_torch")
    no_decay, decay, projected = optimizer.param_groups
    assert [p.shape for p in projected["params"]] == [torch.Size([8, 8])]  # up_proj; never the head
    assert projected["rank"] == 2 and projected["weight_decay"] == 0.1
    # LLaMA-Factory's own rule: biases and nn.LayerNorm parameters are not decayed (RMSNorm weights would be).
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 4  # 2 biases, LayerNorm weight and bias
    assert len(decay["params"]) == 2  # the embedding and the head's weight
    with pytest.raises(ValueError, match="use_galore works with optim"):
        _optimizer(use_galore=True, optim="sgd")


def test_mixture_of_depths_names_its_package():
    with pytest.raises(ValueError, match="mixture_of_depths: Mixture-of-Depths .*mixture-of-depth"):
        parse_train_config({**BASE, "mixture_of_depths": "convert"})


@pytest.mark.parametrize(
    "values, message",
    [
        ({"use_kt": True}, "use_kt: KTransformers"),
        (
            {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 4},
            "tensor_model_parallel_size: a Megatron-Core key",
        ),
        ({"fp8": True, "fp8_backend": "torchao"}, "fp8: FP8 training"),
        ({"use_hyper_parallel": True}, "use_hyper_parallel: HyperParallel"),
    ],
)
def test_what_cannot_run_here_stops_with_one_line_naming_the_key(values, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_train_config({**BASE, "lora_rnak": 3, **values})  # before any other complaint
    assert "\n" not in str(error.value)


def test_use_v1_kernels_applies_none_on_a_cpu_as_llamafactory_and_is_refused_on_a_gpu(monkeypatch, caplog):
    """LLaMA-Factory registers a v1 kernel only for its accelerator (NPU, CUDA): on a CPU it applies none and
    trains, so lathe runs too and says so; where a GPU is, LLaMA-Factory would patch the model: refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="lathe.llm.config.values"):
        config = parse_train_config({**BASE, "use_v1_kernels": True})
    assert "none exists for the CPU, so none is applied" in caplog.text
    assert config.model.model_name_or_path == BASE["model_name_or_path"]
    parse_train_config({**BASE, "use_v1_kernels": "auto"})  # every kernel registered here: none, as true
    with pytest.raises(ValueError, match="use_v1_kernels: a list of LLaMA-Factory's v1 kernels .*use true"):
        parse_train_config({**BASE, "use_v1_kernels": "npu_swiglu,npu_rms_norm"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="use_v1_kernels: .*Ascend NPU operators.*would apply them") as error:
        parse_train_config({**BASE, "lora_rnak": 3, "use_v1_kernels": True})
    assert "\n" not in str(error.value)


def test_their_llamafactory_defaults_are_accepted_from_the_command_line_too(tmp_path, write_yaml):
    """`key=false` on the command line is the string 'false': still LLaMA-Factory's default False."""
    path = write_yaml(tmp_path / "c.yaml", BASE)
    config = parse_train_config(path, ["use_v1_kernels=false", "use_kt=False", "fp8=false"])
    assert config.model.model_name_or_path == BASE["model_name_or_path"]


def test_their_llamafactory_defaults_are_accepted():
    parse_train_config(
        {
            **BASE,
            "freeze_vision_tower": True,
            "ray_num_workers": 1,
            "use_kt": False,
            "fp8": False,
            "use_v1_kernels": False,
            "mixture_of_depths": None,
        }
    )


def test_cli_exits_2_without_a_traceback(tmp_path, write_yaml):
    import subprocess
    import sys

    path = write_yaml(tmp_path / "ray.yaml", {**BASE, "ray_num_workers": 4})
    result = subprocess.run([sys.executable, "-m", "lathe", "train", path], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[0].startswith("lathe train: error: ray_num_workers (in ")


def test_inference_configs_call_them_training_keys():
    from lathe.llm.inference.config import parse_infer_config

    with pytest.raises(ValueError, match="use_badam is a training key"):
        parse_infer_config({"model_name_or_path": "m", "template": "qwen", "use_badam": True})
