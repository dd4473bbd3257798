"""A video served by lathe api / lathe chat / the web chat, run where torchvision imports (transformers' video
processors need it): one part of video_check.torchvision_checks (the subprocess tests/llm/test_multimodal_video.py
starts with the torchvision test recipe). serving_checks(folder, root) returns the facts the test asserts on; each
comparison is computed here: the served prompt and tensors against the training pipeline's on the same video, greedy
tokens against the model's own generate, the API's and the web chat's answers against the engine's."""

from __future__ import annotations

import base64
from pathlib import Path

from tests.goldens import load_generator
from tests.llm.video_check import GEN

QUESTION = "What happens?"


def _video_message(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": QUESTION}],
        }
    ]


def _engine(folder: Path):
    """The engine `lathe chat` builds on a model folder of the image tests' tiny Qwen2-VL (make_llamafactory_qwen2vl.py)
    with its whole processor (image and video processor: torchvision imports here)."""
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.engine import ChatEngine

    gen = load_generator(Path(__file__).parent / "golden" / "make_llamafactory_qwen2vl.py", "make_qwen2vl")
    tokenizer = gen.make_tokenizer()
    gen.make_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    GEN.make_processor("qwen2_vl", tokenizer).save_pretrained(folder)
    keys = {"model_name_or_path": str(folder), "template": "qwen2_vl", "max_new_tokens": 4, "do_sample": False}
    config = parse_infer_config({**keys, **GEN.SETTINGS}, command="chat")
    return ChatEngine.from_config(config, max_batch=2)


def _training_batch(engine, video_path: str):
    """The prompt ids and collated tensors the training pipeline makes of `<video>` + QUESTION on the same video."""
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED

    plugin = engine.image_encoder.media_plugin
    media = {"video": plugin.regularize("video", [video_path], "a row")}
    messages = [{"role": "user", "content": "<video>" + QUESTION}, {"role": "assistant", "content": "ok"}]
    expanded = [{**message, EXPANDED: True} for message in plugin.process_messages(messages, media)]
    ids, labels = encode_supervised_example(expanded[:1], expanded[1:], "", "", engine.template, engine.tokenizer, 4096)
    row = {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), "videos": [video_path]}
    batch = MultimodalCollator(SFTDataCollator(engine.tokenizer), plugin, engine.model)([row])
    return ids[: next(index for index, label in enumerate(labels) if label != -100)], batch


def _own_generate(engine, prompt_ids, media, max_new_tokens) -> list[int]:
    import torch

    input_ids = torch.tensor([prompt_ids])
    token_types = (input_ids == engine.model.config.video_token_id).long() * 2  # video tokens: 2 (mrope)
    output = engine.model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        mm_token_type_ids=token_types,
        **media,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=engine.stop_token_ids,
        pad_token_id=engine.tokenizer.pad_token_id,
    )[0, len(prompt_ids) :].tolist()
    stop = next((index for index, token in enumerate(output) if token in engine.stop_token_ids), len(output))
    return output[:stop]


def serving_checks(folder: str, root: str) -> dict:
    import torch
    from fastapi.testclient import TestClient

    from lathe.llm.inference.api import create_app
    from lathe.llm.inference.chat import chat_loop
    from lathe.llm.inference.image_urls import ImageRules
    from lathe.llm.inference.requests import Limits, media_reader
    from lathe.llm.webui.server import create_app as create_webui

    root, video = Path(root), str(Path(folder) / "walk.mp4")
    engine = _engine(root / "web" / "models" / "vl")
    facts = {}
    data_url = "data:video/mp4;base64," + base64.b64encode(Path(video).read_bytes()).decode()
    prompt_ids, media = engine.chat_inputs(_video_message(data_url), read_media=media_reader(ImageRules()))
    training_prompt, batch = _training_batch(engine, video)
    facts["media_keys"] = sorted(media)
    facts["same_prompt"] = prompt_ids == training_prompt
    facts["video_tokens"] = prompt_ids.count(engine.model.config.video_token_id)
    facts["grid"] = media["video_grid_thw"].tolist()
    facts["same_tensors"] = all(
        torch.equal(media[key], torch.as_tensor(batch[key])) for key in ("pixel_values_videos", "video_grid_thw")
    )
    expected = _own_generate(engine, prompt_ids, media, 4)
    served = engine.generate(prompt_ids, engine.default_params(), media=media).generated
    facts["greedy_equal"] = bool(expected) and served == expected
    answer = engine.tokenizer.decode(expected, skip_special_tokens=True)
    # decoded beside an image row (left padding, the rows' tensors joined): the same tokens
    from lathe.llm.inference.generation import Sequence

    text = engine.chat_prompt([{"role": "user", "content": QUESTION}])
    rows = [Sequence(list(prompt_ids), engine.default_params(), media=media), Sequence(text, engine.default_params())]
    engine.generator.generate(rows)
    facts["batched_equal"] = rows[0].generated == expected

    (root / "media").mkdir()
    (root / "media" / "walk.mp4").write_bytes(Path(video).read_bytes())
    limits = Limits(max_tokens=4, images=ImageRules(media_dir=str(root / "media")))
    client = TestClient(create_app(engine, "tiny-vl", limits=limits), base_url="http://localhost")
    answers = {}
    for name, url in (("file", "walk.mp4"), ("data", data_url)):
        response = client.post("/v1/chat/completions", json={"messages": _video_message(url), "max_tokens": 4})
        answers[name] = (response.status_code, response.json()["choices"][0]["message"]["content"])
    facts["api_equal"] = all(value == (200, answer) for value in answers.values())

    lines, sent = iter([f"/video {video}", QUESTION, "exit"]), []
    real = engine.generate
    engine.generate = lambda ids, params, on_text=None, media=None: (
        sent.append((ids, media)) or real(ids, params, on_text, media)
    )
    chat_loop(engine, read=lambda _prompt: next(lines), write=lambda text: None)
    engine.generate = real
    facts["chat_equal"] = (
        len(sent) == 1
        and sent[0][0] == prompt_ids
        and torch.equal(sent[0][1]["pixel_values_videos"], media["pixel_values_videos"])
    )

    chat = {"model_name_or_path": "models/vl", "template": "qwen2_vl", **GEN.SETTINGS}
    web = TestClient(create_webui(str(root / "web"), chat_config=chat), base_url="http://localhost")
    web.app.state.chat.engine = engine  # what `lathe webchat CONFIG` loads (the whole config, video keys with it)
    body = {"messages": _video_message(data_url), "max_new_tokens": 4, "temperature": 0}
    with web.stream("POST", "/api/chat", json=body) as response:
        facts["web_answer"] = "".join(response.iter_text())
    facts["web_equal"] = facts["web_answer"] == answer
    return facts
