"""`lathe webui`'s server without a browser: the form's YAML is the file `lathe train` runs, runs start, show
their points, stop with a checkpoint (SIGINT) and resume; runs from the command line are listed; every path
stays under the root (../, absolute, symbolic links); the key guards every route; bodies are bounded."""

import json
import os
import pathlib
import time

import pytest
import yaml

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lathe.llm.webui.server import MAX_BODY, create_app, serve  # noqa: E402
from tests.llm.webui_fixtures import make_root, train_form  # noqa: E402


@pytest.fixture
def root(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the tokenization cache of the subprocesses
    return make_root(tmp_path / "root", tiny_model_dir)


@pytest.fixture
def client(root):
    client = TestClient(create_app(root), base_url="http://localhost")
    yield client
    for run in client.app.state.jobs.running():  # a failed test leaves no training process behind
        client.app.state.jobs.stop(run)
        client.app.state.jobs.wait(run, 60)


def test_form_gives_the_yaml_lathe_train_reads(client, root):
    from lathe.llm.config.train import parse_train_config

    reply = client.post("/api/config", json=train_form(learning_rate="2e-4"))
    assert reply.status_code == 200, reply.text
    values = yaml.safe_load(reply.json()["yaml"])
    assert values["finetuning_type"] == "lora" and values["learning_rate"] == 2e-4 and values["max_steps"] == 6
    assert values["model_name_or_path"] == os.path.join(root, "models", "tiny")
    assert values["output_dir"] == os.path.join(root, "saves", "run1")
    config = parse_train_config(values)
    assert config.training.learning_rate == 2e-4 and config.finetuning.finetuning_type == "lora"
    qlora = yaml.safe_load(client.post("/api/config", json={**train_form(), "method": "qlora"}).json()["yaml"])
    assert qlora["quantization_bit"] == 4 and qlora["finetuning_type"] == "lora"
    assert client.get("/api/datasets").json()["datasets"] == {"add": {"file_name": "add.json"}}
    assert "models/tiny" in client.get("/api/models").json()["models"]


def test_the_form_offers_grpo_with_its_keys(client, root):
    from lathe.llm.config.train import parse_train_config

    # the page runs reward code only from .py files under its root (docs/SECURITY.md)
    (pathlib.Path(root) / "rewards.py").write_text(
        "def exact(completions, **kwargs):\n    return [0.0] * len(completions)\n"
    )

    meta = client.get("/api/strings").json()
    assert "grpo" in meta["stages"] and "reward_funcs" in meta["stage_keys"]["grpo"]
    assert meta["defaults"]["num_generations"] == 8 and meta["defaults"]["loss_type"] == "dapo"
    form = train_form(stage="grpo", reward_funcs="rewards:exact", num_generations="4", beta="0.04", loss_type="grpo")
    form["values"]["cutoff_len"] = ""  # stage grpo reads max_prompt_length / max_completion_length instead
    values = yaml.safe_load(client.post("/api/config", json=form).json()["yaml"])
    assert (values["stage"], values["reward_funcs"], values["num_generations"], values["beta"]) == (
        "grpo",
        ["rewards:exact"],  # checked one by one against the root, saved as the list it is
        4,
        0.04,
    )
    config = parse_train_config(values)
    assert config.finetuning.stage == "grpo" and config.finetuning.reward_funcs == ["rewards:exact"]
    assert config.finetuning.loss_type == "grpo" and config.finetuning.num_generations == 4


def test_bad_form_values_are_one_clear_error(client):
    reply = client.post("/api/config", json={**train_form(), "method": "magic"})
    assert reply.status_code == 400 and "method" in reply.json()["error"]
    reply = client.post("/api/config", json=train_form(trust_remote_code="true"))
    assert reply.status_code == 400 and "confirm" in reply.json()["error"]
    ok = client.post("/api/config", json={**train_form(trust_remote_code="true"), "confirm_remote_code": True})
    assert ok.status_code == 200 and "trust_remote_code: true" in ok.json()["yaml"]
    reply = client.post("/api/config", json={**train_form(), "extra": "!!python/object/apply:os.system ['true']"})
    assert reply.status_code == 400  # safe_load: YAML tags never build objects
    reply = client.post("/api/config", json={**train_form(), "values": {"bad key": "1"}})
    assert reply.status_code == 400


@pytest.mark.parametrize("key", ["model_name_or_path", "output_dir", "dataset_dir", "adapter_name_or_path"])
@pytest.mark.parametrize("value", ["../outside", "/etc", "link/inside", "models/../../outside"])
def test_paths_stay_under_the_root(client, root, key, value):
    outside = os.path.join(os.path.dirname(root), "outside")
    os.makedirs(outside, exist_ok=True)
    if not os.path.islink(os.path.join(root, "link")):
        os.symlink(outside, os.path.join(root, "link"))
    reply = client.post("/api/config", json=train_form(**{key: value}))
    assert reply.status_code == 403, reply.text
    assert key in reply.json()["error"] and "outside" in reply.json()["error"]


def test_other_routes_keep_paths_under_the_root(client, root):
    open(os.path.join(os.path.dirname(root), "secret.txt"), "w").write("secret")
    os.symlink(os.path.dirname(root), os.path.join(root, "up"))
    for path in ("../secret.txt", "up/secret.txt", os.path.join(os.path.dirname(root), "secret.txt")):
        reply = client.get("/api/download", params={"path": path})
        assert reply.status_code == 403 and "secret" not in reply.text.replace(path, "")
        assert client.get("/api/run", params={"run": path}).status_code == 403
    assert client.get("/api/datasets", params={"dataset_dir": "../"}).status_code == 403
    assert client.post("/api/upload?name=../x.json", content=b"[]").status_code == 400
    assert client.post("/api/upload?name=x.json&dataset_dir=up", content=b"[]").status_code == 403
    assert client.post("/api/upload?name=more.json", content=b"[]").json() == {"saved": "data/more.json", "bytes": 2}
    assert client.get("/api/download", params={"path": "data/more.json"}).content == b"[]"
    assert client.get("/static/..%2Fserver.py").status_code == 404


def test_bodies_are_bounded(client):
    reply = client.post("/api/config", content=b"x" * (MAX_BODY + 1), headers={"Content-Type": "application/json"})
    assert reply.status_code == 413


def test_the_key_guards_every_route(root):
    client = TestClient(create_app(root, api_key="s3cret"), base_url="http://localhost")
    for path in ("/", "/static/app.js", "/api/runs", "/api/strings"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.post("/api/config", json=train_form()).status_code == 401
    assert client.get("/?key=s3cret").status_code == 200  # sets the cookie the page's requests carry
    assert client.get("/api/runs").status_code == 200
    with pytest.raises(ValueError, match="key"):
        serve(root, host="0.0.0.0", api_key=None)


def test_runs_from_the_command_line_are_listed(client, root):
    run = os.path.join(root, "cli_runs", "a")
    os.makedirs(os.path.join(run, "checkpoint-2"))
    lines = [
        {"current_steps": s, "total_steps": 4, "loss": 2.0 - s / 10, "lr": 1e-3, "percentage": s * 25} for s in (1, 2)
    ]
    open(os.path.join(run, "trainer_log.jsonl"), "w").write("".join(json.dumps(line) + "\n" for line in lines))
    state = {
        "log_history": [
            {"step": 1, "loss": 1.9, "grad_norm": 0.5, "reward": 0.1},
            {"step": 2, "loss": 1.8, "grad_norm": 0.25, "reward": 0.7},
        ]
    }
    open(os.path.join(run, "checkpoint-2", "trainer_state.json"), "w").write(json.dumps(state))
    listed = {item["run"]: item for item in client.get("/api/runs").json()["runs"]}
    assert listed["cli_runs/a"]["status"] == "incomplete" and listed["cli_runs/a"]["step"] == 2
    assert listed["cli_runs/a"]["checkpoints"] == ["checkpoint-2"]
    detail = client.get("/api/run", params={"run": "cli_runs/a"}).json()
    assert [point["grad_norm"] for point in detail["points"]] == [0.5, 0.25]
    assert [point["reward"] for point in detail["points"]] == [0.1, 0.7]  # GRPO's reward curve
    open(os.path.join(run, "all_results.json"), "w").write("{}")
    assert client.get("/api/run", params={"run": "cli_runs/a"}).json()["status"] == "finished"


def _wait(condition, timeout: float = 240.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_start_stop_resume_a_run(client, root):
    form = train_form()
    form["extra"] = "max_steps: 4000\ndisable_tqdm: true\nseed: 7\nlogging_steps: 1\n"
    started = client.post("/api/start", json=form).json()
    assert started["run"] == "saves/run1" and started["config"] == "configs/saves_run1.yaml"
    with open(os.path.join(root, "configs", "saves_run1.yaml")) as f:
        assert f.read() == started["yaml"]  # the file lathe train runs is the YAML the page showed
    detail = lambda: client.get("/api/run", params={"run": "saves/run1"}).json()  # noqa: E731
    _wait(lambda: len(detail()["points"]) >= 3)
    assert detail()["status"] == "running"
    assert client.post("/api/stop", json={"run": "saves/run1"}).json()["status"] == "stopping"
    assert client.app.state.jobs.wait("saves/run1", 120) == 130
    stopped = detail()
    assert stopped["status"] == "stopped" and stopped["checkpoints"], stopped["log"][-2000:]
    assert "Resume with" in stopped["log"]
    step = int(stopped["checkpoints"][-1].split("-")[1])
    assert 3 <= step < 4000
    # resume: a shorter run to the end (the saved config is the one resumed; keep the test short)
    config = os.path.join(root, "configs", "saves_run1.yaml")
    values = yaml.safe_load(open(config))
    values["max_steps"] = step + 3
    open(config, "w").write(yaml.safe_dump(values))
    resumed = client.post("/api/resume", json={"run": "saves/run1"}).json()
    assert resumed["checkpoint"] == f"saves/run1/checkpoint-{step}"
    assert client.app.state.jobs.wait("saves/run1", 240) == 0
    final = detail()
    assert final["status"] == "finished" and final["step"] == step + 3
    steps = [point["current_steps"] for point in final["points"] if point.get("loss") is not None]
    assert steps == sorted(steps) and steps[-1] == step + 3


@pytest.mark.slow
def test_plan_and_preview_are_the_cli_outputs(client):
    plan = client.post("/api/plan", json=train_form()).json()
    assert plan["code"] == 0, plan["output"][-2000:]
    assert "Dry run: nothing was trained." in plan["output"] and "memory" in plan["output"]
    preview = client.post("/api/preview", json=train_form()).json()
    assert preview["code"] == 0, preview["output"][-2000:]
    assert "[[" in preview["output"] and "plus" in preview["output"]  # trained spans, marked for the page


def test_webchat_serves_the_chat_alone_and_streams(root):
    chat = {"model_name_or_path": "models/tiny", "template": "chatml"}
    client = TestClient(create_app(root, chat_config=chat), base_url="http://localhost")
    assert client.get("/api/runs").status_code == 404
    assert client.post("/api/start", json=train_form()).status_code == 404
    assert client.get("/api/strings").json()["chat"] == chat
    loaded = client.post("/api/chat/load", json={**chat, "adapter_name_or_path": "../elsewhere"})
    assert loaded.status_code == 403
    assert client.post("/api/chat/load", json=chat).json()["template"] == "chatml"
    messages = [{"role": "user", "content": "What is two plus two?"}]
    with client.stream(
        "POST", "/api/chat", json={"messages": messages, "max_new_tokens": 8, "temperature": 0}
    ) as reply:
        pieces = list(reply.iter_text())
    engine = client.app.state.chat.engine
    expected = engine.generate(engine.chat_prompt(messages), engine.default_params(max_new_tokens=8, temperature=0))
    assert "".join(pieces) == expected.text and pieces


def test_cli_needs_a_key_off_loopback_and_reads_it_from_the_environment(root, monkeypatch, capsys):
    import uvicorn

    from lathe.cli import main

    monkeypatch.delenv("LATHE_WEBUI_KEY", raising=False)
    assert main(["webui", "--host", "0.0.0.0", "--root", root]) == 2
    assert "give a key (--api_key or LATHE_WEBUI_KEY)" in capsys.readouterr().err
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kwargs: served.update(app=app, host=host, port=port))
    monkeypatch.setenv("LATHE_WEBUI_KEY", "from-env")
    assert main(["webui", "--host", "0.0.0.0", "--port", "7999", "--root", root]) == 0
    assert served["host"] == "0.0.0.0" and served["port"] == 7999
    client = TestClient(served["app"], base_url="http://localhost")
    assert client.get("/api/runs").status_code == 401
    assert client.get("/api/runs", headers={"Authorization": "Bearer from-env"}).status_code == 200


@pytest.mark.slow
def test_evaluate_and_predict_from_the_form(client, root):
    form = train_form("saves/predict", max_new_tokens="4", do_sample="false", max_samples="4")
    form.update(method="full", action="predict", extra="")
    values = yaml.safe_load(client.post("/api/config", json=form).json()["yaml"])
    assert values["do_train"] is False and values["do_predict"] is True and values["eval_dataset"] == "add"
    assert "dataset" not in values
    assert client.post("/api/start", json=form).json()["run"] == "saves/predict"
    assert client.app.state.jobs.wait("saves/predict", 300) == 0
    detail = client.get("/api/run", params={"run": "saves/predict"}).json()
    assert detail["status"] == "finished", detail["log"][-2000:]
    assert "saves/predict/generated_predictions.jsonl" in detail["results"]
    lines = client.get("/api/download", params={"path": "saves/predict/generated_predictions.jsonl"}).text.splitlines()
    assert len(lines) == 4 and set(json.loads(lines[0])) == {"prompt", "predict", "label"}


def test_the_page_ships_in_the_package_and_fetches_nothing_from_outside():
    import re
    from pathlib import Path

    import tomllib

    static = Path(__file__).parents[2] / "lathe" / "llm" / "webui" / "static"
    with open(Path(__file__).parents[2] / "pyproject.toml", "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["package-data"]["lathe.llm.webui"]
    for path in static.iterdir():
        assert any(path.match(pattern.split("/")[-1]) for pattern in patterns), path.name
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", path.read_text()), path.name


def test_template_is_suggested_from_the_tokenizer(client, root):
    from transformers import AutoTokenizer

    from lathe.llm.templates.registry import get_template

    assert client.get("/api/template", params={"model": "models/tiny"}).json() == {"templates": []}  # none saved
    folder = os.path.join(root, "models", "tiny")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = get_template("chatml").jinja_chat_template(tokenizer)
    tokenizer.save_pretrained(folder)
    assert "chatml" in client.get("/api/template", params={"model": "models/tiny"}).json()["templates"]
    assert client.get("/api/template", params={"model": "../models"}).status_code == 403


def test_start_refuses_a_form_that_differs_from_the_yaml_the_page_showed(client, root):
    form = train_form("saves/shown")
    shown = client.post("/api/config", json=form).json()["yaml"]
    changed = train_form("saves/shown", template="qwen")  # e.g. a late suggestion changed a field after the YAML
    refused = client.post("/api/start", json={**changed, "yaml": shown})
    assert refused.status_code == 400 and "the form changed after its YAML was shown" in refused.json()["error"]
    assert not os.path.exists(os.path.join(root, "configs", "saves_shown.yaml"))  # nothing saved, nothing started
    assert client.app.state.jobs.status("saves/shown") is None
