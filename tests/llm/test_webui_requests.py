"""Hostile request bodies and sessions against `lathe webui`: deep nesting, non-JSON, wrong types, unknown
routes and parameters are 4xx JSON errors (never a 500 or plain text); remote code needs its confirmation in
the Chat tab too; a second writer into an output_dir (from the page or the command line) is refused in one
line, a stale lock (its process gone) is replaced."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from lathe.llm.workflows.lock import LOCK_NAME, OutputDirBusy, OutputDirLock, busy_message
from tests.llm.webui_fixtures import make_root, train_form


@pytest.fixture
def root(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return make_root(tmp_path / "root", tiny_model_dir)


@pytest.fixture
def client(root):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lathe.llm.webui.server import create_app

    return TestClient(create_app(root), base_url="http://localhost")


BAD = [
    ("POST", "/api/config", b"[" * 50_000 + b"]" * 50_000, "nests JSON 50000 levels deep"),
    ("POST", "/api/config", b'{"values": ' * 40 + b"1" + b"}" * 40, "at most 32"),
    ("POST", "/api/config", b"not json", "expected a JSON body"),
    ("POST", "/api/config", b"\xff\xfe", "expected a JSON body"),
    ("POST", "/api/config", b"[1, 2]", "expected a JSON object"),
    ("POST", "/api/config", json.dumps({"method": [1], "values": {}}).encode(), "wrong type"),
    ("POST", "/api/config", json.dumps({"values": [1]}).encode(), "'values' object"),
    ("POST", "/api/config", json.dumps({**train_form(), "extra": ["a"]}).encode(), "all keys"),
    ("POST", "/api/config", json.dumps(train_form(output_dir={"a": 1})).encode(), "output_dir"),
    ("POST", "/api/stop", json.dumps({"run": {"a": 1}}).encode(), "run"),
    ("POST", "/api/chat", json.dumps({"messages": "hi"}).encode(), "load a model first"),
    ("POST", "/api/chat/load", json.dumps({"model_name_or_path": ["x"]}).encode(), "model_name_or_path"),
    ("GET", "/api/nothing", b"", "Not Found"),
    ("GET", "/api/run", b"", "run"),  # a missing query parameter
    ("PUT", "/api/config", b"{}", "Method Not Allowed"),
]


@pytest.mark.parametrize("method, path, body, expected", BAD)
def test_malformed_requests_are_4xx_json(client, method, path, body, expected):
    reply = client.request(method, path, content=body, headers={"Content-Type": "application/json"})
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text)
    assert reply.headers["content-type"].startswith("application/json"), reply.text
    assert set(reply.json()) == {"error"} and expected in reply.json()["error"], reply.json()


def test_remote_code_needs_confirmation_in_the_chat_tab(client):
    reply = client.post("/api/chat/load", json={"model_name_or_path": "models/tiny", "trust_remote_code": True})
    assert reply.status_code == 400 and "confirm" in reply.json()["error"], reply.text
    confirmed = {"model_name_or_path": "models/tiny", "template": "chatml", "trust_remote_code": True}
    reply = client.post("/api/chat/load", json={**confirmed, "confirm_remote_code": True})
    assert reply.status_code == 200 and reply.json()["loaded"]["trust_remote_code"] is True, reply.text
    hello = [{"role": "user", "content": "hi"}]
    for body in (
        {"messages": "hi"},
        {"messages": [{"role": 5, "content": []}]},
        {"messages": hello, "temperature": [1]},
        {"messages": hello, "max_new_tokens": "many"},
    ):  # with a model loaded: the request is checked before the answer streams
        reply = client.post("/api/chat", json=body)
        assert reply.status_code == 400 and set(reply.json()) == {"error"}, (body, reply.text)
    assert client.post("/api/chat", json={"messages": hello, "max_new_tokens": 2}).status_code == 200


def test_the_lock_refuses_a_second_writer_and_replaces_a_stale_one(tmp_path):
    folder = str(tmp_path / "out")
    with OutputDirLock(folder):
        owner = json.load(open(os.path.join(folder, LOCK_NAME)))
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:  # another live process on this host holds it
            with open(os.path.join(folder, LOCK_NAME), "w") as f:
                json.dump({"pid": sleeper.pid, "host": socket.gethostname(), "started": 0}, f)
            with pytest.raises(OutputDirBusy, match=f"in use by another lathe train \\(pid {sleeper.pid} on"):
                OutputDirLock(folder).__enter__()
        finally:
            sleeper.kill()
            sleeper.wait()
        assert busy_message(folder) is None  # its process is gone: stale
        with OutputDirLock(folder):
            assert json.load(open(os.path.join(folder, LOCK_NAME)))["pid"] == os.getpid()
    assert not os.path.exists(os.path.join(folder, LOCK_NAME))
    with open(os.path.join(folder, LOCK_NAME), "w") as f:  # another host: we cannot tell, so it holds
        json.dump({"pid": 1, "host": "elsewhere.example"}, f)
    assert "pid 1 on elsewhere.example" in busy_message(folder)


def _hold(folder: str) -> subprocess.Popen:
    """A live process holding folder's lock (what a running `lathe train` leaves there)."""
    code = (
        "import sys, time; from lathe.llm.workflows.lock import OutputDirLock\n"
        f"with OutputDirLock({folder!r}):\n    print('held', flush=True); time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.slow  # a whole `lathe train` subprocess
def test_a_second_lathe_train_is_one_line(root, tmp_path):
    output_dir = os.path.join(root, "saves", "busy")
    holder = _hold(output_dir)
    try:
        config = tmp_path / "train.yaml"
        form = train_form(output_dir=output_dir)
        config.write_text("\n".join(f"{k}: {v}" for k, v in form["values"].items()) + "\n" + form["extra"])
        run = subprocess.run(
            [sys.executable, "-m", "lathe", "train", str(config), "finetuning_type=lora", "do_train=true"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        assert run.returncode == 2, run.stderr[-2000:]
        errors = [line for line in run.stderr.splitlines() if "error" in line]
        assert errors == [
            f"lathe train: error: output_dir {output_dir} is in use by another lathe train (pid {holder.pid} on "
            f"{socket.gethostname()}" + errors[0].split(socket.gethostname(), 1)[1]
        ], run.stderr[-2000:]
        assert "Traceback" not in run.stderr
    finally:
        holder.kill()
        holder.wait()


def test_the_page_refuses_a_busy_output_dir(client, root):
    output_dir = os.path.join(root, "saves", "cli")
    holder = _hold(output_dir)
    try:
        reply = client.post("/api/start", json=train_form("saves/cli"))
        assert reply.status_code == 409 and f"pid {holder.pid}" in reply.json()["error"], reply.text
        assert not os.path.exists(os.path.join(root, "configs"))  # the saved config is not touched
    finally:
        holder.kill()
        holder.wait()
