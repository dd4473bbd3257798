"""lathe chat / lathe api with images for the families beside Qwen2-VL (LLaVA-1.5, LLaVA-NeXT, Gemma 3, PaliGemma,
Llama 3.2 Vision), on each family's tiny random-weight model and real processor (built by
tests/llm/golden/make_llamafactory_families.py) saved in a folder as a user has one. The served prompt and image
tensors are the training pipeline's (the family plugin's expansion, PaliGemma's image prefix, the collator's
tensors); the greedy tokens equal the model's own generate on them, in the engine and through the API; lathe
export of a LoRA-merged LLaVA reloads with AutoModelForImageTextToText and gives the merged model's logits."""

import base64
import io

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.llm.test_multimodal_families import GEN  # noqa: E402  (the golden generator, loaded once)

FAMILIES = ["llava", "llava_next", "gemma3", "paligemma", "mllama"]
QUESTION = "What is in the picture?"
_FOLDERS: dict = {}


def _folder(family: str, root) -> str:
    """The family's model folder (weights, processor, tokenizer with the template's tokens), made once per module."""
    if family not in _FOLDERS:
        from lathe.llm.config.train import DataArguments
        from lathe.llm.templates import get_template_and_fix_tokenizer

        tokenizer = GEN.make_tokenizer(family)
        processor = GEN.make_processor(family, tokenizer)
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.FAMILIES[family][0]))
        model = GEN.make_model(family, tokenizer)
        # noise on every weight: the zero-initialized paths (Gemma 3's image projection, Llama 3.2 Vision's
        # cross-attention gates) carry the image too, and greedy tokens vary
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.3)
        folder = root / family
        model.save_pretrained(str(folder))
        processor.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        _FOLDERS[family] = str(folder)
    return _FOLDERS[family]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


def _engine(folder: str, family: str, **keys):
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.engine import ChatEngine

    keys = {"model_name_or_path": folder, "template": GEN.FAMILIES[family][0], "max_new_tokens": 5, **keys}
    keys = {key: value for key, value in keys.items() if value is not None}
    return ChatEngine.from_config(parse_infer_config({**keys, "do_sample": False}, command="chat"), max_batch=4)


def _message(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}],
        }
    ]


def _own_generate(engine, prompt_ids, media, max_new_tokens=5) -> list[int]:
    input_ids = torch.tensor([prompt_ids])
    output = engine.model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        **media,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=engine.stop_token_ids,
        pad_token_id=engine.tokenizer.pad_token_id,
    )[0, len(prompt_ids) :].tolist()
    stop = next((index for index, token in enumerate(output) if token in engine.stop_token_ids), len(output))
    return output[:stop]


def _training_batch(engine, image, answer_ids):
    """The training pipeline's encoded row and collated tensors for the same conversation and an answer."""
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED

    plugin = engine.image_encoder.plugin
    answer = engine.tokenizer.decode(answer_ids)
    media = {"image": [image]}
    messages = [{"role": "user", "content": "<image>" + QUESTION}, {"role": "assistant", "content": answer}]
    messages = [{**message, EXPANDED: True} for message in plugin.process_messages(messages, media)]
    ids, labels = encode_supervised_example(
        messages[:1], messages[1:], "", "", engine.template, engine.tokenizer, 4096 - plugin.prefix_length(media)
    )
    ids, labels = plugin.process_token_ids(ids, labels, media)
    row = {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), "images": [image]}
    return ids, labels, MultimodalCollator(SFTDataCollator(engine.tokenizer), plugin, engine.model)([row])


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_and_api_send_images_as_training_encodes_them_and_decode_as_generate(family, root):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lathe.llm.inference.api import create_app

    engine = _engine(_folder(family, root), family)
    assert engine.image_refusal() is None
    image = GEN.make_image("wide")
    prompt_ids, media = engine.chat_inputs(_message("x"), read_media=lambda part, where: image)
    expected = _own_generate(engine, prompt_ids, media)
    assert expected  # the tiny model answers something before a stop token
    # the training pipeline on the same conversation: the prompt is the row up to its answer, the tensors its
    # collator's (per-token ones over the prompt's positions)
    ids, labels, batch = _training_batch(engine, image, expected)
    answer_start = next(index for index, label in enumerate(labels) if label != -100)
    assert prompt_ids == ids[:answer_start]
    assert sorted(media) == sorted(key for key in batch if key not in ("input_ids", "labels", "attention_mask"))
    for key, value in media.items():
        trained = batch[key][:, : len(prompt_ids)] if key in ("token_type_ids", "cross_attention_mask") else batch[key]
        assert torch.equal(value, trained), key
    image_ids = engine.tokenizer.convert_tokens_to_ids(["<image>", "<image_soft_token>", "<|image|>"])
    assert sum(prompt_ids.count(token) for token in image_ids if token is not None and token >= 0) >= 1

    with torch.no_grad():  # the image reaches the answer: blank pixels give other logits
        input_ids = torch.tensor([prompt_ids])
        blank = {**media, "pixel_values": torch.zeros_like(media["pixel_values"])}
        logits = [engine.model(input_ids=input_ids, **inputs).logits[0, -1] for inputs in (media, blank)]
        assert not torch.allclose(*logits, atol=1e-3)

    params = engine.default_params()
    assert engine.generate(prompt_ids, params, media=media).generated == expected
    # a batch with a text-only row beside: each row's tokens as alone (rows with per-token tensors decoded apart)
    from lathe.llm.inference.generation import Sequence

    text_prompt = engine.chat_prompt([{"role": "user", "content": QUESTION}])
    rows = [Sequence(list(prompt_ids), engine.default_params(), media=dict(media)) for _ in range(2)]
    rows.insert(1, Sequence(list(text_prompt), engine.default_params()))  # and the same image request twice
    engine.generator.generate(rows)
    assert [rows[0].generated, rows[2].generated] == [expected, expected]
    assert rows[1].generated == engine.generate(text_prompt, params).generated

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    client = TestClient(create_app(engine, family), base_url="http://localhost")
    response = client.post("/v1/chat/completions", json={"messages": _message(url), "max_tokens": 4})
    body = response.json()
    assert response.status_code == 200, body
    assert body["choices"][0]["message"]["content"] == engine.tokenizer.decode(expected[:4], skip_special_tokens=True)
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)


def test_chat_attaches_an_image_for_llama_3_2_vision(root, tmp_path):
    """`/image PATH` in lathe chat: the image goes with the next message, its answer the model's own generate's."""
    from lathe.llm.inference.chat import chat_loop

    engine = _engine(_folder("mllama", root), "mllama")
    GEN.make_image("square").save(tmp_path / "cat.png")  # one tile of two: the mask matters
    prompt_ids, media = engine.chat_inputs(
        _message("x"), read_media=lambda part, where: GEN.make_image("square").convert("RGB")
    )
    answer = engine.tokenizer.decode(_own_generate(engine, prompt_ids, media), skip_special_tokens=True)
    lines, out = iter([f"/image {tmp_path / 'cat.png'}", QUESTION, "exit"]), []
    assert chat_loop(engine, read=lambda _prompt: next(lines), write=out.append) == 0
    text = "".join(out)
    assert "`/image PATH` attaches an image" in text and "cat.png attached, 28x28" in text
    assert answer and answer in text


def test_a_family_without_images_is_refused_with_a_400(root):
    """An image for a model whose family takes none (Qwen2-Audio): the family's one line, a 400 from the API."""
    pytest.importorskip("fastapi")
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from lathe.llm.inference.api import create_app
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.vision import load_image_encoder

    folder = _folder("llava", root)
    config = parse_infer_config({"model_name_or_path": folder, "template": "llava"}, command="chat")
    model = SimpleNamespace(config=SimpleNamespace(audio_config={}))
    template = SimpleNamespace(name="qwen2_audio", multimodal="qwen2_audio")
    engine = _engine(folder, "llava")
    engine.image_encoder = load_image_encoder(config, model, template, engine.tokenizer)
    assert engine.image_encoder.refusal == "template 'qwen2_audio': the qwen2_audio family takes no images."
    buffer = io.BytesIO()
    GEN.make_image("wide").save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    response = TestClient(create_app(engine, "audio"), base_url="http://localhost").post(
        "/v1/chat/completions", json={"messages": _message(url)}
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == engine.image_encoder.refusal


@pytest.mark.parametrize("family", ["llava", "llava_next", "gemma3"])
def test_export_of_a_lora_merged_model_reloads_with_the_same_logits(family, root, tmp_path):
    """Served again from the export folder with its own template (LLaVA-NeXT and Gemma 3 render like the llava and
    gemma text templates: the model's family wins) and the merged model's logits on the probe image."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForImageTextToText

    from lathe.llm.export import export_model
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.vision import image_probe

    folder = _folder(family, root)
    torch.manual_seed(1)
    base = AutoModelForImageTextToText.from_pretrained(folder)
    config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    keys = {"model_name_or_path": folder, "adapter_name_or_path": str(tmp_path / "adapter")}
    keys |= {"finetuning_type": "lora", "template": GEN.FAMILIES[family][0], "export_dir": str(tmp_path / "out")}
    report = export_model(parse_infer_config(keys, command="export"))
    assert report.processor_saved and report.merged_adapters and report.change_from_base > 1e-3

    served = _engine(str(tmp_path / "out"), family, template=None)  # read back from the chat_template
    assert served.template.name == GEN.FAMILIES[family][0] and served.image_refusal() is None
    probe = image_probe(parse_infer_config(keys, command="export"), served.model, served.tokenizer, served.template)
    assert "pixel_values" in probe and probe["input_ids"].shape[-1] > 8
    reference = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(folder), tmp_path / "adapter")
    with torch.no_grad():
        expected = reference(**probe).logits
        for model_class in (AutoModelForImageTextToText, type(base)):
            exported = model_class.from_pretrained(tmp_path / "out").eval()
            assert torch.allclose(exported(**probe).logits, expected, atol=1e-5), model_class.__name__
        with reference.disable_adapter():  # the adapter moved them
            assert not torch.allclose(reference(**probe).logits, expected, atol=1e-3)


def test_audio_is_served_as_training_encodes_it(root, tmp_path):
    """Qwen2-Audio with an audio_url part (LLaMA-Factory's protocol type): the served prompt and input_features are
    the training pipeline's for the same file (read with PyAV, resampled to audio_sampling_rate), greedy tokens equal
    the model's own generate, and lathe api answers the same; lathe chat's /audio attaches the file."""
    pytest.importorskip("fastapi")
    pytest.importorskip("av")
    from fastapi.testclient import TestClient

    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.inference.api import create_app
    from lathe.llm.inference.chat import chat_loop
    from lathe.llm.inference.image_urls import ImageRules
    from lathe.llm.inference.requests import media_reader
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED
    from tests.llm.media_files import AUDIO_FILES, write_audio

    path = write_audio(tmp_path / "stereo.wav", *AUDIO_FILES["stereo.wav"])  # 8 kHz stereo: averaged, resampled
    engine = _engine(_folder("qwen2_audio", root), "qwen2_audio")
    url = "data:audio/wav;base64," + base64.b64encode(path.read_bytes()).decode()
    message = [
        {"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": url}}, {"type": "text", "text": "?"}]}
    ]
    prompt_ids, media = engine.chat_inputs(message, read_media=media_reader(ImageRules()))
    plugin = engine.image_encoder.plugin
    audio = {"audio": plugin.regularize("audio", [str(path)], "a row")}
    turns = [{"role": "user", "content": "<audio>?"}, {"role": "assistant", "content": "ok"}]
    expanded = [{**turn, EXPANDED: True} for turn in plugin.process_messages(turns, audio)]
    ids, labels = encode_supervised_example(expanded[:1], expanded[1:], "", "", engine.template, engine.tokenizer, 4096)
    assert prompt_ids == ids[: next(index for index, label in enumerate(labels) if label != -100)]
    row = {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), "audios": [str(path)]}
    batch = MultimodalCollator(SFTDataCollator(engine.tokenizer), plugin, engine.model)([row])
    assert sorted(media) == ["feature_attention_mask", "input_features"]
    assert all(torch.equal(media[key], batch[key]) for key in media)
    expected = _own_generate(engine, prompt_ids, media)
    assert expected and engine.generate(prompt_ids, engine.default_params(), media=media).generated == expected
    response = TestClient(create_app(engine, "audio"), base_url="http://localhost").post(
        "/v1/chat/completions", json={"messages": message, "max_tokens": 5}
    )
    answer = engine.tokenizer.decode(expected, skip_special_tokens=True)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == answer
    out, lines = [], iter([f"/image {path}", f"/audio {path}", "exit"])
    chat_loop(engine, read=lambda _prompt: next(lines), write=out.append)
    text = "".join(out)
    assert "`/audio PATH` attach a file" in text and "the qwen2_audio family takes no images" in text
    assert f"audio {path} attached" in text
