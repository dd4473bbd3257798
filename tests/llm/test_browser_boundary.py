"""A hostile web page against `lathe webui` and `lathe api` on 127.0.0.1: a real server, a real HTTP client
(http.client) sending the headers a browser would send for a cross-site form post or after DNS rebinding.
Every such request is a 403 with a JSON body naming the header; the page's own requests, and clients that
are not browsers (the OpenAI client), still work."""

from __future__ import annotations

import http.client
import json
import os

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from lathe.llm.inference.browser import Boundary  # noqa: E402
from tests.llm.test_api import Server  # noqa: E402
from tests.llm.webui_fixtures import make_root, train_form  # noqa: E402


def send(server, method: str, path: str, body: bytes = b"", **headers) -> tuple[int, dict | str]:
    """One request with exactly these headers (http.client sends Host unless we give one)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    names = {name.lower().replace("_", "-"): value for name, value in headers.items()}
    connection.putrequest(method, path, skip_host="host" in names, skip_accept_encoding=True)
    for name, value in names.items():
        connection.putheader(name, value)
    if method == "POST":
        connection.putheader("content-length", str(len(body)))
    connection.endheaders(body if method == "POST" else None)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    try:
        return response.status, json.loads(payload)
    except json.JSONDecodeError:
        return response.status, payload.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def webui(tmp_path_factory, tiny_model_dir):
    from lathe.llm.webui.server import create_app

    root = make_root(tmp_path_factory.mktemp("root"), tiny_model_dir)
    app = create_app(root, boundary=Boundary("127.0.0.1", ["lathe.example"]))
    server = Server(app)
    server.root, server.app = root, app
    yield server
    for run in app.state.jobs.running():
        app.state.jobs.stop(run)
        app.state.jobs.wait(run, 60)
    server.stop()


START = json.dumps(train_form("saves/evil")).encode()


@pytest.mark.parametrize(
    "headers, named",
    [
        ({"content_type": "text/plain", "origin": "http://evil.example"}, "Origin"),
        ({"content_type": "application/x-www-form-urlencoded", "origin": "http://evil.example"}, "Origin"),
        ({"content_type": "application/json", "origin": "null"}, "Origin"),
        ({"content_type": "text/plain", "referer": "http://evil.example/page.html"}, "Referer"),
        ({"content_type": "text/plain", "origin": "http://127.0.0.1:1"}, "Origin"),  # another port: another origin
        ({"content_type": "application/json", "host": "evil.example"}, "Host"),  # DNS rebinding
    ],
)
def test_a_cross_site_post_starts_nothing(webui, headers, named):
    status, body = send(webui, "POST", "/api/start", START, **headers)
    assert status == 403, body
    assert set(body) == {"error"} and f"the {named} header" in body["error"], body
    assert not webui.app.state.jobs.running()
    assert not os.path.exists(os.path.join(webui.root, "saves", "evil"))
    assert not os.path.exists(os.path.join(webui.root, "configs"))


@pytest.mark.parametrize("path", ["/", "/api/runs", "/api/models", "/api/download?path=data/add.json"])
def test_a_rebound_name_reads_nothing(webui, path):
    status, body = send(webui, "GET", path, host=f"evil.example:{webui.port}")
    assert status == 403 and "the Host header 'evil.example:" in body["error"], body
    assert send(webui, "GET", path, host=f"localhost:{webui.port}")[0] == 200
    assert send(webui, "GET", path, host=f"lathe.example:{webui.port}")[0] == 200  # --allowed_host
    assert send(webui, "GET", path, host=f"[::1]:{webui.port}")[0] == 200
    assert send(webui, "GET", path)[0] == 200  # http.client sends Host: 127.0.0.1:PORT


def test_the_pages_own_requests_pass(webui):
    own = f"http://127.0.0.1:{webui.port}"
    status, body = send(webui, "POST", "/api/config", START, content_type="application/json", origin=own)
    assert status == 200 and "output_dir:" in body["yaml"], body
    status, body = send(webui, "POST", "/api/config", START, content_type="application/json", referer=own + "/")
    assert status == 200, body
    status, body = send(webui, "POST", "/api/config", START, content_type="application/json")  # curl: no Origin
    assert status == 200, body
    status, body = send(webui, "POST", "/api/upload?name=x.json", b"[]", origin="http://evil.example")
    assert status == 403 and not os.path.exists(os.path.join(webui.root, "data", "x.json"))


def test_the_key_is_still_required(tmp_path, tiny_model_dir):
    from lathe.llm.webui.server import create_app

    server = Server(create_app(make_root(tmp_path, tiny_model_dir), api_key="k3y"))
    try:
        own = f"http://127.0.0.1:{server.port}"
        assert send(server, "POST", "/api/config", START, origin=own)[0] == 401
        assert send(server, "POST", "/api/config", START, origin=own, authorization="Bearer k3y")[0] == 200
        status, body = send(
            server, "POST", "/api/config", START, origin="http://evil.example", authorization="Bearer k3y"
        )
        assert status == 403 and "Origin" in body["error"]
    finally:
        server.stop()


def test_the_boundary_rules():
    local = Boundary("127.0.0.1")
    assert local.host_allowed("localhost:7860") and local.host_allowed("127.0.0.2") and local.host_allowed("[::1]:80")
    assert not local.host_allowed("192.168.1.5:7860")  # bound to loopback: not reached by that name
    assert not local.host_allowed(None) and not local.host_allowed("localhost.evil.example")
    everywhere = Boundary("0.0.0.0", ["box.lan"])
    assert everywhere.host_allowed("192.168.1.5:7860") and everywhere.host_allowed("box.lan")
    assert not everywhere.host_allowed("evil.example")  # an IP cannot be rebound; a name can
    assert Boundary("127.0.0.1", ["*"]).host_allowed("anything.example")
    headers = {"host": "localhost:7860", "origin": "http://localhost:7860"}
    assert local.refusal("POST", headers) is None
    assert local.refusal("GET", {"host": "localhost", "origin": "http://evil.example"}) is None  # reads: Host only
    assert "Origin" in local.refusal("DELETE", {"host": "localhost", "origin": "https://localhost.evil.example"})


@pytest.fixture(scope="module")
def api(tiny_model_dir):
    from lathe.llm.inference.api import create_app
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.engine import ChatEngine
    from lathe.llm.inference.requests import Limits

    config = parse_infer_config(
        {"model_name_or_path": tiny_model_dir, "template": "chatml", "max_new_tokens": 3, "do_sample": False},
        command="api",
    )
    server = Server(create_app(ChatEngine.from_config(config, max_batch=4), "tiny", limits=Limits(max_tokens=3)))
    yield server
    server.stop()


def test_the_api_refuses_cross_site_posts_and_rebound_names(api):
    chat = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()
    status, body = send(
        api, "POST", "/v1/chat/completions", chat, content_type="text/plain", origin="http://evil.example"
    )
    assert status == 403 and body["error"]["code"] == "forbidden" and "the Origin header" in body["error"]["message"]
    status, body = send(api, "GET", "/v1/models", host="evil.example")
    assert status == 403 and "the Host header 'evil.example'" in body["error"]["message"]
    own = f"http://127.0.0.1:{api.port}"
    assert send(api, "POST", "/v1/chat/completions", chat, content_type="application/json", origin=own)[0] == 200


def test_the_openai_client_still_works(api):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=api.url + "/v1", api_key="none", max_retries=0, timeout=60)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens <= 3
