"""`lathe webui` in a real browser (headless Chromium driven by Selenium): fill the Train form for the tiny
model, start, watch the loss chart grow, stop, resume, chat with the checkpoint, export it. Skipped, with the
reason, when Selenium, chromium or chromedriver is missing (.ci/run installs them)."""

import os
import shutil
import socket
import threading
import time

import pytest

from tests.llm.webui_fixtures import make_root

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,900",
)


@pytest.fixture
def server(tmp_path, tiny_model_dir, monkeypatch):
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    from lathe.llm.webui.server import create_app

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = make_root(tmp_path / "root", tiny_model_dir)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(root)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/", root, app
    for run in app.state.jobs.running():  # a failed test leaves no training process behind
        app.state.jobs.stop(run)
        app.state.jobs.wait(run, 60)
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="Selenium is not installed (pip install selenium)")
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    yield driver
    driver.quit()


def _wait(condition, timeout: float = 180.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            value = condition()
        except Exception:  # an element replaced while it was read: the table is redrawn every 2 s
            value = None
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError("timed out waiting in the browser")


def _click(driver, selector: str) -> None:
    """Click the element `selector` names in the runs table: the table is redrawn every 2 s, so an element found
    just before a redraw is stale when clicked; find it again until the click lands."""

    def click():
        driver.find_element("css selector", selector).click()
        return True

    _wait(click)


def _fill(driver, element_id: str, text: str) -> None:
    element = driver.find_element("id", element_id)
    element.clear()
    element.send_keys(text)


def _shoot(driver, name: str) -> None:
    """Screenshots for docs/WEBUI.md, when LATHE_WEBUI_SCREENSHOTS names a folder."""
    folder = os.environ.get("LATHE_WEBUI_SCREENSHOTS")
    if folder:
        driver.save_screenshot(os.path.join(folder, f"{name}.png"))


def _status(driver, run: str) -> str:
    return driver.find_element("css selector", f'tr[data-run="{run}"] .status').text


def _points(driver) -> int:
    canvas = driver.find_element("css selector", '.chart[data-key="loss"] canvas')
    return int(canvas.get_attribute("data-points"))


def test_train_watch_stop_resume_chat_export_in_a_browser(browser, server):  # browser first: it may skip
    url, root, app = server
    driver = browser
    driver.get(url)
    _wait(lambda: driver.find_element("id", "h_learning_rate").get_attribute("value") == "0.00005")
    _fill(driver, "model_name_or_path", "models/tiny")
    _fill(driver, "template", "chatml")
    driver.find_element("id", "load_datasets").click()
    _wait(lambda: driver.find_element("css selector", "#dataset option").text == "add")
    _fill(driver, "output_dir", "saves/b1")
    for key, value in (("cutoff_len", "32"), ("per_device_train_batch_size", "4"), ("logging_steps", "1")):
        _fill(driver, f"h_{key}", value)
    _fill(driver, "h_gradient_accumulation_steps", "1")
    _fill(driver, "h_learning_rate", "1e-3")
    _fill(driver, "extra", "max_steps: 4000\ndisable_tqdm: true\n")
    _wait(lambda: "max_steps: 4000" in driver.find_element("id", "yaml").text)
    assert "learning_rate: 0.001" in driver.find_element("id", "yaml").text
    _shoot(driver, "train")
    driver.find_element("id", "start").click()

    # Watch: the run appears, its loss chart grows, Stop stops it with a checkpoint, Resume goes on from it.
    _wait(lambda: _status(driver, "saves/b1") == "running")
    first = _wait(lambda: _points(driver) >= 2 and _points(driver))
    _wait(lambda: _points(driver) > first)
    _shoot(driver, "watch")
    _click(driver, 'tr[data-run="saves/b1"] .stop')
    _wait(lambda: _status(driver, "saves/b1") == "stopped")
    with open(os.path.join(root, "configs", "saves_b1.yaml")) as f:
        assert "max_steps: 4000" in f.read()
    stopped_at = max(
        int(name.split("-")[1])
        for name in os.listdir(os.path.join(root, "saves", "b1"))
        if name.startswith("checkpoint-")
    )
    _click(driver, 'tr[data-run="saves/b1"] .resume')
    _wait(lambda: _status(driver, "saves/b1") == "running")
    _wait(lambda: _points(driver) > stopped_at + 1)
    _click(driver, 'tr[data-run="saves/b1"] .stop')
    _wait(lambda: _status(driver, "saves/b1") == "stopped")
    checkpoint = "saves/b1/" + max(
        (name for name in os.listdir(os.path.join(root, "saves", "b1")) if name.startswith("checkpoint-")),
        key=lambda name: int(name.split("-")[1]),
    )
    assert int(checkpoint.rsplit("-", 1)[1]) > stopped_at

    # Chat with the checkpoint's adapter: the answer streams into the page.
    driver.find_element("css selector", '.tab[data-tab="chat"]').click()
    _fill(driver, "chat_model", "models/tiny")
    _fill(driver, "chat_adapter", checkpoint)
    _fill(driver, "chat_template", "chatml")
    driver.find_element("id", "chat_load").click()
    _wait(lambda: "(chatml)" in driver.find_element("id", "chat_loaded").text)
    _fill(driver, "chat_input", "What is two plus two?")
    driver.find_element("id", "chat_send").click()
    answer = _wait(lambda: driver.find_element("css selector", ".msg.assistant[data-done='1']"))
    assert answer.text.startswith("assistant:")
    _shoot(driver, "chat")

    # Export: merged, checked, sharded; the files listed with download links.
    driver.find_element("css selector", '.tab[data-tab="export"]').click()
    _fill(driver, "export_model", "models/tiny")
    _fill(driver, "export_adapter", checkpoint)
    _fill(driver, "export_template", "chatml")
    driver.find_element("id", "export_go").click()
    link = _wait(lambda: driver.find_element("css selector", "#export_files a[href*='model.safetensors']"))
    assert os.path.isfile(os.path.join(root, "exports", "model1", "model.safetensors"))
    assert link.get_attribute("href").endswith("exports%2Fmodel1%2Fmodel.safetensors")
    _shoot(driver, "export")


def test_a_late_template_suggestion_never_overwrites_what_the_user_typed(browser, server, monkeypatch):
    """The suggestion (the tokenizer loaded on the server) answers after the user typed a template: the typed
    value stays, and Start saves the YAML the page showed, with that template."""
    import yaml
    from transformers import AutoTokenizer

    from lathe.llm.templates.registry import get_template
    from lathe.llm.webui import forms

    url, root, app = server
    folder = os.path.join(root, "models", "tiny")  # a chat_template that chatml reproduces: the suggestion is chatml
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = get_template("chatml").jinja_chat_template(tokenizer)
    tokenizer.save_pretrained(folder)
    asked, release = threading.Event(), threading.Event()
    suggest = forms.suggest_template

    def slow_suggestion(root_folder, model):
        asked.set()
        assert release.wait(60)
        return suggest(root_folder, model)

    monkeypatch.setattr(forms, "suggest_template", slow_suggestion)
    driver = browser
    driver.get(url)
    _wait(lambda: driver.find_element("id", "h_learning_rate").get_attribute("value") == "0.00005")
    _fill(driver, "model_name_or_path", "models/tiny\t")  # leaving the field with the template empty asks
    assert asked.wait(30)
    _fill(driver, "template", "qwen")  # typed while the server loads the tokenizer
    release.set()
    answer = _wait(lambda: driver.find_element("id", "suggest_out").get_attribute("data-answer"))
    assert answer.split(",")[0] == "chatml"  # the answer came, and would have been chatml
    assert driver.find_element("id", "template").get_attribute("value") == "qwen"

    driver.find_element("id", "load_datasets").click()
    _wait(lambda: driver.find_element("css selector", "#dataset option").text == "add")
    _fill(driver, "output_dir", "saves/typed")
    _fill(driver, "extra", "max_steps: 1\ndisable_tqdm: true\n")
    _wait(lambda: "max_steps: 1" in driver.find_element("id", "yaml").text)
    driver.find_element("id", "start").click()
    saved = os.path.join(root, "configs", "saves_typed.yaml")
    _wait(lambda: os.path.isfile(saved), 60)
    with open(saved) as f:
        config = yaml.safe_load(f)
    assert config["template"] == "qwen" and config["max_steps"] == 1
    shown = driver.find_element("id", "yaml").get_attribute("textContent")  # the Train tab is hidden now
    assert yaml.safe_load(shown) == config  # the YAML the page showed is the one saved

    # Asked for with the Suggest button and nothing typed meanwhile, the suggestion fills the field.
    driver.find_element("css selector", '.tab[data-tab="train"]').click()
    _fill(driver, "template", "")
    driver.find_element("id", "suggest").click()
    _wait(lambda: driver.find_element("id", "template").get_attribute("value") == "chatml", 60)
