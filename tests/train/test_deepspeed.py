"""DeepSpeed ZeRO through TrainingArguments(deepspeed=...): 2 ZeRO ranks (CPU, gloo, torchrun) train
the model one plain process trains with twice the batch; a checkpoint resumes exactly; the config's
"auto" values come from the arguments and contradictions are errors; checkpoints load safely."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from lathe import TrainingArguments
from tests.train import ddp_worker
from tests.train.torchrun_helpers import REPOSITORY, assert_same_weights, torchrun_runs

pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")

WORKER = REPOSITORY / "tests" / "train" / "deepspeed_worker.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Every 2-rank run of this module in one torchrun launch (in this order; ZeRO-3 last, as it leaves its
    global config behind in the process): the folder they wrote and rank 0's results."""
    folder = tmp_path_factory.mktemp("zero")
    checkpoint = str(folder / "part" / "checkpoint-4")
    runs = {
        "stage2": {"batch": 2, "accumulation": 2, "stage": 2},
        "clipped": {"batch": 2, "stage": 2, "max_grad_norm": 0.05, "epochs": 1},
        "full": {"batch": 2, "stage": 2, "save_steps": 2},
        "part": {"batch": 2, "stage": 2, "save_steps": 2, "stop_after": 4},
        "resumed": {"batch": 2, "stage": 2, "save_steps": 2, "resume": checkpoint},
        "stage3": {"batch": 2, "accumulation": 2, "stage": 3},
    }
    return folder, torchrun_runs(folder, runs, worker=WORKER)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_two_zero_ranks_train_like_one_plain_process_with_twice_the_batch(tmp_path, ranks, stage):
    single = ddp_worker.run(str(tmp_path / "single"), {"batch": 4, "accumulation": 2})
    result = ranks[1][f"stage{stage}"]
    assert result["world_size"] == 2
    assert len(result["losses"]) == len(single["losses"]) == 8
    assert result["losses"] == pytest.approx(single["losses"], abs=1e-6)
    assert_same_weights(result["weights"], single["weights"])
    assert len(result["grad_norms"]) == 8  # DeepSpeed's pre-clip norm, logged each step
    # 13 items over 2 ranks: the repeated ones dropped. eval_loss under 2 ranks is transformers' own, not one
    # process's (test_distributed.test_two_ranks_evaluate_as_transformers_two_ranks).
    for key in ("eval_accuracy", "eval_rows"):
        assert result["metrics"][key] == pytest.approx(single["metrics"][key], abs=1e-6)


@pytest.mark.slow
def test_grad_norm_and_clipping_match_a_plain_process(tmp_path, ranks):
    """A small max_grad_norm so every step clips: DeepSpeed's norm and update equal lathe's own clipping."""
    from tests.train import deepspeed_worker

    single = deepspeed_worker.run(str(tmp_path / "single"), {"batch": 4, "max_grad_norm": 0.05, "epochs": 1})
    clipped = ranks[1]["clipped"]
    assert clipped["grad_norms"] == pytest.approx(single["grad_norms"], abs=1e-6)
    assert all(norm > 0.05 for norm in single["grad_norms"])  # the clipping did something
    assert_same_weights(clipped["weights"], single["weights"])


@pytest.mark.slow
def test_zero_checkpoint_resumes_exactly_under_two_ranks(ranks):
    folder, results = ranks
    full, part, resumed = results["full"], results["part"], results["resumed"]
    assert len(part["losses"]) == 4
    checkpoint = folder / "part" / "checkpoint-4"
    # transformers' DeepSpeed layout: full weights beside DeepSpeed's partitioned optimizer state
    assert (checkpoint / "latest").read_text().strip() == "global_step4"
    assert sorted(os.listdir(checkpoint / "global_step4")) == [
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert {"model.safetensors", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= set(
        os.listdir(checkpoint)
    )
    assert not (checkpoint / "optimizer.pt").exists()
    assert resumed["losses"] == pytest.approx(full["losses"], abs=1e-7)  # the first 4 from the checkpoint's log
    assert_same_weights(resumed["weights"], full["weights"])
    # another number of processes cannot take the partitioned optimizer state: a clear error
    single = subprocess.run(
        [
            sys.executable,
            str(WORKER),
            str(folder / "one"),
            str(folder / "one.json"),
            json.dumps({"batch": 4, "stage": 2, "save_steps": 2, "resume": str(checkpoint)}),
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY)),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPOSITORY,
    )
    assert single.returncode != 0
    assert "partitioned over 2 processes; resume it with 2 processes (now 1)" in single.stderr


@pytest.mark.slow
def test_one_process_without_a_launcher(tmp_path):
    """No torchrun: lathe makes the one-process group DeepSpeed needs; the result equals plain training."""
    completed = subprocess.run(
        [
            sys.executable,
            str(WORKER),
            str(tmp_path / "ds"),
            str(tmp_path / "ds.json"),
            json.dumps({"batch": 4, "stage": 2, "accumulation": 2}),
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY)),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPOSITORY,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    ours = json.loads((tmp_path / "ds.json").read_text())
    plain = ddp_worker.run(str(tmp_path / "plain"), {"batch": 4, "accumulation": 2})
    assert ours["world_size"] == 1
    assert ours["losses"] == pytest.approx(plain["losses"], abs=1e-6)
    assert_same_weights(ours["weights"], plain["weights"])


# ----- the config -----


def make_args(tmp_path, config, **overrides):
    return TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_grad_norm=0.5,
        use_cpu=True,
        report_to="none",
        deepspeed=config,
        **overrides,
    )


def test_auto_values_come_from_the_arguments(tmp_path):
    from lathe.train.parallel.deepspeed_zero import engine_config

    path = REPOSITORY / "examples" / "deepspeed" / "ds_z3_config.json"
    args = make_args(tmp_path, str(path))

    class Model(torch.nn.Module):
        config = type("Config", (), {"hidden_size": 64})()

    config = engine_config(args, world_size=2, model=Model())
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 16 and config["gradient_clipping"] == 0.5
    assert config["fp16"]["enabled"] is False and config["bf16"]["enabled"] is False
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 64 * 64 and zero["stage3_param_persistence_threshold"] == 640
    assert json.loads(path.read_text())["train_batch_size"] == "auto"  # the user's file is not changed


def test_contradictions_and_unknown_keys_are_errors(tmp_path):
    with pytest.raises(
        ValueError, match=r"train_micro_batch_size_per_gpu=8 but TrainingArguments per_device_train_batch_size = 4"
    ):
        make_args(tmp_path, {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}})
    with pytest.raises(ValueError, match=r"gradient_clipping=1.0 but TrainingArguments max_grad_norm = 0.5"):
        make_args(tmp_path, {"gradient_clipping": 1.0})
    with pytest.raises(ValueError, match=r"bf16.enabled=True but TrainingArguments bf16=False"):
        make_args(tmp_path, {"bf16": {"enabled": True}})
    with pytest.raises(ValueError, match=r"unknown key 'zero_optimisation'; did you mean 'zero_optimization'"):
        make_args(tmp_path, {"zero_optimisation": {"stage": 2}})
    with pytest.raises(ValueError, match=r"'optimizer' section is not supported.*optim, learning_rate"):
        make_args(tmp_path, {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    with pytest.raises(ValueError, match=r"zero_optimization.stage must be 0, 1, 2 or 3, got 4"):
        make_args(tmp_path, {"zero_optimization": {"stage": 4}})
    with pytest.raises(ValueError, match=r"deepspeed='missing.json': no such file"):
        make_args(tmp_path, "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{stage: 2")
    with pytest.raises(ValueError, match=r"bad.json' is not valid JSON"):
        make_args(tmp_path, str(bad))
    with pytest.raises(ValueError, match="deepspeed and fsdp are both set"):
        make_args(tmp_path, {"zero_optimization": {"stage": 2}}, fsdp="full_shard")
    args = make_args(tmp_path, {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"})
    assert args.deepspeed["train_micro_batch_size_per_gpu"] == 4  # an agreeing explicit value is fine


def test_missing_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed now raises ImportError
    with pytest.raises(ImportError, match=r"deepspeed package is not installed: pip install 'lathe\[deepspeed\]'"):
        make_args(tmp_path, {"zero_optimization": {"stage": 2}})


def test_checkpoint_files_are_loaded_without_unpickling_code(tmp_path):
    """DeepSpeed's own loader unpickles anything; the engine lathe gives it refuses other objects."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from lathe.train.parallel.deepspeed_checkpoint import safe_checkpoint_engine

    engine = safe_checkpoint_engine(TorchCheckpointEngine())
    fine = tmp_path / "fine.pt"
    torch.save({"zero_stage": ZeroStageEnum.gradients, "state": {"exp_avg": torch.ones(2)}}, fine)
    assert engine.load(str(fine))["zero_stage"] == ZeroStageEnum.gradients
    marker = tmp_path / "code-ran"

    class Payload:  # unpickling it would create the marker folder
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    evil = tmp_path / "evil.pt"
    torch.save({"state": Payload()}, evil)
    with pytest.raises(ValueError, match=r"lathe refused to unpickle .*evil.pt.*makedirs") as raised:
        engine.load(str(evil))
    assert not marker.exists()
    assert "weights_only=False" not in str(raised.value) and raised.value.__cause__ is None


def test_a_damaged_deepspeed_file_is_an_error_naming_it(tmp_path):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from lathe.train.parallel.deepspeed_checkpoint import safe_checkpoint_engine

    engine = safe_checkpoint_engine(TorchCheckpointEngine())
    whole = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(64)}}, whole)
    whole.write_bytes(whole.read_bytes()[:100])
    with pytest.raises(
        ValueError, match=r"mp_rank_00_model_states.pt' is corrupt or truncated: torch.load cannot read it"
    ):
        engine.load(str(whole))


def test_every_key_deepspeed_reads_is_accepted(tmp_path, caplog):
    """LLaMA-Factory's example configs: a "_comment", comms_config / monitor_config (which DeepSpeed 0.19 never
    reads: accepted with a warning saying so), offload sections, zero_force_ds_cpu_optimizer, steps_per_print."""
    config = {
        "_comment": "anything",
        "train_micro_batch_size_per_gpu": "auto",
        "zero_force_ds_cpu_optimizer": True,
        "steps_per_print": 10,
        "comms_config": {"verbose": False},
        "monitor_config": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False}},
        "comms_logger": {"enabled": False},
        "tensor_parallel": {"autotp_size": 1},
        "timers": {},
        "log_level": "info",
    }
    with caplog.at_level("WARNING"):
        make_args(tmp_path, config)
    assert "does not read 'comms_config'" in caplog.text and "does not read 'monitor_config'" in caplog.text
    with pytest.raises(ValueError, match=r"'amp': NVIDIA Apex AMP integration has been removed"):
        make_args(tmp_path, {"amp": {"enabled": True}})  # DeepSpeed's own words for the features it removed
    with pytest.raises(ValueError, match=r"tensor_parallel.autotp_size > 1 \(DeepSpeed AutoTP\) is not supported"):
        make_args(tmp_path, {"zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 2}})


def test_offloaded_optimizer_becomes_deepspeeds_cpu_optimizer(monkeypatch):
    """As accelerate does for transformers: same parameter groups, AdamW mode for AdamW; what has no CPU
    kernel is an error naming the way out. (Building the real CPU Adam compiles a C++ op for minutes here;
    a run with LLaMA-Factory's ds_z2/ds_z3 offload configs equals the run without offload: docs/LLAMAFACTORY_EXAMPLES.md.)"""
    import deepspeed.ops.adam

    from lathe.train.parallel.deepspeed_zero import _offloaded

    built = {}

    class CPUAdam:
        def __init__(self, param_groups, **kwargs):
            built.update(groups=param_groups, **kwargs)

    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", CPUAdam)
    weight = torch.nn.Parameter(torch.ones(2))
    adamw = torch.optim.AdamW([{"params": [weight], "weight_decay": 0.1}], lr=0.01, betas=(0.8, 0.9))
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert isinstance(_offloaded(adamw, offload), CPUAdam)
    assert built["adamw_mode"] is True and built["lr"] == 0.01 and built["groups"][0]["betas"] == (0.8, 0.9)
    assert _offloaded(adamw, {**offload, "zero_force_ds_cpu_optimizer": False}) is adamw
    assert _offloaded(adamw, {"zero_optimization": {"stage": 2}}) is adamw
    with pytest.raises(ValueError, match="ZeRO-Offload .* not SGD: use optim adamw_torch"):
        _offloaded(torch.optim.SGD([weight], lr=0.1), offload)
