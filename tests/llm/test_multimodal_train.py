"""`lathe train` with a vision-language model (a tiny random Qwen2-VL built from a config, the PIL image processor)
against LLaMA-Factory 0.9.5 on the same folder and data (tests/llm/golden/llamafactory_qwen2vl_train.json, made by
make_llamafactory_qwen2vl_train.py): three sft steps' losses and grad norms and the trainable-parameter counts of
full tuning with the towers frozen, LoRA (tower frozen and open), the projector alone, and image-less batches
(LLaMA-Factory's stand-in image); then the data checks a user meets: rows named for a missing file, a URL, a
placeholder count, a cutoff through an image."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from tests.llm import multimodal_cases as cases  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "golden" / "llamafactory_qwen2vl_train.json").read_text())


def _cases():
    import importlib.util

    path = Path(__file__).parent / "golden" / "make_llamafactory_qwen2vl_train.py"
    spec = importlib.util.spec_from_file_location("make_qwen2vl_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mm")
    return cases.make_model_folder(root / "model"), cases.make_data_folder(root / "data"), root


def _train(folders, name: str, **keys):
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train
    from lathe.train import TrainerCallback

    model, data, root = folders

    class Count(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = (sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen))

    count = Count()
    config = parse_train_config(cases.train_config(model, data, root / name, **keys))
    run_train(config, callbacks=[count])
    history = json.loads((root / name / "trainer_state.json").read_text())["log_history"]
    return [e["loss"] for e in history if "loss" in e], [e["grad_norm"] for e in history if "loss" in e], count.counts


@pytest.mark.slow
@pytest.mark.parametrize("name", ["full", "lora", "lora_open_tower", "projector_only", "no_images"])
def test_three_sft_steps_equal_llamafactory(folders, name):
    losses, norms, (trainable, total) = _train(folders, name, **_cases()[name])
    expected = GOLDEN[name]
    assert (trainable, total) == (expected["trainable"], expected["total"])
    assert losses == pytest.approx(expected["loss"], abs=1e-5)
    assert norms == pytest.approx(expected["grad_norm"], rel=1e-4, abs=1e-6)
