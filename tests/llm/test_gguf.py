"""`export_gguf` in `lathe export`: GGUF files written with llama.cpp's `gguf` package, read back with its
reader (tensor names, shapes, types, metadata, tokenizer), q8_0 within its rounding of the weights,
llama.cpp's q/k permutation and Gemma's norm shift, the embedded chat template rendering as lathe's
template, and the Ollama Modelfile's Go template rendering what lathe renders. Loading the files with
llama.cpp itself is bench/gguf_llamacpp.py (llama-cpp-python compiles llama.cpp); the test here that
needs it skips when `llama_cpp` is not importable."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch

from tests.llm.runs import trained_lora_adapter

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

sys.path.insert(0, os.path.dirname(__file__))
from go_template import render as render_go  # noqa: E402

from lathe.llm.export import export_model, format_report  # noqa: E402
from lathe.llm.gguf.architectures import UnsupportedModel, permute_rotary  # noqa: E402
from lathe.llm.gguf.modelfile import go_template  # noqa: E402
from lathe.llm.gguf.writer import parse_gguf_types, write_gguf_files  # noqa: E402
from lathe.llm.inference.config import parse_infer_config  # noqa: E402
from lathe.llm.templates.registry import get_template  # noqa: E402

LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CORPUS = ["Hello world, I'm lathe.", "def f(x):\n    return x + 1", "12345 tokens 3.14 ünïcödé 你好"] * 8


def fields(path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return reader, {name: field.contents() for name, field in reader.fields.items()}


def export(model_dir, export_dir, **extra):
    values = {"model_name_or_path": model_dir, "template": "chatml", "finetuning_type": "full"}
    values.update(export_dir=str(export_dir), **extra)
    return export_model(parse_infer_config(values, command="export"))


def hf_state(folder) -> dict:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}


def test_full_export_writes_f16_and_q8_0_that_read_back(tiny_model_dir, tmp_path):
    report = export(tiny_model_dir, tmp_path / "out", export_gguf=["f16", "q8_0"])
    (f16, modelfile), (q8, _) = report.gguf_files
    assert os.path.basename(f16.path) == "out-f16.gguf" and os.path.basename(q8.path) == "out-q8_0.gguf"
    assert os.path.basename(modelfile) == "Modelfile" and (tmp_path / "out" / "Modelfile.q8_0").is_file()
    text = format_report(report)
    assert "llama-cli -m " in text and "ollama create out-f16 -f " in text

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    state = hf_state(tmp_path / "out")
    reader, meta = fields(f16.path)
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == 1
    assert meta["llama.block_count"] == 3 and meta["llama.context_length"] == 256
    assert meta["llama.embedding_length"] == 32 and meta["llama.feed_forward_length"] == 64
    assert meta["llama.attention.head_count"] == 4 and meta["llama.attention.head_count_kv"] == 2
    assert (
        meta["llama.rope.dimension_count"] == 8
        and meta["llama.rope.freq_base"] == config["rope_parameters"]["rope_theta"]
    )
    assert meta["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    # tokenizer: the vocabulary in id order, merges, special ids (chatml: EOS <|im_end|>, EOT <|im_start|>)
    vocab = tokenizer.get_vocab()
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.tokens"] == sorted(vocab, key=vocab.get)
    spec = json.loads((tmp_path / "out" / "tokenizer.json").read_text())
    assert meta["tokenizer.ggml.merges"] == [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    assert (
        meta["tokenizer.ggml.eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id
    )
    assert meta["tokenizer.ggml.eot_token_id"] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert (
        meta["tokenizer.ggml.bos_token_id"] == tokenizer.bos_token_id and meta["tokenizer.ggml.add_bos_token"] is False
    )
    types = meta["tokenizer.ggml.token_type"]
    assert types[vocab["<|im_end|>"]] == gguf.TokenType.CONTROL and types[vocab["user"]] == gguf.TokenType.NORMAL
    assert meta["tokenizer.chat_template"] == tokenizer.chat_template

    tensors = {t.name: t for t in reader.tensors}
    expected = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{part}.weight"
        for i in range(3)
        for part in (
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        )
    }
    assert set(tensors) == expected
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert tensors["blk.0.attn_k.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert list(tensors["blk.0.attn_k.weight"].shape) == [32, 16]  # ggml order: (columns, rows)
    # llama.cpp's interleaved RoPE: q / k rows permuted per head, v as it is
    q = state["model.layers.1.self_attn.q_proj.weight"]
    k = state["model.layers.1.self_attn.k_proj.weight"]
    np.testing.assert_allclose(tensors["blk.1.attn_q.weight"].data, permute_rotary(q, 4).astype(np.float16))
    np.testing.assert_allclose(tensors["blk.1.attn_k.weight"].data, permute_rotary(k, 2).astype(np.float16))
    assert not np.allclose(permute_rotary(q, 4), q)
    np.testing.assert_array_equal(
        tensors["blk.1.ffn_norm.weight"].data, state["model.layers.1.post_attention_layernorm.weight"]
    )

    # q8_0: 32-value blocks, each within half a step (max|block| / 127 / 2, plus the f16 scale's rounding)
    q8_reader, q8_meta = fields(q8.path)
    assert q8_meta["general.file_type"] == 7
    output = next(t for t in q8_reader.tensors if t.name == "output.weight")
    assert output.tensor_type == gguf.GGMLQuantizationType.Q8_0
    weights = state["lm_head.weight"]
    restored = gguf.quants.dequantize(output.data, gguf.GGMLQuantizationType.Q8_0).reshape(weights.shape)
    step = np.abs(weights.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
    error = np.abs(restored - weights).reshape(-1, 32)
    assert (error <= step * 0.5 + np.abs(weights.reshape(-1, 32)) * 2e-3 + 1e-7).all()
    assert 0 < error.max() < 0.01


def test_lora_merge_exports_the_merged_weights(tiny_model_dir, tmp_path):
    from test_export import make_adapter

    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    report = export(
        tiny_model_dir, tmp_path / "out", finetuning_type="lora", adapter_name_or_path=adapter, export_gguf="bf16"
    )
    ((bf16, _),) = report.gguf_files
    merged = hf_state(tmp_path / "out")
    base = hf_state(tiny_model_dir)
    tensors = {t.name: t for t in gguf.GGUFReader(bf16.path).tensors}
    v = tensors["blk.2.attn_v.weight"]
    assert v.tensor_type == gguf.GGMLQuantizationType.BF16
    restored = gguf.quants.dequantize(v.data, gguf.GGMLQuantizationType.BF16).reshape(
        merged["model.layers.2.self_attn.v_proj.weight"].shape
    )
    np.testing.assert_allclose(restored, merged["model.layers.2.self_attn.v_proj.weight"], rtol=1e-2, atol=1e-6)
    assert np.abs(restored - base["model.layers.2.self_attn.v_proj.weight"]).max() > 1e-2  # the adapter is in it


def _tiny(config_class, folder, tokenizer_dir, **values):
    folder.mkdir()
    for item in os.listdir(tokenizer_dir):
        if not item.endswith((".safetensors", "config.json")) or item == "tokenizer_config.json":
            shutil.copy(os.path.join(tokenizer_dir, item), folder / item)
    config = config_class(
        vocab_size=400,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        **values,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize(
    "name,arch,extra_tensors",
    [
        ("Qwen2Config", "qwen2", {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"}),
        ("Qwen3Config", "qwen3", {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"}),
        ("MistralConfig", "llama", {"blk.0.attn_q.weight"}),
        ("Gemma2Config", "gemma2", {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"}),
        ("Gemma3TextConfig", "gemma3", {"blk.0.attn_q_norm.weight", "blk.0.post_ffw_norm.weight"}),
        ("Phi3Config", "phi3", {"blk.0.attn_qkv.weight"}),
    ],
)
def test_each_architecture_is_named_and_described_as_llama_cpp_expects(
    tiny_model_dir, tmp_path, name, arch, extra_tensors
):
    values = {"head_dim": 16} if arch.startswith("gemma") else {"pad_token_id": 0} if arch == "phi3" else {}
    if arch == "gemma3":
        values.update(
            query_pre_attn_scalar=16, sliding_window=32, layer_types=["sliding_attention", "sliding_attention"]
        )
    if arch == "gemma2":
        values.update(query_pre_attn_scalar=16, sliding_window=32, layer_types=["sliding_attention", "full_attention"])
    folder = _tiny(getattr(transformers, name), tmp_path / arch, tiny_model_dir, **values)
    (written,) = write_gguf_files(str(folder), ["f16"])
    reader, meta = fields(written.path)
    names = {t.name for t in reader.tensors}
    assert meta["general.architecture"] == arch and extra_tensors <= names
    assert all(not n.startswith(("model.", "lm_head")) for n in names) and "token_embd.weight" in names
    assert meta[f"{arch}.block_count"] == 2 and meta[f"{arch}.embedding_length"] == 64
    state = hf_state(folder)
    tensors = {t.name: t for t in reader.tensors}
    if arch.startswith("gemma"):  # llama.cpp multiplies by the weight: Hugging Face's (1 + w) is stored
        norm = state["model.layers.0.input_layernorm.weight"]
        np.testing.assert_allclose(tensors["blk.0.attn_norm.weight"].data, norm + 1)
        assert meta[f"{arch}.attention.sliding_window"] == 32 and meta[f"{arch}.attention.key_length"] == 16
        assert "output.weight" not in names  # tied to the embedding
    if arch == "gemma2":
        assert meta["gemma2.attn_logit_softcapping"] == pytest.approx(50.0)
        assert meta["gemma2.final_logit_softcapping"] == pytest.approx(30.0)
    if arch == "phi3":
        qkv = state["model.layers.0.self_attn.qkv_proj.weight"]
        assert list(tensors["blk.0.attn_qkv.weight"].shape) == [64, qkv.shape[0]]
    if arch == "qwen2":
        np.testing.assert_array_equal(tensors["blk.0.attn_q.bias"].data, state["model.layers.0.self_attn.q_proj.bias"])


def _byte_level_tokenizer(folder, regex, ignore_merges):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    ).save_pretrained(str(folder))


def _sentencepiece_tokenizer(folder, prepend: bool):
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    steps = [normalizers.Prepend("▁")] if prepend else []
    backend.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"] + bytes_)
    backend.train_from_iterator(CORPUS, trainer=trainer)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(str(folder))


def _write_tokenizer_only(folder):
    from lathe.llm.gguf.vocab import write_tokenizer

    class Writer:
        def __init__(self):
            self.values = {}

        def __getattr__(self, name):
            return lambda *args: self.values.__setitem__(name.removeprefix("add_"), args[0] if args else None)

    writer = Writer()
    facts = write_tokenizer(writer, str(folder), 700, None)
    return facts, writer.values


@pytest.mark.parametrize("ignore_merges,expected", [(True, "llama-bpe"), (False, "smaug-bpe")])
def test_llama3_pre_tokenizer_is_named_as_llama_cpp_names_it(tmp_path, ignore_merges, expected):
    _byte_level_tokenizer(tmp_path, LLAMA3_SPLIT, ignore_merges)
    facts, values = _write_tokenizer_only(tmp_path)
    assert facts["pre"] == expected and values["tokenizer_model"] == "gpt2"


def test_an_unknown_pre_tokenizer_is_one_clear_error(tmp_path):
    _byte_level_tokenizer(tmp_path, r"\p{L}+|\s+|.", False)
    with pytest.raises(UnsupportedModel, match="pre-tokenizer regex .* not one llama.cpp implements"):
        _write_tokenizer_only(tmp_path)


@pytest.mark.parametrize("prepend", [True, False])
def test_sentencepiece_style_tokenizer_as_llama_vocabulary(tmp_path, prepend):
    _sentencepiece_tokenizer(tmp_path, prepend)
    facts, values = _write_tokenizer_only(tmp_path)
    assert facts["model"] == "llama" and values["add_space_prefix"] is prepend
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    first = "".join(merges[0]) if isinstance(merges[0], list) else merges[0].replace(" ", "")
    last = "".join(merges[-1]) if isinstance(merges[-1], list) else merges[-1].replace(" ", "")
    scores, types = values["token_scores"], values["token_types"]
    assert scores[vocab[first]] > scores[vocab[last]]  # llama.cpp merges the higher score first = earlier merge
    assert types[vocab["<0x41>"]] == gguf.TokenType.BYTE and types[vocab["<unk>"]] == gguf.TokenType.CONTROL
    assert types[700 - 1] == gguf.TokenType.UNUSED and values["token_list"][699] == "[PAD699]"


def test_bad_types_and_missing_quantizer_are_clear_errors(tiny_model_dir, tmp_path, monkeypatch):
    assert parse_gguf_types("F16, q8_0") == ["f16", "q8_0"] and parse_gguf_types(None) == []
    with pytest.raises(ValueError, match="export_gguf: unknown GGUF type 'q3'"):
        parse_infer_config(
            {"model_name_or_path": tiny_model_dir, "export_dir": "x", "export_gguf": "q3"}, command="export"
        )
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ImportError, match="k-quants .* need llama.cpp's quantizer: pip install llama-cpp-python"):
        export(tiny_model_dir, tmp_path / "out", export_gguf=["q4_k_m"])
    assert not (tmp_path / "out").exists()  # said before any work
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModel, match="architecture GPT2LMHeadModel is not one lathe writes as GGUF"):
        write_gguf_files(str(gpt2), ["f16"])
    with pytest.raises(UnsupportedModel, match="architecture GPT2LMHeadModel"):  # before any work
        export(str(gpt2), tmp_path / "gpt2-out", export_gguf="f16")
    assert not (tmp_path / "gpt2-out").exists()


def test_embedded_chat_template_renders_as_lathes_template(tiny_model_dir, tmp_path):
    report = export(tiny_model_dir, tmp_path / "out", export_gguf="f16")
    _, meta = fields(report.gguf_files[0][0].path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    template = get_template("chatml")
    for system, turns in CONVERSATIONS:
        prompt, _ = template.render_oneturn(tokenizer, turns + [{"role": "assistant", "content": "x"}], system=system)
        messages = ([{"role": "system", "content": system}] if system else []) + turns
        rendered = tokenizer.apply_chat_template(
            messages, chat_template=meta["tokenizer.chat_template"], tokenize=False, add_generation_prompt=True
        )
        assert rendered == prompt


CONVERSATIONS = [
    ("", [{"role": "user", "content": "Hi"}]),
    ("Be brief.", [{"role": "user", "content": "What is 2+2?"}]),
    (
        "You are {{careful}}.",
        [
            {"role": "user", "content": "one\n"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three {{ .Content }}"},
        ],
    ),
]


@pytest.mark.parametrize("name", ["chatml", "llama3", "mistral", "gemma", "qwen", "phi", "llama2"])
@pytest.mark.parametrize("adds_bos", [True, False])
def test_modelfile_template_renders_what_lathes_template_renders(tiny_model_dir, name, adds_bos):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    template = get_template(name)
    go = go_template(template, tokenizer, adds_bos)
    for system, turns in CONVERSATIONS:
        prompt, response = template.render_oneturn(
            tokenizer, turns + [{"role": "assistant", "content": "ok"}], system=system
        )
        if adds_bos and template.prefix and prompt.startswith(tokenizer.bos_token):
            prompt = prompt[len(tokenizer.bos_token) :]  # llama.cpp adds it as a token
        system = system or template.default_system
        messages = ([{"role": "system", "content": system}] if system else []) + turns
        assert render_go(go, messages) == prompt
        assert render_go(go, messages + [{"role": "assistant", "content": "ok"}]) == prompt + response


def test_modelfile_content(tiny_model_dir, tmp_path):
    report = export(tiny_model_dir, tmp_path / "out", export_gguf="q8_0", template="qwen")
    ((_, path),) = report.gguf_files
    text = open(path).read()
    lines = text.splitlines()
    assert lines[0] == "FROM ./out-q8_0.gguf" and lines[1].startswith('TEMPLATE """{{ range .Messages }}')
    assert 'PARAMETER stop "<|im_end|>"' in lines
    assert text.endswith('SYSTEM """You are Qwen, created by Alibaba Cloud. You are a helpful assistant."""\n')


def test_llama_cpp_loads_the_file_and_agrees_with_transformers(tiny_model_dir, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (bench/gguf_llamacpp.py)")
    report = export(tiny_model_dir, tmp_path / "out", export_gguf=["f16", "q4_k_m"])
    (f16, _), (q4, _) = report.gguf_files
    assert fields(q4.path)[1]["general.file_type"] == 15  # made by llama.cpp's quantizer through the binding
    model = llama_cpp.Llama(f16.path, logits_all=True, verbose=False, n_ctx=128)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    for text in ["Hello world", "user: 1 + 2 = 3?\n\n  <|im_start|>"]:
        assert model.tokenize(text.encode(), add_bos=False, special=True) == tokenizer(text)["input_ids"]
    ids = tokenizer("user assistant 1 2 3")["input_ids"]
    model.eval(ids)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))(torch.tensor([ids])).logits[0]
    np.testing.assert_allclose(np.asarray(model.scores[: len(ids)]), hf.detach().numpy(), atol=2e-2)


@pytest.mark.slow  # a `lathe export` subprocess (~1 min on 2 busy cores)
def test_webui_export_tab_offers_and_writes_gguf(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from webui_fixtures import make_root

    from lathe.llm.webui.server import create_app

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    client = TestClient(create_app(make_root(tmp_path / "root", tiny_model_dir)), base_url="http://localhost")
    assert client.get("/api/strings").json()["gguf_types"][:3] == ["f16", "bf16", "q8_0"]
    form = {
        "model_name_or_path": "models/tiny",
        "template": "chatml",
        "finetuning_type": "full",
        "export_dir": "exports/model1",
        "export_gguf": "f16,q8_0",
    }
    reply = client.post("/api/export", json=form).json()
    assert reply["code"] == 0, reply
    assert {"model1-f16.gguf", "model1-q8_0.gguf", "Modelfile", "Modelfile.q8_0"} <= set(reply["files"])
    assert "ollama create model1-f16 -f " in reply["output"]


def test_llama3_rope_scaling_is_written_as_rope_freqs(tiny_model_dir, tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    folder = _tiny(transformers.LlamaConfig, tmp_path / "llama31", tiny_model_dir, rope_parameters=rope)
    (written,) = write_gguf_files(str(folder), ["f32"])
    reader, meta = fields(written.path)
    factors = next(t for t in reader.tensors if t.name == "rope_freqs.weight").data
    # transformers' llama3 scaling divides each inverse frequency by the factor llama.cpp multiplies wavelengths by
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.AutoConfig.from_pretrained(str(folder))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    plain = 1.0 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    np.testing.assert_allclose(factors, (plain / scaled).numpy(), rtol=1e-5)
    assert factors[0] == 1.0 and factors[-1] == 8.0 and meta["llama.rope.freq_base"] == 500000.0


@pytest.mark.slow
def test_a_lora_run_of_lathe_train_exports_to_gguf(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the tokenization cache
    run_dir = trained_lora_adapter(tiny_model_dir, tmp_path)
    report = export(
        tiny_model_dir, tmp_path / "out", finetuning_type="lora", adapter_name_or_path=run_dir, export_gguf="f32"
    )
    merged, base = hf_state(tmp_path / "out"), hf_state(tiny_model_dir)
    tensors = {t.name: t for t in gguf.GGUFReader(report.gguf_files[0][0].path).tensors}
    for layer in range(3):  # the merged (trained) weights are what the GGUF holds, q permuted for llama.cpp
        q = merged[f"model.layers.{layer}.self_attn.q_proj.weight"]
        np.testing.assert_array_equal(tensors[f"blk.{layer}.attn_q.weight"].data, permute_rotary(q, 4))
        v = merged[f"model.layers.{layer}.self_attn.v_proj.weight"]
        np.testing.assert_array_equal(tensors[f"blk.{layer}.attn_v.weight"].data, v)
    assert (
        np.abs(merged["model.layers.0.self_attn.v_proj.weight"] - base["model.layers.0.self_attn.v_proj.weight"]).max()
        > 1e-4
    )
