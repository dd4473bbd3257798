"""The vision-language example as a user runs it: examples/vision/make_assets.py builds a tiny Qwen2-VL and colour
swatches, `lathe train examples/vision.yaml` trains it on CPU, and `lathe chat` (`/image PATH`, then a question)
names each colour: the four held images (one per colour) answered right after training."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("PIL")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_vision_example_trains_and_chats_with_images(tmp_path):
    from lathe.llm.inference.chat import chat_loop
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.engine import ChatEngine

    assets = tmp_path / "vision"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path), OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, str(ROOT / "examples/vision/make_assets.py"), str(assets)], check=True, env=env)
    keys = [
        f"model_name_or_path={assets / 'model'}",
        f"dataset_dir={assets / 'data'}",
        f"output_dir={tmp_path / 'out'}",
    ]
    lathe = [sys.executable, "-c", "import sys; from lathe.cli import main; sys.exit(main())"]  # the `lathe` command
    command = [*lathe, "train", str(ROOT / "examples/vision.yaml"), *keys]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "out" / "preprocessor_config.json").is_file()

    config = parse_infer_config(
        {
            "model_name_or_path": str(tmp_path / "out"),
            "template": "qwen2_vl",
            "image_max_pixels": 784,
            "image_min_pixels": 784,
            "do_sample": False,
            "max_new_tokens": 8,
        },
        command="chat",
    )
    engine = ChatEngine.from_config(config)
    for colour in ("red", "green", "blue", "yellow"):
        lines = iter([f"/image {assets / 'data' / 'images' / f'{colour}_1.png'}", "What colour is this?"])
        out = []

        def read(_prompt, lines=lines):
            try:
                return next(lines)
            except StopIteration:
                raise EOFError from None

        assert chat_loop(engine, read=read, write=out.append) == 0
        assert f"Assistant: {colour}" in "".join(out), (colour, out)
