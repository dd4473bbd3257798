"""`lathe api` through the official openai client: responses, streaming, errors, auth, and many
concurrent clients, against a server on a free local port serving the tiny model."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from lathe.llm.inference.api import create_app  # noqa: E402
from lathe.llm.inference.config import parse_infer_config  # noqa: E402
from lathe.llm.inference.engine import ChatEngine  # noqa: E402
from lathe.llm.inference.requests import Limits  # noqa: E402

KEY = "test-key-123"
HELLO = [{"role": "user", "content": "What is two plus two?"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    config = parse_infer_config(
        {"model_name_or_path": tiny_model_dir, "template": "chatml", "max_new_tokens": 12, "do_sample": False},
        command="api",
    )
    return ChatEngine.from_config(config, max_batch=8)


@pytest.fixture(scope="module")
def server(engine):
    server = Server(create_app(engine, "tiny", api_key=KEY, limits=Limits(max_tokens=16, max_body_bytes=20_000)))
    yield server
    server.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def raw(server, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        server.url + path,
        data=body,
        headers={"Authorization": f"Bearer {KEY}", **(headers or {})},
        method="POST" if body is not None else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def alone(engine, messages, **overrides):
    """What the engine generates for one request on its own (greedy)."""
    params = engine.default_params(**overrides)
    prompt = engine.chat_prompt(messages)
    return engine.generator.generate(
        [__import__("lathe.llm.inference.generation", fromlist=["Sequence"]).Sequence(prompt, params)]
    )[0]


def test_models_and_health(client, server):
    assert [model.id for model in client.models.list().data] == ["tiny"]
    assert raw(server, "/health")[0] == 200


def test_chat_completion_matches_the_engine_and_counts_tokens(client, engine):
    response = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=10, temperature=0)
    reference = alone(engine, HELLO, max_new_tokens=10, do_sample=False)
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == reference.text
    assert choice.finish_reason == reference.finish_reason in ("stop", "length")
    assert response.id.startswith("chatcmpl-") and response.model == "tiny" and response.created > 0
    assert response.usage.prompt_tokens == len(engine.chat_prompt(HELLO))
    assert response.usage.completion_tokens == reference.completion_tokens
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_streaming_sends_role_deltas_finish_usage_and_done(client, engine):
    stream = client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    reference = alone(engine, HELLO, max_new_tokens=10, do_sample=False)
    assert text == reference.text and finals == [reference.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == reference.completion_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_max_tokens_gives_finish_reason_length(client):
    response = client.chat.completions.create(model="tiny", messages=HELLO, max_completion_tokens=1, temperature=0)
    assert response.usage.completion_tokens == 1
    assert response.choices[0].finish_reason in ("length", "stop")


def test_seed_n_and_sampling(client):
    first = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, temperature=1.5, seed=11, n=3)
    again = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, temperature=1.5, seed=11, n=3)
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len({c.message.content for c in first.choices}) > 1  # each choice has its own random stream


def test_completions_route(client, engine):
    response = client.completions.create(model="tiny", prompt="The quick brown", max_tokens=5, temperature=0)
    assert response.object == "text_completion" and response.choices[0].finish_reason in ("stop", "length")
    assert response.usage.prompt_tokens == len(engine.text_prompt("The quick brown"))
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="tiny", prompt="The quick brown", max_tokens=5, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == response.choices[0].text


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages[0].role"),
        ({"messages": HELLO, "temperature": "hot"}, "temperature"),
        ({"messages": HELLO, "temperature": 3}, "temperature"),
        ({"messages": HELLO, "max_tokens": 17}, "max_tokens"),
        ({"messages": HELLO, "max_tokens": True}, "max_tokens"),
        ({"messages": HELLO, "n": 0}, "n"),
        ({"messages": HELLO, "stop": [1, 2]}, "stop"),
        ({"messages": [{"role": "user", "content": "word " * 400}]}, "messages"),
    ],
)
def test_bad_requests_get_openai_errors(server, body, param):
    status, reply = raw(
        server,
        "/v1/chat/completions",
        json.dumps({"model": "tiny", **body}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 400, reply
    assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["param"] == param
    assert reply["error"]["message"]


def test_malformed_and_oversized_bodies(server):
    status, reply = raw(server, "/v1/chat/completions", b"{not json", {"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in reply["error"]["message"]
    status, reply = raw(server, "/v1/chat/completions", b"[1, 2]", {"Content-Type": "application/json"})
    assert status == 400 and "JSON object" in reply["error"]["message"]
    status, reply = raw(server, "/v1/chat/completions", json.dumps({"messages": HELLO, "pad": "x" * 30_000}).encode())
    assert status == 413 and reply["error"]["code"] == "request_too_large"
    status, reply = raw(server, "/v1/nothing-here")
    assert status == 404 and "error" in reply


def test_the_openai_client_raises_on_errors(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=100)
    assert "above this server's limit" in str(raised.value)


def test_api_key_is_required_on_every_route(server):
    for path in ("/v1/models", "/health"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            request = urllib.request.Request(server.url + path, headers=headers)
            with pytest.raises(urllib.error.HTTPError) as raised:
                urllib.request.urlopen(request, timeout=30)
            assert raised.value.code == 401
            assert json.loads(raised.value.read())["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_fifty_concurrent_clients_get_what_each_would_get_alone(client, engine, server):
    questions = [[{"role": "user", "content": f"What is {a} plus {b}?"}] for a in range(10) for b in range(5)]

    def ask(messages):
        return (
            client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
            .choices[0]
            .message.content
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(ask, questions))
    for messages, answer in zip(questions[::7], answers[::7]):
        assert answer == alone(engine, messages, max_new_tokens=6, do_sample=False).text
    assert raw(server, "/health")[0] == 200  # still up


@pytest.mark.slow
def test_lathe_api_command_line_serves_with_a_key(tiny_model_dir, tmp_path, write_yaml):
    import os
    import subprocess
    import sys

    config = write_yaml(
        tmp_path / "serve.yaml",
        {"model_name_or_path": tiny_model_dir, "template": "chatml", "max_new_tokens": 4, "do_sample": False},
    )
    port = free_port()
    env = dict(os.environ, LATHE_API_KEY="from-env")
    process = subprocess.Popen(
        [sys.executable, "-m", "lathe", "api", config, "--port", str(port), "--max_tokens", "8"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="from-env", max_retries=0, timeout=30)
        deadline = time.time() + 120
        while True:
            assert process.poll() is None, process.stdout.read()[-2000:]
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert time.time() < deadline, "lathe api did not start"
                time.sleep(0.3)
        assert [m.id for m in models.data] == [os.path.basename(tiny_model_dir)]
        with pytest.raises(openai.BadRequestError, match="limit of 8"):
            client.chat.completions.create(model="x", messages=HELLO, max_tokens=9)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="nope", max_retries=0).models.list()
        reply = client.chat.completions.create(model="x", messages=HELLO, max_tokens=4)
    finally:
        process.terminate()
        process.wait(timeout=30)
    # One access line per request (unless --quiet): method, path, status, seconds, tokens when generated.
    lines = [line for line in process.stdout.read().splitlines() if line.startswith("lathe api: ") and " s" in line]
    assert [line.split(" s")[0].rsplit(" ", 1)[0] for line in lines[-4:]] == [
        "lathe api: GET /v1/models 200",
        "lathe api: POST /v1/chat/completions 400",
        "lathe api: GET /v1/models 401",
        "lathe api: POST /v1/chat/completions 200",
    ]
    usage = reply.usage
    assert lines[-1].endswith(f" s {usage.prompt_tokens}+{usage.completion_tokens} tokens")


def test_a_reply_in_the_tool_call_format_comes_back_as_tool_calls(client, engine, monkeypatch):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    real = engine.generator.generate

    def answers_with_a_call(sequences):
        for sequence in sequences:  # what a model trained on the template's tool format writes
            sequence.text, sequence.finish_reason, sequence.completion_tokens = (
                'Action: get_weather\nAction Input: {"city": "Paris"}',
                "stop",
                12,
            )
        return sequences

    monkeypatch.setattr(engine.generator, "generate", answers_with_a_call)
    monkeypatch.setattr(engine, "context_length", 1024)  # the tool description is longer than the tiny model's 256
    try:
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        response = client.chat.completions.create(model="tiny", messages=messages, tools=tools)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        # the result goes back as a tool message, rendered through the template's observation slot
        followup = messages + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
        ]
        assert (
            client.chat.completions.create(model="tiny", messages=followup, tools=tools).choices[0].finish_reason
            == "tool_calls"
        )
        plain = client.chat.completions.create(model="tiny", messages=messages)  # no tools offered: plain text
        assert plain.choices[0].message.content.startswith("Action: get_weather")
        with pytest.raises(openai.BadRequestError, match="stream"):
            client.chat.completions.create(model="tiny", messages=messages, tools=tools, stream=True)
    finally:
        monkeypatch.setattr(engine.generator, "generate", real)
        monkeypatch.undo()
