"""`lathe api` against hostile request bodies: deeply nested JSON, JSON nested inside tool-call strings,
lone surrogates, and random bodies (hypothesis). Every answer is a 200 or a 4xx with OpenAI's error body,
never a 500. The server runs the tiny model on a free local port with the default body limits."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lathe.llm.inference.api import create_app  # noqa: E402
from lathe.llm.inference.config import parse_infer_config  # noqa: E402
from lathe.llm.inference.engine import ChatEngine  # noqa: E402
from lathe.llm.inference.requests import Limits  # noqa: E402
from tests.llm.test_api import Server  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    config = parse_infer_config(
        {"model_name_or_path": tiny_model_dir, "template": "qwen", "max_new_tokens": 4, "do_sample": False},
        command="api",
    )
    server = Server(create_app(ChatEngine.from_config(config, max_batch=8), "tiny", limits=Limits(max_tokens=6)))
    yield server
    server.stop()


def post(server, path: str, body: bytes) -> tuple[int, str, bytes]:
    request = urllib.request.Request(
        server.url + path, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("content-type", ""), error.read()


def assert_openai_answer(status: int, content_type: str, payload: bytes) -> None:
    """A completion (JSON, or a server-sent-event stream that ends in [DONE] without an error event), or a
    4xx whose body is OpenAI's error object."""
    if status == 200 and content_type.startswith("text/event-stream"):
        events = [line[len("data: ") :] for line in payload.decode().split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and not any('"error"' in event for event in events[:-1]), events
        return
    reply = json.loads(payload)
    if status == 200:
        assert reply["choices"], reply
        return
    assert 400 <= status < 500, (status, reply)
    assert set(reply) == {"error"} and set(reply["error"]) == {"message", "type", "param", "code"}, reply
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"], reply
    assert reply["error"]["type"] == "invalid_request_error" or status in (401, 404, 405, 413), reply


def test_fifty_thousand_nested_lists_are_a_400_not_a_recursion_error(server):
    body = b"[" * 50_000 + b"]" * 50_000  # 100 KB, under the 1 MB body limit
    status, _, payload = post(server, "/v1/chat/completions", body)
    assert status == 400
    assert json.loads(payload)["error"] == {
        "message": "The request body nests JSON 50000 levels deep; at most 64 are allowed.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    nested = (
        b'{"messages": [{"role": "user", "content": "hi"}], "model": '
        + b'{"a": ' * 30_000
        + b"1"
        + b"}" * 30_000
        + b"}"
    )
    status, _, payload = post(server, "/v1/completions", nested)
    assert status == 400 and "nests JSON 30001 levels deep" in json.loads(payload)["error"]["message"]


def test_brackets_inside_strings_do_not_count_as_nesting(server):
    from lathe.llm.inference.requests import json_depth

    body = {"model": "tiny", "messages": [{"role": "user", "content": "[" * 100 + '{\\"' * 20}], "max_tokens": 2}
    assert json_depth(json.dumps(body).encode()) == 3
    status, content_type, payload = post(server, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200, payload


def test_deep_json_inside_tool_call_arguments_is_a_400(server):
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 20_000 + "]" * 20_000}}]
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "content": "1"},
        ]
    }
    status, _, payload = post(server, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400
    error = json.loads(payload)["error"]
    assert error["param"] == "messages[1].tool_calls" and "more than 64 levels deep" in error["message"]


def test_a_lone_surrogate_is_a_400(server):
    body = b'{"messages": [{"role": "user", "content": "a \\ud800 b"}]}'
    status, _, payload = post(server, "/v1/chat/completions", body)
    assert status == 400 and "lone surrogate" in json.loads(payload)["error"]["message"]


def test_a_temperature_too_small_to_divide_by_samples_greedily(server):
    # Found by the random bodies below: logits / 1e-310 overflow, and sampling failed with a 500.
    texts = []
    for temperature in (1e-310, 0):
        body = {"messages": [{"role": "user", "content": "two plus two"}], "temperature": temperature, "max_tokens": 4}
        status, _, payload = post(server, "/v1/chat/completions", json.dumps(body).encode())
        assert status == 200, payload
        texts.append(json.loads(payload)["choices"][0]["message"]["content"])
    assert texts[0] == texts[1]


# ---- random bodies ---------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)
TEXT = st.text(min_size=1, max_size=24)
CONTENT = (
    TEXT
    | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": TEXT | JSON}), max_size=3)
    | JSON
)
ARGUMENTS = st.sampled_from(['{"a": 1}', "[]", "not json", "5", "{}", '"s"', "[[[[1]]]]"]) | JSON
TOOL_CALL = (
    st.fixed_dictionaries(
        {
            "id": TEXT,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": TEXT | JSON, "arguments": ARGUMENTS}),
        }
    )
    | JSON
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "bot"]) | JSON, "content": CONTENT},
    optional={"tool_calls": st.lists(TOOL_CALL, max_size=2) | JSON},
)
CONVERSATION = st.lists(TEXT, min_size=1, max_size=5).map(
    lambda texts: [
        {"role": "user" if index % 2 == 0 else "assistant", "content": text}
        for index, text in enumerate(texts[: len(texts) // 2 * 2 + 1])
    ]
)
TOOL_TURNS = st.tuples(TEXT, st.lists(TOOL_CALL, min_size=1, max_size=2), TEXT).map(
    lambda parts: [
        {"role": "user", "content": parts[0]},
        {"role": "assistant", "content": None, "tool_calls": parts[1]},
        {"role": "tool", "content": parts[2]},
    ]
)
PARAMETERS = st.just({"type": "object", "properties": {"a": {"type": "integer", "description": "a number"}}}) | JSON
TOOL = (
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": TEXT, "parameters": PARAMETERS}, optional={"description": TEXT | JSON}
            ),
        }
    )
    | JSON
)
COMMON = {  # valid values; `bodies` then breaks one field now and then
    "model": st.just("tiny"),
    "max_tokens": st.integers(1, 6),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "n": st.integers(1, 3),
    "stream": st.booleans(),
    "stop": TEXT | st.lists(TEXT, min_size=1, max_size=4),
    "seed": st.integers(0, 2**32),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
}


@st.composite
def bodies(draw, required: dict, optional: dict):
    body = draw(st.fixed_dictionaries(required, optional=optional))
    if draw(st.booleans()):
        body[draw(st.sampled_from(sorted({*required, *optional, "stream_options", "logprobs", "user"})))] = draw(JSON)
    return body


CHAT = bodies(
    {"messages": CONVERSATION | TOOL_TURNS | st.lists(MESSAGE, max_size=4)},
    {**COMMON, "tools": st.lists(TOOL, min_size=1, max_size=2)},
)
COMPLETION = bodies({"prompt": TEXT | st.lists(TEXT, max_size=2)}, COMMON)


@FUZZ
@given(body=CHAT | JSON)
def test_random_chat_bodies_get_a_completion_or_an_openai_error(server, body):
    assert_openai_answer(*post(server, "/v1/chat/completions", json.dumps(body).encode()))


@settings(FUZZ, max_examples=30)
@given(body=COMPLETION | JSON)
def test_random_completion_bodies_get_a_completion_or_an_openai_error(server, body):
    assert_openai_answer(*post(server, "/v1/completions", json.dumps(body).encode()))


@settings(FUZZ, max_examples=30)
@given(raw=st.binary(max_size=64) | JSON.map(lambda value: json.dumps(value).encode()[:-1]))
def test_bodies_that_are_not_json_get_an_openai_error(server, raw):
    assert_openai_answer(*post(server, "/v1/chat/completions", raw))
