"""The decode loop behind chat and api: OpenAI's penalty semantics, sampling filters, stop strings and
streaming that never shows a stop string or half a character, batches equal to requests alone, and
`lathe chat` driven through a scripted session."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from lathe.llm.inference.chat import chat_loop  # noqa: E402
from lathe.llm.inference.config import parse_infer_config  # noqa: E402
from lathe.llm.inference.engine import ChatEngine, InvalidRequest, to_template_messages  # noqa: E402
from lathe.llm.inference.generation import BatchGenerator, SamplingParams, Sequence, _stop_prefix_start  # noqa: E402


class CharTokenizer:
    """One token per character of 'abcdef', plus a multi-byte 'é' split over two tokens (ids 6, 7)."""

    pad_token_id = 8

    def decode(self, ids, skip_special_tokens=True):
        data = b"".join(b"abcdef"[i : i + 1] if i < 6 else "é".encode()[i - 6 : i - 5] for i in ids)
        return data.decode("utf-8", errors="replace")


def choose(logits, generated=(), **params):
    generator = BatchGenerator(None, CharTokenizer(), stop_token_ids=[9])
    seq = Sequence([0], SamplingParams(**params), generated=list(generated))
    return generator._choose(torch.tensor(logits, dtype=torch.float32), seq, torch.Generator().manual_seed(0))


def test_presence_and_frequency_penalties_have_openais_meaning():
    # token 0 leads by 1.0; it was generated twice: presence 0.6 alone is not enough, frequency 0.3 x 2 adds 0.6
    logits = [3.0, 2.0, 0.0]
    assert choose(logits, generated=[0, 0], do_sample=False, presence_penalty=0.6) == 0
    assert choose(logits, generated=[0, 0], do_sample=False, presence_penalty=0.6, frequency_penalty=0.3) == 1
    assert choose(logits, generated=[], do_sample=False, presence_penalty=2.0) == 0  # only generated tokens count
    assert choose(logits, generated=[0], do_sample=False, presence_penalty=-1.0) == 0


def test_repetition_penalty_top_k_and_top_p():
    assert choose([2.0, 1.9, 0.0], generated=[0], do_sample=False, repetition_penalty=1.2) == 1  # 2.0/1.2 < 1.9
    for seed in range(20):
        params = dict(do_sample=True, temperature=1.0, seed=seed)
        assert choose([5.0, 4.9, 4.8, -9.0], top_k=2, **params) in (0, 1)
        assert choose([5.0, 0.0, 0.0, 0.0], top_p=0.5, **params) == 0  # the top token alone holds >= 0.5


def test_stop_strings_are_cut_and_never_streamed():
    generator = BatchGenerator(None, CharTokenizer(), stop_token_ids=[9])
    pieces = []
    seq = Sequence([0], SamplingParams(max_new_tokens=10, stop=["cd"]), on_text=pieces.append)
    for token in (0, 1, 2, 3, 4):  # a b c d e
        if not seq.done:
            generator._append(seq, token)
    assert seq.text == "ab" and seq.finish_reason == "stop" and "".join(pieces) == "ab"
    assert seq.completion_tokens == 4
    assert _stop_prefix_start("xxab", ["abc", "b"], 0) == 2  # the longest possible start of a stop is held


def test_a_character_split_over_tokens_streams_whole():
    generator = BatchGenerator(None, CharTokenizer(), stop_token_ids=[9])
    pieces = []
    seq = Sequence([0], SamplingParams(max_new_tokens=10), on_text=pieces.append)
    for token in (0, 6, 7, 9):  # a, first byte of é, second byte, stop
        generator._append(seq, token)
    assert pieces == ["a", "é"] and seq.text == "aé" and seq.finish_reason == "stop" and seq.completion_tokens == 4


def test_message_checks():
    turns, system = to_template_messages(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "yo"},
            {"role": "tool", "content": "42"},
        ]
    )
    assert system == "S" and [t["role"] for t in turns] == ["user", "assistant", "observation"]
    for messages, field in (
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "messages[1]"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "messages"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content"),
    ):
        with pytest.raises(InvalidRequest) as raised:
            to_template_messages(messages)
        assert raised.value.param == field


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    config = parse_infer_config(
        {"model_name_or_path": tiny_model_dir, "template": "chatml", "max_new_tokens": 8, "do_sample": False},
        command="chat",
    )
    return ChatEngine.from_config(config, max_batch=4)


def test_a_batch_of_different_prompts_equals_each_alone(engine):
    prompts = [
        engine.chat_prompt([{"role": "user", "content": text}])
        for text in ("hi", "What is two plus two?", "Reverse abc")
    ]
    params = dict(max_new_tokens=8, do_sample=False)
    together = engine.generator.generate([Sequence(p, SamplingParams(**params)) for p in prompts])
    for prompt, sequence in zip(prompts, together):
        alone = engine.generator.generate([Sequence(prompt, SamplingParams(**params))])[0]
        assert sequence.generated == alone.generated and sequence.text == alone.text


def test_scripted_chat_session_keeps_history_and_clears_it(engine):
    lines = iter(["What is two plus two?", "And three?", "clear", "hi", "exit"])
    out, prompts = [], []
    real = engine.chat_inputs
    engine.chat_inputs = lambda messages, tools=None, read_media=None: (
        prompts.append(list(messages)) or real(messages, tools, read_media)
    )
    try:
        assert chat_loop(engine, read=lambda _prompt: next(lines), write=out.append) == 0
    finally:
        engine.chat_inputs = real
    assert [len(p) for p in prompts] == [1, 3, 1]  # the second question carries the first exchange
    assert prompts[1][1]["role"] == "assistant"
    assert "The conversation is cleared." in "".join(out) and "".join(out).count("Assistant: ") == 3


@pytest.mark.slow
def test_lathe_chat_command_line(tiny_model_dir, tmp_path, write_yaml):
    config = write_yaml(
        tmp_path / "chat.yaml",
        {"model_name_or_path": tiny_model_dir, "template": "chatml", "max_new_tokens": 4, "do_sample": False},
    )
    result = subprocess.run(
        [sys.executable, "-m", "lathe", "chat", config, "temperature=0.5"],
        input="hello\nclear\nexit\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Assistant: " in result.stdout and "The conversation is cleared." in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "lathe", "chat", config, "learning_rate=1"],
        input="",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "training key" in bad.stderr
