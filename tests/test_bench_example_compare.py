"""bench/example_compare.py, the comparison behind bench/example_scripts.py (transformers' example scripts on both
Trainers), on synthetic output folders: what it calls equal (floats within 1e-5 relative, timings skipped, lathe's
documented extra files) and where it says the first difference is."""

import importlib.util
import json
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("example_compare", ROOT / "bench" / "example_compare.py")
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def history(loss_at_15=0.69, eval_runtime=0.05):
    return [
        {"epoch": 0.5, "grad_norm": 0.78, "learning_rate": 8e-4, "loss": 0.6974, "step": 5},
        {
            "epoch": 1.0,
            "eval_loss": 0.6913797,
            "eval_runtime": eval_runtime,
            "eval_samples_per_second": 458.1,
            "step": 10,
        },
        {"epoch": 1.5, "grad_norm": 0.29, "learning_rate": 4e-4, "loss": loss_at_15, "step": 15},
    ]


def test_log_histories_equal_within_tolerance_and_timings_are_skipped():
    other = history(eval_runtime=0.9)
    other[1]["eval_loss"] *= 1 + 3e-6  # float32 vs float64 accumulation noise
    assert compare.diff_log_history(history(), other) is None


def test_first_log_difference_names_step_key_and_both_values():
    first = compare.diff_log_history(history(), history(loss_at_15=0.6936))
    assert first == {"step": 15, "key": "loss", "hf": 0.69, "lathe": 0.6936}
    assert compare.describe_log(first) == "step 15 loss: 0.69 vs 0.6936"


def test_a_key_on_one_side_only_and_an_extra_entry_are_differences():
    other = history()
    other[1]["eval_accuracy"] = 0.5
    assert compare.diff_log_history(history(), other)["key"] == "eval_accuracy"
    longer = history() + [{"step": 20, "loss": 0.6}]
    assert compare.diff_log_history(history(), longer) == {
        "step": 20,
        "key": "entry 3 only in lathe",
        "hf": None,
        "lathe": None,
    }


def test_layout_allows_lathe_documented_extras_only():
    hf = ["config.json", "checkpoint-10/optimizer.pt", "checkpoint-10/trainer_state.json"]
    lathe = hf + ["checkpoint-10/lathe_checkpoint.json", "training_args.json", "checkpoint-10/extra.bin"]
    assert compare.diff_layout(hf, lathe) == ([], ["checkpoint-10/extra.bin"])
    assert compare.diff_layout(hf + ["generation_config.json"], hf) == (["generation_config.json"], [])


def test_arrays_compare_relative_and_report_the_share_that_differs():
    a = torch.tensor([1.0, 2.0, 0.0, -4.0])
    assert compare.diff_arrays(a, a * (1 + 5e-6)) is None
    assert compare.diff_arrays(a, a + torch.tensor([0.0, 0.0, 0.0, 0.01])) == "1/4 values differ, max rel 0.0025"
    assert compare.diff_arrays(a, a[:2]) == "shape (4,) vs (2,)"
    assert compare.diff_arrays(torch.tensor([1, 2]), torch.tensor([1, 3])) == "1/2 values differ"


def write_run(folder, loss_at_15=0.69, weight=0.5, predictions="0\tsame\n", flos=True, extra=()):
    from safetensors.torch import save_file

    folder = pathlib.Path(folder)
    (folder / "checkpoint-10").mkdir(parents=True)
    state = {"global_step": 24, "log_history": history(loss_at_15)}
    for sub in (folder, folder / "checkpoint-10"):
        (sub / "trainer_state.json").write_text(json.dumps(state))
        save_file({"w": torch.full((3,), weight), "b": torch.zeros(2)}, str(sub / "model.safetensors"))
    results = {"epoch": 3.0, "train_loss": 0.69, "train_runtime": 1.0}
    if flos:
        results["total_flos"] = 441207456.0
    (folder / "all_results.json").write_text(json.dumps(results))
    (folder / "predict_results_None.txt").write_text(predictions)
    (folder / "training_args.bin").write_bytes(b"pickled class: not compared")
    for name in extra:
        (folder / name).write_text("{}")
    return str(folder)


def test_identical_runs_are_equal_in_every_column(tmp_path):
    hf = write_run(tmp_path / "hf")
    lathe = write_run(tmp_path / "lathe", extra=["training_args.json"])
    report = compare.compare_runs(hf, lathe)
    assert [report[c] for c in compare.COLUMNS] == [None] * 5
    assert report["not_written"] == []


def test_each_column_reports_its_first_difference(tmp_path):
    hf = write_run(tmp_path / "hf", flos=False)
    lathe = write_run(tmp_path / "lathe", loss_at_15=0.7, weight=0.6, predictions="0\tdifferent\n", extra=["x.json"])
    report = compare.compare_runs(hf, lathe)
    assert report["log_history"] == "step 15 loss: 0.69 vs 0.7"
    assert report["results"] == "all_results.json: total_flos: '<absent>' vs 441207456.0"
    assert report["predictions"] == "predict_results_None.txt: line 1: '0\\tsame' vs '0\\tdifferent'"
    assert report["files"].startswith("layout: extra ['x.json']")
    # The checkpoint is compared before the top level: the earliest difference is named.
    assert report["weights"] == "checkpoint-10/model.safetensors: w: 3/3 values differ, max rel 0.17"
    assert sorted(report["differing_files"]) == [
        "all_results.json",
        "checkpoint-10/model.safetensors",
        "checkpoint-10/trainer_state.json",
        "model.safetensors",
        "predict_results_None.txt",
    ]


def test_columns_without_files_are_reported_not_written(tmp_path):
    hf = write_run(tmp_path / "hf")
    lathe = write_run(tmp_path / "lathe")
    for folder in (hf, lathe):
        (pathlib.Path(folder) / "predict_results_None.txt").unlink()
    report = compare.compare_runs(hf, lathe)
    assert report["not_written"] == ["predictions"]
    assert report["predictions"] is None


@pytest.mark.parametrize(
    "relpath, column",
    [
        ("model.safetensors", "weights"),
        ("checkpoint-5/model.safetensors", "weights"),
        ("eval_results.json", "results"),
        ("checkpoint-5/eval_results.json", "files"),
        ("generated_predictions.txt", "predictions"),
        ("predictions.txt", "predictions"),
        ("checkpoint-5/optimizer.pt", "files"),
        ("README.md", "files"),
    ],
)
def test_files_map_to_columns(relpath, column):
    assert compare.column_of(relpath) == column


def test_the_model_card_may_differ_by_lathe_s_framework_line_only(tmp_path):
    card = "---\nlibrary_name: transformers\n---\n\n### Framework versions\n\n- Transformers 5.23.0\n- Pytorch 2.13.0\n"
    hf, lathe, other = (write_run(tmp_path / name) for name in ("hf", "lathe", "other"))
    (tmp_path / "hf" / "README.md").write_text(card)
    (tmp_path / "lathe" / "README.md").write_text(card + "- lathe 0.1.0\n")
    (tmp_path / "other" / "README.md").write_text(card.replace("5.23.0", "5.6.0") + "- lathe 0.1.0\n")
    assert compare.compare_runs(hf, lathe)["files"] is None
    assert "README.md: line 7" in compare.compare_runs(hf, other)["files"]


def test_source_fixes_replace_every_occurrence_and_refuse_a_missing_text():
    """bench/example_shim.py fixes the typos of a script's v4.49 text (run_plm, run_fim) the same way for both
    Trainers; a fix whose text is not in the copy stops the run instead of running the script unfixed."""
    shim_spec = importlib.util.spec_from_file_location("example_shim", ROOT / "bench" / "example_shim.py")
    shim = importlib.util.module_from_spec(shim_spec)
    shim_spec.loader.exec_module(shim)
    text = "a = x.mean(dim=0)\n    b = (x.mean(dim=0) - 1)\nTrainer(processing_classtokenizer=tok)\n"
    fixes = [["x.mean(", "x.weight.mean("], ["processing_classtokenizer=", "processing_class="]]
    fixed = shim.apply_source_fixes(text, fixes, "run_x.py")
    assert fixed == "a = x.weight.mean(dim=0)\n    b = (x.weight.mean(dim=0) - 1)\nTrainer(processing_class=tok)\n"
    with pytest.raises(SystemExit, match="'is_availble' does not occur in run_x.py"):
        shim.apply_source_fixes(text, [["is_availble", "is_available"]], "run_x.py")
