"""Templates LLaMA-Factory pairs with a multimodal plugin train on text, token for token
(test_templates_llamafactory.py); image, video and audio input is refused, naming where it is:
a registry column, content parts in a data file, a placeholder in a message."""

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("datasets")

from lathe.llm.config.train import DataArguments  # noqa: E402
from lathe.llm.data.loader import load_datasets  # noqa: E402
from lathe.llm.data.registry import get_dataset_list  # noqa: E402
from lathe.llm.data.supervised import preprocess_supervised_dataset  # noqa: E402
from lathe.llm.templates import get_template_and_fix_tokenizer  # noqa: E402


def write_dataset(folder, rows, **entry):
    (folder / "mm.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"mm": {"file_name": "mm.json", **entry}}))
    args = DataArguments(dataset="mm", dataset_dir=str(folder))
    return lambda: load_datasets(get_dataset_list(args.dataset, str(folder)), args, "sft", np.random.RandomState(0))


def test_content_parts_with_an_image_stop_the_run_naming_file_row_and_message(tmp_path):
    text_row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    image_row = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "x.png"}},
                ],
            },
            {"role": "assistant", "content": "a cat"},
        ]
    }
    load = write_dataset(
        tmp_path,
        [text_row, image_row, text_row],
        formatting="openai",
        columns={"messages": "messages"},
        tags={
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
        },
    )
    with pytest.raises(ValueError) as error:
        load()
    message = str(error.value)
    assert f"{tmp_path / 'mm.json'} row 2: message 1 content ('content') holds image_url content parts" in message
    assert "list the files in the images" in message and "1 row(s) with image, video or audio problems" in message


def test_an_images_column_reads_paths_under_media_dir_and_names_the_row_at_fault(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(b"png")
    columns = {"prompt": "instruction", "response": "output", "images": "images"}
    row = {"instruction": "<image>hi", "output": "hello", "images": ["pics/a.png"]}
    (dataset, _), *_ = load_rows(write_dataset(tmp_path, [row, {**row, "images": "pics/a.png"}], columns=columns))
    assert dataset["_images"] == [[str(tmp_path / "pics" / "a.png")]] * 2  # joined to media_dir (dataset_dir)
    assert dataset["_videos"] == [None, None]
    for bad, detail in (
        ({"images": ["pics/b.png"]}, "image file 'pics/b.png' not found"),
        ({"images": ["https://x.org/a.png"]}, "image 'https://x.org/a.png' is a URL; lathe reads no network"),
        ({"images": []}, r"0 image\(s\) given but the messages hold 1 <image> placeholder"),
        ({"instruction": "<image><image>hi"}, r"1 image\(s\) given but the messages hold 2 <image>"),
    ):
        load = write_dataset(tmp_path, [row, {**row, **bad}], columns=columns)
        with pytest.raises(ValueError, match=f"mm.json row 2: {detail}"):
            load()


def test_an_images_column_in_the_openai_format(tmp_path):
    (tmp_path / "a.png").write_bytes(b"png")
    messages = [{"role": "user", "content": "<image>what?"}, {"role": "assistant", "content": "a cat"}]
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    load = write_dataset(
        tmp_path,
        [{"messages": messages, "images": ["a.png"]}],
        formatting="openai",
        columns={"messages": "messages", "images": "images"},
        tags={**tags, "system_tag": "system"},
    )
    ((dataset, _),) = load_rows(load)
    assert dataset["_images"] == [[str(tmp_path / "a.png")]] and dataset["_prompt"][0][0]["content"] == "<image>what?"


def load_rows(load):
    train, reports = load()
    return [(dataset, report) for dataset, report in zip(train.values(), reports)]


@pytest.mark.parametrize("name", ["qwen2_vl", "gemma3", "llava", "qwen3_5"])
def test_a_media_placeholder_in_a_multimodal_template_row_is_skipped_with_the_reason(word_tokenizer, name):
    # LLaMA-Factory's plugins refuse an <image> placeholder that has no image; lathe has no images
    args = SimpleNamespace(
        template=name,
        cutoff_len=1024,
        train_on_prompt=False,
        mask_history=False,
        tool_format=None,
        default_system=None,
        enable_thinking=True,
        preserve_thinking=False,
    )
    template = get_template_and_fix_tokenizer(word_tokenizer, args)
    rows = {
        "_prompt": [[{"role": "user", "content": "<image> what is this ?"}], [{"role": "user", "content": "hi"}]],
        "_response": [[{"role": "assistant", "content": "a cat"}], [{"role": "assistant", "content": "hello"}]],
        "_system": ["", ""],
        "_tools": ["", ""],
    }
    skipped = Counter()
    out = preprocess_supervised_dataset(rows, template, word_tokenizer, args, skipped=skipped)
    assert len(out["input_ids"]) == 1
    (reason,) = skipped
    assert "message 1 holds the <image> placeholder" in reason and "the row gives no image" in reason
    # a text template trains the same row as text, as LLaMA-Factory does
    args.template = "qwen"
    text_template = get_template_and_fix_tokenizer(word_tokenizer, args)
    assert len(preprocess_supervised_dataset(rows, text_template, word_tokenizer, args)["input_ids"]) == 2
