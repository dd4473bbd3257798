"""`lathe data preview` lists, row by row, the rows cutoff_len cuts through their media (left out: row index, the
media run and the cutoff) and the rows it keeps with no trained token (issue 35, point 6), from notes the tokenizer
records in the cache manifest (lathe/llm/data/row_notes.py); a cache hit lists them again."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

LONG_PROMPT = "hello " * 400  # with a 10-token answer, infer_seqlen leaves the answer no token at cutoff_len 20
ROWS = [
    ([("user", "<image>Who are they?"), ("assistant", "The quick brown fox.")], ["wide.png"]),
    ([("user", LONG_PROMPT), ("assistant", "The quick brown fox. Two plus two is four.")], []),
    ([("user", "Hi"), ("assistant", "four")], []),
]


def test_preview_lists_rows_cut_through_media_and_rows_kept_untrained(tmp_path, capsys):
    from lathe.llm.commands import data_preview_command
    from tests.llm import multimodal_cases as cases

    model, data = cases.make_model_folder(tmp_path / "model"), cases.make_data_folder(tmp_path / "data", ROWS)
    config = cases.train_config(model, data, tmp_path / "out", cutoff_len=20, max_dropped_rows_share=1.0)
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(config))
    for _ in range(2):  # tokenized, then from the cache: the same list
        assert data_preview_command(str(path), [], num_examples=0) == 0
        out = capsys.readouterr().out
        image = data / "images" / "wide.png"
        assert (
            "Rows cutoff_len cuts through media (train, left out): 1\n"
            "  row 0: left out: cutoff_len cuts off media 1 of 1 (its 2 tokens) (cutoff_len=20, 49 tokens before the "
            f"cut); media {image}\n"
            "Rows kept with no trained token (train): 1\n"
            "  row 1: kept with no trained token: cutoff_len=20 keeps 20 of its " in out
        )
        assert "tokens and none of its" in out and "row 2" not in out


def test_the_list_leaves_out_the_media_line_for_text_splits_and_says_when_notes_are_missing():
    from lathe.llm.data.row_notes import describe_row_notes

    notes = [{"row": 4, "kept": True, "why": "kept with no trained token: ..."}]
    assert describe_row_notes(notes, "train", media=False) == (
        "Rows kept with no trained token (train): 1\n  row 4: kept with no trained token: ..."
    )
    assert "through media (train, left out): none" in describe_row_notes([], "train", media=True)
    assert "not recorded (the data was tokenized by several workers" in describe_row_notes(None, "eval")
