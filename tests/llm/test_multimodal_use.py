"""Using a vision-language model (a tiny random Qwen2-VL with the qwen2_vl template): lathe chat's `/image PATH`,
lathe api's OpenAI image_url parts (data URLs, files under --media_dir only, remote URLs and paths outside the
folder refused with a 400) and lathe export of a LoRA-merged model with its image processor. Images are encoded
as training encodes them; greedy tokens equal the model's own generate (with its mrope positions) on the same
inputs, alone and batched; the exported folder gives the merged model's logits on an image."""

import base64
import contextlib
import importlib.util
import io
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from lathe.llm.inference.engine import ChatEngine  # noqa: E402
from lathe.llm.inference.generation import Sequence  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"
QUESTION = "What is in the picture?"


def _generator():
    spec = importlib.util.spec_from_file_location("make_qwen2vl", GOLDEN_DIR / "make_llamafactory_qwen2vl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    return _generator()


@pytest.fixture(scope="module")
def vl_dir(gen, tmp_path_factory):
    """A model folder as a user has one: weights, tokenizer with the vision tokens, preprocessor_config.json."""
    folder = tmp_path_factory.mktemp("tiny_qwen2vl")
    tokenizer = gen.make_tokenizer()
    gen.make_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    gen.make_image_processor().save_pretrained(folder)
    # a processor file this machine cannot build (its video processor needs torchvision): export copies it
    (folder / "video_preprocessor_config.json").write_text('{"video_processor_type": "Qwen2VLVideoProcessor"}')
    return str(folder)


def _engine(model_dir, template="qwen2_vl", **kwargs):
    from lathe.llm.inference.config import parse_infer_config

    keys = {"model_name_or_path": model_dir, "max_new_tokens": 5, "do_sample": False, **kwargs}
    if template:
        keys["template"] = template
    return ChatEngine.from_config(parse_infer_config(keys, command="chat"), max_batch=4)


@pytest.fixture(scope="module")
def engine(vl_dir):
    return _engine(vl_dir)


@contextlib.contextmanager
def _recorded_positions(model):
    """The 3-D rotary positions of every forward of `model` (generate's text row, when it adds one, left out)."""
    seen = []

    def record(module, args, kwargs):
        positions = kwargs["position_ids"]
        seen.append(positions[1:] if positions.shape[0] == 4 else positions)

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _image_message(url: str, text: str = QUESTION) -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}
    ]


def _own_generate(engine, prompt_ids, media, max_new_tokens=5) -> list[int]:
    """The model's own greedy generate on the same inputs (mm_token_type_ids: its mrope positions)."""
    input_ids = torch.tensor([prompt_ids])
    token_types = (input_ids == engine.model.config.image_token_id).long()
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


def test_images_are_encoded_as_training_encodes_them_and_decode_as_the_models_generate(gen, engine):
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal import qwen2_vl
    from lathe.llm.multimodal.collator import Qwen2VLCollator

    images = {name: gen.make_image(name) for name in ("large", "wide")}
    requests = {
        name: engine.chat_inputs(_image_message(name), read_media=lambda part, where: images[part["image_url"]["url"]])
        for name in images
    }
    # the training path on the same conversation: same prompt tokens, same pixel tensors
    processor = engine.image_encoder.image_processor
    for name, (prompt_ids, media) in requests.items():
        messages = [{"role": "user", "content": "<image>" + QUESTION}, {"role": "assistant", "content": "ok"}]
        grid = qwen2_vl.image_inputs([images[name]], processor)["image_grid_thw"]
        expanded = qwen2_vl.expand_placeholders(messages, grid, processor.merge_size)
        ids, labels = encode_supervised_example(
            expanded[:1], expanded[1:], "", "", engine.template, engine.tokenizer, 1024
        )
        answer_start = next(index for index, label in enumerate(labels) if label != -100)
        assert prompt_ids == ids[:answer_start], name
        row = {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), "images": [images[name]]}
        batch = Qwen2VLCollator(SFTDataCollator(engine.tokenizer), processor, engine.model)([row])
        assert torch.equal(batch["pixel_values"], media["pixel_values"]), name
        assert batch["image_grid_thw"].tolist() == media["image_grid_thw"].tolist(), name
        training_positions = batch["position_ids"][1:, :, : len(prompt_ids)]
    assert prompt_ids.count(engine.model.config.image_token_id) == int(grid.prod()) // 4 > 1

    params = engine.default_params()
    with _recorded_positions(engine.model) as own_positions:
        expected = {name: _own_generate(engine, *requests[name]) for name in requests}
    with _recorded_positions(engine.model) as positions:
        alone = {
            name: engine.generate(requests[name][0], params, media=requests[name][1]).generated for name in requests
        }
    assert all(expected.values()) and alone == expected
    # every forward at the model's own mrope positions; the prompt's are training's (the image's rows and columns)
    assert len(positions) == len(own_positions) and all(map(torch.equal, positions, own_positions))
    prompt_forwards = [forward for forward in positions if forward.shape[-1] > 1]  # the last is the last image's
    assert len(prompt_forwards) == 2 and torch.equal(prompt_forwards[-1], training_positions)
    assert not torch.equal(training_positions[0, 0], torch.arange(len(prompt_ids)))
    # decoded together (left padding, both images in one forward): the same tokens, and a text-only row beside them
    text_prompt = engine.chat_prompt([{"role": "user", "content": QUESTION}])
    batch = [Sequence(list(requests[name][0]), engine.default_params(), media=requests[name][1]) for name in requests]
    batch.append(Sequence(list(text_prompt), engine.default_params()))
    engine.generator.generate(batch)
    assert [seq.generated for seq in batch[:2]] == list(expected.values())
    assert batch[2].generated == _own_generate(engine, text_prompt, {})


def test_chat_attaches_images_with_the_image_command(gen, engine, tmp_path):
    from lathe.llm.inference.chat import chat_loop

    gen.make_image("large").save(tmp_path / "cat.png")
    lines = iter([f"/image {tmp_path / 'missing.png'}", f"/image {tmp_path / 'cat.png'}", QUESTION, "And now?", "exit"])
    out, sent = [], []
    real = engine.generate
    engine.generate = lambda prompt_ids, params, on_text=None, media=None: (
        sent.append((prompt_ids, media)) or real(prompt_ids, params, on_text, media)
    )
    try:
        assert chat_loop(engine, read=lambda _prompt: next(lines), write=out.append) == 0
    finally:
        engine.generate = real
    text = "".join(out)
    assert "`/image PATH`, `/video PATH` attach a file" in text and "missing.png' not found" in text
    assert "cat.png attached, 200x150" in text
    image_token = engine.model.config.image_token_id
    (first_ids, first_media), (second_ids, second_media) = sent
    tokens = first_ids.count(image_token)
    assert tokens > 0 and second_ids.count(image_token) == tokens  # the image stays in the conversation
    assert torch.equal(first_media["pixel_values"], second_media["pixel_values"])
    expected, _ = engine.chat_inputs(
        _image_message("cat"), read_media=lambda part, where: gen.make_image("large").convert("RGB")
    )
    assert first_ids == expected


@pytest.fixture(scope="module")
def api(engine, tmp_path_factory, gen):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lathe.llm.inference.api import create_app
    from lathe.llm.inference.image_urls import ImageRules
    from lathe.llm.inference.requests import Limits

    root = tmp_path_factory.mktemp("media")
    (root / "photos").mkdir()
    gen.make_image("large").save(root / "photos" / "cat.png")
    outside = tmp_path_factory.mktemp("outside")
    gen.make_image("large").save(outside / "secret.png")
    os.symlink(outside / "secret.png", root / "link.png")
    (root / "notes.png").write_text("not an image")
    Image = pytest.importorskip("PIL.Image")
    Image.new("L", (300, 300)).save(root / "big.png")

    def client(media_dir):
        rules = ImageRules(media_dir=media_dir, max_images=2, max_image_pixels=250 * 250)
        return TestClient(
            create_app(engine, "tiny-vl", limits=Limits(max_tokens=8, images=rules)), base_url="http://localhost"
        )

    return client(str(root)), client(None), root, outside


def _post(client, messages, **extra):
    response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, **extra})
    return response.status_code, response.json()


def test_api_reads_data_urls_and_files_under_the_media_folder_only(gen, engine, api):
    served, no_files, root, outside = api
    png = base64.b64encode(_png(gen.make_image("large"))).decode()
    prompt_ids, media = engine.chat_inputs(
        _image_message("x"), read_media=lambda part, where: gen.make_image("large").convert("RGB")
    )
    answer = engine.tokenizer.decode(_own_generate(engine, prompt_ids, media, 4), skip_special_tokens=True)
    for url in (
        f"data:image/png;base64,{png}",
        "photos/cat.png",
        str(root / "photos" / "cat.png"),
        f"file://{root / 'photos' / 'cat.png'}",
    ):
        status, body = _post(served, _image_message(url))
        assert status == 200, (url, body)
        assert body["choices"][0]["message"]["content"] == answer, url
        assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    status, body = _post(no_files, _image_message(f"data:image/png;base64,{png}"))
    assert status == 200 and body["choices"][0]["message"]["content"] == answer
    streamed = served.post(
        "/v1/chat/completions", json={"messages": _image_message("photos/cat.png"), "max_tokens": 4, "stream": True}
    )
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks) == answer

    refused = {
        (served, os.path.relpath(outside / "secret.png", root)): "outside the server's media folder",
        (served, str(outside / "secret.png")): "outside the server's media folder",
        (served, "link.png"): "outside the server's media folder",  # a link inside that leads out
        (served, f"file://{outside / 'secret.png'}"): "outside the server's media folder",
        (served, "photos/dog.png"): "no file 'photos/dog.png' in the server's media folder",
        (served, "notes.png"): "is not a readable image",
        (served, "big.png"): "the image is 300x300 pixels; at most 62500",
        (served, "https://example.com/cat.png"): "is a remote URL; this server reads no network",
        (served, "ftp://example.com/cat.png"): "ftp: URLs are not supported",
        (served, "data:image/png;base64,@@@"): "base64 is not valid",
        (served, "data:text/plain;base64,aGk="): "data:image/<type>;base64",
        (no_files, "photos/cat.png"): "this server reads no local files",
    }
    for (client, url), message in refused.items():
        status, body = _post(client, _image_message(url))
        assert status == 400 and message in body["error"]["message"], (url, body)
        assert body["error"]["param"] == "messages[0].content[0].image_url", url
    status, body = _post(served, [{"role": "user", "content": [{"type": "image_url"}]}])
    assert status == 400 and '"image_url": {"url": ...}' in body["error"]["message"]
    three = [{"type": "image_url", "image_url": {"url": "photos/cat.png"}}] * 3
    status, body = _post(served, [{"role": "user", "content": three}])
    assert status == 400 and "at most 2 images per request" in body["error"]["message"]
    mismatch = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "photos/cat.png"}},
                {"type": "text", "text": "<image> and?"},
            ],
        }
    ]
    status, body = _post(served, mismatch)
    assert status == 400 and "1 image(s) given but the messages hold 2 <image>" in body["error"]["message"]


def test_text_only_models_refuse_images_with_a_400(tiny_model_dir, vl_dir, gen):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lathe.llm.inference.api import create_app

    png = base64.b64encode(_png(gen.make_image("small"))).decode()
    text_engine = _engine(tiny_model_dir, template="chatml")
    client = TestClient(create_app(text_engine, "tiny"), base_url="http://localhost")
    status, body = _post(client, _image_message(f"data:image/png;base64,{png}"))
    assert status == 400 and "is a text-only model (LlamaForCausalLM): it takes no images" in body["error"]["message"]
    assert body["error"]["param"] == "messages[0].content[0]"
    from types import SimpleNamespace

    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.vision import load_image_encoder

    config = parse_infer_config({"model_name_or_path": vl_dir, "template": "qwen"}, command="chat")
    vl_model = SimpleNamespace(config=SimpleNamespace(vision_config={}))
    encoder = load_image_encoder(config, vl_model, SimpleNamespace(name="qwen", multimodal=""))
    assert encoder.refusal.startswith("template 'qwen' is a text template: serve ")
    # a family lathe does not have (every LLaMA-Factory plugin has one now: a name no plugin has)
    encoder = load_image_encoder(config, vl_model, SimpleNamespace(name="custom", multimodal="custom_vl"))
    assert "image, video and audio input is not supported yet" in encoder.refusal
    # a family served through its training plugin whose processor needs a missing package: that package named
    if importlib.util.find_spec("torchvision") is None:
        pixtral = SimpleNamespace(name="pixtral", multimodal="pixtral")
        encoder = load_image_encoder(config, vl_model, pixtral, tokenizer=object())
        assert "the pixtral family needs torchvision" in encoder.refusal


def test_export_merges_lora_saves_the_processor_and_reloads_with_the_same_logits(gen, vl_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForImageTextToText, Qwen2VLForConditionalGeneration

    from lathe.llm.export import export_model
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.vision import image_probe

    torch.manual_seed(1)
    base = AutoModelForImageTextToText.from_pretrained(vl_dir)
    config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    keys = {"model_name_or_path": vl_dir, "adapter_name_or_path": str(tmp_path / "adapter")}
    keys |= {"finetuning_type": "lora", "template": "qwen2_vl", "export_dir": str(tmp_path / "out")}
    report = export_model(parse_infer_config(keys, command="export"))
    assert report.processor_saved and report.merged_adapters and report.change_from_base > 1e-3
    names = set(os.listdir(tmp_path / "out"))
    assert {"preprocessor_config.json", "video_preprocessor_config.json", "chat_template.jinja"} <= names
    assert {"tokenizer.json", "model.safetensors", "generation_config.json"} <= names

    served = _engine(str(tmp_path / "out"), template=None)  # the template is read back from the chat_template
    assert served.template.name == "qwen2_vl" and served.image_refusal() is None
    probe = image_probe(parse_infer_config(keys, command="export"), served.model, served.tokenizer, served.template)
    assert probe["image_grid_thw"].tolist() == [[1, 4, 6]]
    reference = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(vl_dir), tmp_path / "adapter")
    with torch.no_grad():
        expected = reference(**probe).logits
        for model_class in (AutoModelForImageTextToText, Qwen2VLForConditionalGeneration):
            exported = model_class.from_pretrained(tmp_path / "out").eval()
            assert torch.allclose(exported(**probe).logits, expected, atol=1e-5), model_class.__name__
        with reference.disable_adapter():  # the adapter moved them
            assert not torch.allclose(reference(**probe).logits, expected, atol=1e-3)


def test_lathe_api_takes_the_media_folder_from_its_option_or_llamafactorys_variables(monkeypatch):
    import lathe.llm.commands
    from lathe.cli import main

    servers = []
    monkeypatch.setattr(
        lathe.llm.commands, "api_command", lambda config, overrides, server, traceback: servers.append(server) or 0
    )
    monkeypatch.setenv("SAFE_MEDIA_PATH", "/srv/media")
    assert main(["api", "serve.yaml", "--media_dir", "/data/images", "--max_body_bytes", "5000000"]) == 0
    assert main(["api", "serve.yaml"]) == 0
    monkeypatch.setenv("ALLOW_LOCAL_FILES", "false")
    assert main(["api", "serve.yaml", "temperature=0"]) == 0
    assert [(server["media_dir"], server["max_body_bytes"]) for server in servers] == [
        ("/data/images", 5_000_000),
        ("/srv/media", None),
        (None, None),
    ]
    from lathe.llm.inference.api import api_command

    pytest.importorskip("uvicorn")
    with pytest.raises(ValueError, match="--media_dir '/no/such/folder' is not a folder"):
        api_command("never-read.yaml", [], media_dir="/no/such/folder")


def test_webui_chat_takes_an_image(gen, vl_dir, tmp_path):
    """The web chat sends an attached image as an `image_url` data URL part; the answer is the engine's own for
    the same prompt and image (as `lathe chat` / `lathe api` encode it)."""
    import base64
    import io
    import shutil

    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lathe.llm.webui.chat import ChatSession
    from lathe.llm.webui.server import create_app

    shutil.copytree(vl_dir, tmp_path / "root" / "models" / "vl")
    chat = {"model_name_or_path": "models/vl", "template": "qwen2_vl"}
    client = TestClient(create_app(str(tmp_path / "root"), chat_config=chat), base_url="http://localhost")
    assert client.post("/api/chat/load", json=chat).json()["template"] == "qwen2_vl"
    buffer = io.BytesIO()
    gen.make_image("large").save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": content}]
    with client.stream("POST", "/api/chat", json={"messages": messages, "max_new_tokens": 5, "temperature": 0}) as r:
        answer = "".join(r.iter_text())
    engine = client.app.state.chat.engine
    prompt_ids, media = engine.chat_inputs(messages, read_media=ChatSession.media_reader())
    assert media and engine.model.config.image_token_id in prompt_ids
    expected = engine.generate(prompt_ids, engine.default_params(max_new_tokens=5, temperature=0), media=media)
    assert answer == expected.text and answer
    path = [{"type": "image_url", "image_url": {"url": str(tmp_path / "x.png")}}, {"type": "text", "text": "hi"}]
    refused = client.post("/api/chat", json={"messages": [{"role": "user", "content": path}]})
    assert refused.status_code == 400 and "reads no local files" in refused.json()["error"]


def _video_message(url: str, kind: str = "video_url", text: str = "What happens?") -> list[dict]:
    return [{"role": "user", "content": [{"type": kind, kind: {"url": url}}, {"type": "text", "text": text}]}]


def test_api_reads_video_and_audio_parts_under_the_same_rules_as_images(api, tmp_path_factory):
    """video_url / audio_url parts (LLaMA-Factory's api/protocol.py): files under --media_dir only, data URLs,
    remote URLs refused, every failure a 400 naming the part; a readable video reaches the family's plugin, which
    here (no torchvision: transformers' video processor needs it) names torchvision. The videos' tokens and
    tensors with torchvision: test_video_is_served_as_training_encodes_it."""
    from tests.llm.media_files import write_video

    served, no_files, root, outside = api
    write_video(root / "walk.mp4", 64, 48, 13, 5)
    write_video(outside / "secret.mp4", 64, 48, 13, 5)
    (root / "broken.mp4").write_bytes(b"\x00\x00\x00 ftypisom not really a video")
    huge = tmp_path_factory.mktemp("huge") / "huge.mp4"
    write_video(huge, 320, 240, 2, 5)  # frames over the fixture's 250x250 pixel bound
    (root / "huge.mp4").write_bytes(huge.read_bytes())
    refused = {
        (served, os.path.relpath(outside / "secret.mp4", root)): "outside the server's media folder",
        (served, f"file://{outside / 'secret.mp4'}"): "outside the server's media folder",
        (served, "clips/missing.mp4"): "no file 'clips/missing.mp4' in the server's media folder",
        (served, "broken.mp4"): "'broken.mp4' is not a readable video",
        (served, "huge.mp4"): "the video's frames are 320x240 pixels; at most 62500",
        (served, "https://example.com/cat.mp4"): "is a remote URL; this server reads no network",
        (served, "data:video/mp4;base64,@@@"): "base64 is not valid",
        (served, "data:image/png;base64,aGk="): "data:video/<type>;base64",
        (no_files, "walk.mp4"): "this server reads no local files",
    }
    for (client, url), message in refused.items():
        status, body = _post(client, _video_message(url))
        assert status == 400 and message in body["error"]["message"], (url, body)
        assert body["error"]["param"] == "messages[0].content[0].video_url", url
    data = base64.b64encode((root / "walk.mp4").read_bytes()).decode()
    status, body = _post(served, _video_message(f"data:audio/wav;base64,{data}", "audio_url"))
    assert status == 400 and "the qwen2_vl family takes no audio input" in body["error"]["message"]
    assert body["error"]["param"] == "messages[0].content[0]"
    status, body = _post(served, [{"role": "user", "content": [{"type": "video_url", "video_url": {}}]}])
    assert status == 400 and '"video_url": {"url": ...}' in body["error"]["message"]
    five = [{"type": "video_url", "video_url": {"url": "walk.mp4"}}] * 5
    status, body = _post(served, [{"role": "user", "content": five}])
    assert status == 400 and "at most 4 videos per request" in body["error"]["message"]
    if importlib.util.find_spec("torchvision") is None:
        for url in ("walk.mp4", f"data:video/mp4;base64,{data}"):
            status, body = _post(served, _video_message(url))
            assert status == 400 and "needs torchvision" in body["error"]["message"], body


def test_chat_attaches_videos_with_the_video_command(engine, tmp_path):
    from lathe.llm.inference.chat import chat_loop
    from tests.llm.media_files import write_video

    write_video(tmp_path / "walk.mp4", 64, 48, 13, 5)
    (tmp_path / "broken.mp4").write_text("not a video")
    lines = iter(
        [
            f"/video {tmp_path / 'missing.mp4'}",
            f"/video {tmp_path / 'broken.mp4'}",
            f"/audio {tmp_path / 'walk.mp4'}",
            f"/video {tmp_path / 'walk.mp4'}",
            "What happens?",
            "exit",
        ]
    )
    out = []
    assert chat_loop(engine, read=lambda _prompt: next(lines), write=out.append) == 0
    text = "".join(out)
    assert "`/image PATH`, `/video PATH` attach a file to your next message" in text
    assert "missing.mp4' not found" in text and "broken.mp4' is not a readable video" in text
    assert "(not attached: the qwen2_vl family takes no audio input.)" in text
    assert "walk.mp4 attached, 64x48" in text
    if importlib.util.find_spec("torchvision") is None:  # the message is not sent; the chat goes on
        assert "(not sent: " in text and "needs torchvision" in text
