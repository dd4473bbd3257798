"""The second-day traps (issue 39): a typo in a path key, a cutoff that cuts most trained tokens, the
configuration dump, the progress bar's postfix, the api access log, a taken webui port, resumed runs' config."""

import json
import os
import shutil

import pytest

from lathe.llm.path_typos import local_path_problem, one_edit_apart
from tests.llm.runs import lora_sft_config


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.getbasetemp() / "home"))  # the tokenization cache


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("second_day_data")
    rows = [
        {"instruction": f"What is {a} plus 2?", "input": "", "output": f"{a} plus 2 is {a + 2}."} for a in range(20)
    ]
    (folder / "add.json").write_text(json.dumps(rows))
    # Long answers: cutoff_len 24 keeps the question and a few answer tokens of every row (no row is left out).
    long = [{"instruction": "hi", "input": "", "output": " ".join(["two plus two is four."] * 20)} for _ in range(8)]
    (folder / "long.json").write_text(json.dumps(long))
    (folder / "dataset_info.json").write_text(
        json.dumps({"add": {"file_name": "add.json"}, "long": {"file_name": "long.json"}})
    )
    return str(folder)


# ---- 2. A typo is a typo.


def test_one_edit_apart_counts_one_added_dropped_changed_or_swapped_letter():
    assert one_edit_apart("models", "modles") and one_edit_apart("tiny", "tin") and one_edit_apart("tiny", "tiy")
    assert one_edit_apart("data", "date") and one_edit_apart("data", "datas")
    assert (
        not one_edit_apart("data", "data") and not one_edit_apart("data", "dtaa ") and not one_edit_apart("ab", "ba c")
    )


def test_names_that_look_local_are_missing_folders_and_hub_ids_are_left_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs("models/tiny")
    os.makedirs("data")
    assert local_path_problem("models/tni").endswith(
        "'models' has no folder 'tni' (in %s); did you mean 'models/tiny'?" % tmp_path
    )
    assert local_path_problem("modles/tiny").endswith("did you mean 'models/tiny'?")  # one edit from a folder here
    assert "did you mean 'models'" in local_path_problem("./model")
    assert local_path_problem("../nowhere").startswith("is not a local folder: '..' has no folder 'nowhere'")
    assert local_path_problem("daat").endswith("did you mean 'data'?")
    for hub_id in ("Qwen/Qwen2-0.5B", "gpt2", "org/tiny", "models/tiny"):
        assert local_path_problem(hub_id) is None


@pytest.mark.parametrize(
    "key, value, shown",
    [
        (
            "model_name_or_path",
            "models/tni",
            "model_name_or_path 'models/tni' is not a local folder: 'models' has no folder 'tni'",
        ),
        (
            "model_name_or_path",
            "modles/tiny",
            "model_name_or_path 'modles/tiny' is not a local folder: there is no folder 'modles'",
        ),
        (
            "adapter_name_or_path",
            "saves/lora/checkpont-2",
            "adapter_name_or_path 'saves/lora/checkpont-2' is not a local folder",
        ),
    ],
)
def test_a_path_typo_is_reported_as_a_missing_folder_not_a_hub_id(
    tiny_model_dir, data_dir, tmp_path, monkeypatch, write_yaml, capsys, key, value, shown
):
    from lathe.llm.commands import train_command

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, "models/tiny")
    os.makedirs("saves/lora/checkpoint-2")
    values = lora_sft_config("models/tiny", data_dir, tmp_path / "out", **{key: value})
    config = write_yaml(tmp_path / "train.yaml", values)
    assert train_command(config, [], dry_run=True) == 2
    error = capsys.readouterr().err
    assert shown in error and "did you mean" in error
    assert "hf download" not in error and "Hub" not in error
    assert error.startswith("lathe train: error: ") and len(error.strip().splitlines()) == 2  # + the --traceback hint


def test_a_dataset_dir_typo_names_the_close_folder(tiny_model_dir, data_dir, tmp_path, monkeypatch, write_yaml, capsys):
    from lathe.llm.commands import train_command

    monkeypatch.chdir(tmp_path)
    shutil.copytree(data_dir, "data")
    config = write_yaml(tmp_path / "train.yaml", lora_sft_config(tiny_model_dir, "daat", tmp_path / "out"))
    assert train_command(config, [], dry_run=True) == 2
    error = capsys.readouterr().err
    assert "dataset_dir 'daat' does not exist; did you mean 'data'?" in error


# ---- 4. A cutoff that cuts most trained tokens stops (rows all kept).


def test_a_cutoff_that_cuts_most_trained_tokens_stops_the_run(tiny_model_dir, data_dir, tmp_path, write_yaml, capsys):
    from lathe.llm.commands import train_command

    config = write_yaml(
        tmp_path / "train.yaml",
        lora_sft_config(tiny_model_dir, data_dir, tmp_path / "out", dataset="long", cutoff_len=24),
    )
    assert train_command(config, [], dry_run=True) == 2
    error = capsys.readouterr().err
    line = next(line for line in error.splitlines() if line.startswith("lathe train: error: "))
    assert line.startswith("lathe train: error: cutoff_len=24 cuts ") and "% of the trained tokens" in line
    share = float(line.split("cuts ")[1].split("%")[0]) / 100
    assert share > 0.5 and "longest example " in line and "(now 0.1)" in line
    allowed = line.split("max_dropped_rows_share: ")[1].split(" ")[0]
    assert train_command(config, [f"max_dropped_rows_share={allowed}"], dry_run=True) == 0


# ---- 7. Resumed runs remember every invocation.


def _losses(output_dir):
    lines = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if "loss" in line]


@pytest.mark.slow
def test_a_resumed_runs_config_records_every_invocation_and_replays_the_story(
    tiny_model_dir, data_dir, tmp_path, write_yaml
):
    import yaml

    from lathe.llm.commands import train_command
    from lathe.llm.workflows.run_config import read_invocations

    output = tmp_path / "run"
    config = write_yaml(tmp_path / "train.yaml", lora_sft_config(tiny_model_dir, data_dir, output, save_steps=2))
    assert train_command(config, []) == 0
    assert train_command(config, ["max_steps=3", "learning_rate=2e-3"]) == 0  # resumes from checkpoint-2
    assert train_command(config, ["max_steps=4", "learning_rate=2e-3"]) == 0  # resumes from checkpoint-3
    saved = output / "lathe_train_config.yaml"
    story = read_invocations(str(saved))
    assert [record["resumed_from"] for record in story] == [None, "checkpoint-2", "checkpoint-3"]
    assert [(r["keys"]["max_steps"], r["keys"]["learning_rate"]) for r in story] == [(2, 1e-3), (3, 2e-3), (4, 2e-3)]
    assert yaml.safe_load(saved.read_text())["max_steps"] == 4  # the body: the last invocation, runnable as it is

    # The commands in the file re-run the story into a new folder: the same losses, step for step.
    commands = [line[4:].split() for line in saved.read_text().splitlines() if line.startswith("#   lathe train ")]
    assert len(commands) == 3
    again = tmp_path / "again"
    for command in commands:
        path, overrides = command[2], [arg.replace("NEW_DIR", str(again)) for arg in command[3:]]
        assert train_command(path, overrides) == 0
    assert len(_losses(again)) == 4
    assert _losses(again) == pytest.approx(_losses(output), rel=1e-5, abs=1e-6)
    assert len(read_invocations(str(again / "lathe_train_config.yaml"))) == 3


# ---- 3. Nothing silent while waiting: the api's access log, the webui's port.


def test_the_api_logs_one_line_per_request_with_its_tokens_streamed_or_not(tiny_model_dir, capsys):
    pytest.importorskip("fastapi")
    import openai

    from lathe.llm.inference.api import create_app
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.engine import ChatEngine
    from tests.llm.test_api import HELLO, Server

    config = parse_infer_config(
        {"model_name_or_path": tiny_model_dir, "template": "chatml", "max_new_tokens": 5, "do_sample": False},
        command="api",
    )
    server = Server(create_app(ChatEngine.from_config(config, max_batch=2), "tiny", access_log=True))
    capsys.readouterr()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        whole = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3).usage
        chunks = client.chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=4, n=2, stream=True, stream_options={"include_usage": True}
        )
        streamed = [chunk.usage for chunk in chunks if chunk.usage is not None][0]
        client.models.list()
    finally:
        server.stop()  # the lines are printed once each body is sent: all of them by now
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("lathe api: ")]
    assert len(lines) == 3
    assert lines[0].startswith("lathe api: POST /v1/chat/completions 200 ")
    assert lines[0].endswith(f" s {whole.prompt_tokens}+{whole.completion_tokens} tokens")
    assert lines[1].startswith("lathe api: POST /v1/chat/completions 200 ")
    assert lines[1].endswith(f" s {streamed.prompt_tokens}+{streamed.completion_tokens} tokens")
    assert lines[2].startswith("lathe api: GET /v1/models 200 ") and lines[2].endswith(" s")
    seconds = [float(line.split(" s")[0].rsplit(" ", 1)[1]) for line in lines]
    assert all(0 <= value < 60 for value in seconds)


def test_access_lines_name_method_path_status_seconds_and_tokens():
    from types import SimpleNamespace

    from lathe.llm.inference.api import access_line

    reply = SimpleNamespace(prompt_tokens=12, n=2, completion_tokens=9)
    assert access_line("POST", "/v1/completions", 200, 0.8412, reply) == (
        "lathe api: POST /v1/completions 200 0.84 s 24+9 tokens"
    )
    assert access_line("GET", "/health", 401, 0.001) == "lathe api: GET /health 401 0.00 s"


def test_lathe_api_quiet_drops_the_access_log(monkeypatch):
    from lathe import cli

    seen = {}
    monkeypatch.setattr(
        "lathe.llm.commands.api_command", lambda config, overrides, server, traceback: seen.update(server) or 0
    )
    assert cli.main(["api", "serve.yaml", "--quiet", "max_new_tokens=4"]) == 0
    assert seen["access_log"] is False
    assert cli.main(["api", "serve.yaml"]) == 0
    assert seen["access_log"] is True


def test_lathe_webui_on_a_taken_port_says_so_in_one_line_before_serving(tmp_path, capsys):
    pytest.importorskip("fastapi")
    import socket

    from lathe import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli.main(["webui", "--root", str(tmp_path), "--port", str(port)]) == 2
    out, error = capsys.readouterr()
    assert "serving" not in out
    line = error.splitlines()[0]
    assert line.startswith(f"lathe webui: error: port {port} on 127.0.0.1 is taken")
    assert f"choose another with --port (e.g. --port {port + 1})" in line


class _Terminal:
    """A stderr that says it is a terminal (tqdm draws there), keeping what was written."""

    def __init__(self):
        import io

        self.buffer = io.StringIO()

    def write(self, text):
        return self.buffer.write(text)

    def flush(self):
        pass

    def isatty(self):
        return True


@pytest.mark.slow
def test_on_a_terminal_the_bar_shows_the_latest_loss_and_elsewhere_the_dict_lines_stay(
    tiny_model_dir, data_dir, tmp_path, write_yaml, monkeypatch, capsys
):
    from lathe.llm.commands import train_command

    values = lora_sft_config(tiny_model_dir, data_dir, tmp_path / "tty", max_steps=3, disable_tqdm=False)
    values["include_num_input_tokens_seen"] = True
    config = write_yaml(tmp_path / "train.yaml", values)
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    capsys.readouterr()
    assert train_command(config, []) == 0
    monkeypatch.undo()
    drawn, out = terminal.buffer.getvalue(), capsys.readouterr().out  # tqdm.write prints on stdout
    assert "{'loss'" not in drawn + out  # no dict line per training log ...
    assert "3/3" in drawn and "loss=" in drawn and "lr=" in drawn and "tok/s=" in drawn  # ... the postfix
    assert "'train_runtime'" in out  # the final summary is still written

    assert train_command(config, [f"output_dir={tmp_path / 'pipe'}"]) == 0  # stderr captured: not a terminal
    captured = capsys.readouterr()
    assert captured.out.count("{'loss'") == 3 and "loss=" not in captured.err  # transformers' lines, as they were


def test_a_first_deepspeed_run_says_which_cpu_ops_it_compiles_and_roughly_how_long(tmp_path):
    from lathe.train.parallel.deepspeed_ops import compile_notice, ops_to_build

    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert ops_to_build({"zero_optimization": {"stage": 2}}, on_cpu=False) == []
    assert ops_to_build(offload, on_cpu=True) == ["deepspeed_shm_comm", "cpu_adam"]
    assert ops_to_build({**offload, "zero_force_ds_cpu_optimizer": False}, on_cpu=True) == ["deepspeed_shm_comm"]
    notice = compile_notice(["deepspeed_shm_comm", "cpu_adam"], str(tmp_path), {})
    assert notice.startswith("DeepSpeed is compiling its CPU ops deepspeed_shm_comm, cpu_adam (first run only; about ")
    assert "minutes" in notice and str(tmp_path) in notice
    built = tmp_path / "py311_cpu" / "deepspeed_shm_comm"  # torch's extensions cache, as a first run leaves it
    built.mkdir(parents=True)
    (built / "deepspeed_shm_comm.so").write_bytes(b"")
    assert compile_notice(["deepspeed_shm_comm", "cpu_adam"], str(tmp_path), {}).startswith(
        "DeepSpeed is compiling its CPU ops cpu_adam (first run only; about 2 minutes"
    )
    assert compile_notice(["deepspeed_shm_comm", "cpu_adam"], str(tmp_path), {"cpu_adam": True}) is None


def test_the_compile_notice_is_logged_by_the_first_process_of_a_machine(tmp_path, monkeypatch, caplog):
    pytest.importorskip("deepspeed")
    from types import SimpleNamespace

    from lathe.train.parallel.deepspeed_ops import announce_compiles

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty cache: everything would be compiled
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    with caplog.at_level("WARNING", logger="lathe.train.parallel.deepspeed_ops"):
        announce_compiles(offload, SimpleNamespace(local_process_index=1))
        assert not caplog.records
        announce_compiles(offload, SimpleNamespace(local_process_index=0))
    assert len(caplog.records) == 1 and "cpu_adam" in caplog.records[0].getMessage()
    assert str(tmp_path) in caplog.records[0].getMessage()


# ---- 5. Less noise.


def test_the_configuration_dump_lists_what_the_user_set_as_written(
    tiny_model_dir, data_dir, tmp_path, write_yaml, capsys
):
    from lathe.llm.commands import train_command

    values = lora_sft_config(tiny_model_dir, data_dir, tmp_path / "out", warmup_ratio=0.1)
    config = write_yaml(tmp_path / "train.yaml", values)
    assert train_command(config, ["lora_rank=4"], dry_run=True) == 0
    out = capsys.readouterr().out
    dump = out.split("Configuration (the keys you set, as written):\n")[1].split("\n\n")[0]
    dump = dump.split("\nPlan")[0]
    shown = [line.strip() for line in dump.splitlines() if line.startswith("    ")]
    assert "warmup_ratio: 0.1" in shown and "report_to: none" in shown and "lora_rank: 4" in shown
    for noise in ("accelerator_config", "debug: []", "report_to: []", "warmup_steps: 0.1", "label_names"):
        assert noise not in out
    keys = [line.split(":")[0] for line in shown]
    # Besides the keys set, only do_train: lathe trains when it is not set; LLaMA-Factory (transformers) does not.
    assert sorted(keys) == sorted([*values, "lora_rank", "do_train"])
    assert "resolved by lathe (not set, and not LLaMA-Factory's default):\n    do_train: True" in out


def test_a_one_point_loss_plot_draws_its_point(tmp_path):
    pytest.importorskip("matplotlib")
    import numpy as np
    from matplotlib import image

    from lathe.llm.workflows.outputs import plot_loss

    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 2.5}]}))
    pixels = image.imread(plot_loss(str(tmp_path), ("loss",))[0])[..., :3]
    blue = np.array([0x1F, 0x77, 0xB4]) / 255  # the smoothed curve's colour, drawn at full strength
    ys, xs = np.nonzero(np.abs(pixels - blue).max(-1) < 0.05)
    height, width = pixels.shape[:2]
    # The point sits in the middle of the axes (one value: matplotlib centres it); the legend is in a corner.
    middle = (abs(xs - width * 0.55) < width * 0.12) & (abs(ys - height * 0.48) < height * 0.15)
    assert middle.sum() >= 20


@pytest.mark.slow
def test_the_template_mismatch_warning_comes_once_per_run_with_its_fix(
    tiny_model_dir, data_dir, tmp_path, write_yaml, caplog
):
    from transformers import AutoTokenizer

    from lathe.llm.commands import train_command
    from lathe.llm.templates.registry import get_template

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    # chatml's chat_template (a comment makes it this test's own: the warning is once per process and text)
    tokenizer.chat_template = get_template("chatml").jinja_chat_template(tokenizer) + "{# " + str(tmp_path) + " #}"
    tokenizer.save_pretrained(model)
    values = lora_sft_config(str(model), data_dir, tmp_path / "out", template="qwen", max_steps=1)
    config = write_yaml(tmp_path / "train.yaml", values)
    with caplog.at_level("WARNING"):
        assert train_command(config, []) == 0  # the tokenizer is loaded for the data, the model and the save
    warnings = [r.getMessage() for r in caplog.records if "renders conversations differently" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "Fix: template: chatml trains as the chat_template renders; or keep 'qwen' and serve the `lathe export`ed "
        "folder, which gets the template's own chat_template."
    )
    assert "\n" not in warnings[0]


def test_ray_is_quiet_unless_verbose_and_the_flag_reaches_it(monkeypatch):
    from lathe import cli
    from lathe.llm.launch.ray_train import init_kwargs

    assert init_kwargs({"init_kwargs": {}}) == {"logging_level": "warning"}
    assert init_kwargs({"init_kwargs": {}}, verbose=True) == {}
    assert init_kwargs({"init_kwargs": {"logging_level": "debug"}}) == {"logging_level": "debug"}  # the user's wins
    seen = {}

    def fake_train_command(config, overrides, dry_run, traceback, verbose):
        seen.update(overrides=overrides, verbose=verbose)
        return 0

    monkeypatch.setattr("lathe.llm.commands.train_command", fake_train_command)
    assert cli.main(["train", "c.yaml", "--verbose", "max_steps=1"]) == 0
    assert seen == {"overrides": ["max_steps=1"], "verbose": True}
    assert cli.main(["train", "c.yaml"]) == 0 and seen["verbose"] is False
