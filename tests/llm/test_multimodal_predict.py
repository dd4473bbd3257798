"""`lathe train` with do_predict and predict_with_generate on Qwen2-VL image rows against LLaMA-Factory 0.9.5's own
run (tests/llm/golden/llamafactory_mm_predict.json, made by make_llamafactory_mm_predict.py): generation gets each
row's pixel values (the tiny model's weights are scaled so that its greedy tokens depend on the image), and
generated_predictions.jsonl holds LLaMA-Factory's lines: the prompt with its image tokens, the prediction, the
reference answer. Plus a prompt whose image cutoff_len cuts: left out and named, as in training."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

GOLDEN = json.loads((Path(__file__).parent / "golden" / "llamafactory_mm_predict.json").read_text())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from tests.llm import multimodal_cases as cases
    from tests.llm.golden.make_llamafactory_mm_predict import make_model_folder

    root = tmp_path_factory.mktemp("mm-predict")
    return make_model_folder(root / "model", cases), cases.make_data_folder(root / "data"), root


def _config(folders, name, **keys):
    from lathe.llm.config.train import parse_train_config
    from tests.llm import multimodal_cases as cases
    from tests.llm.golden.make_llamafactory_mm_predict import KEYS

    model, data, root = folders
    config = cases.train_config(model, data, root / name, **{**KEYS, **keys})
    config.pop("dataset")
    return parse_train_config(config)


@pytest.mark.slow
def test_predictions_on_image_rows_equal_llamafactory(folders):
    from lathe.llm.workflows.stages import run_train

    run_train(_config(folders, "predict"))
    lines = (folders[2] / "predict" / "generated_predictions.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == GOLDEN["predictions"]
    assert len({line["predict"] for line in GOLDEN["predictions"]}) == len(lines)  # the images change the tokens


def test_a_prompt_whose_image_the_cutoff_cuts_is_left_out_and_named(folders, caplog):
    from lathe.llm.workflows.setup import load_data

    config = _config(folders, "cut", cutoff_len=12, overwrite_cache=True, max_dropped_rows_share=1.0)
    _, _, datasets = load_data(config, stage="sft")
    rows = datasets["eval_dataset"]
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "left out the row with" in messages and "cutoff_len cuts" in messages
    assert len(rows) < 4 and all(images is None for images in rows["images"])
