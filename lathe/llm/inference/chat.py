"""`lathe chat CONFIG [key=value ...]`: talk to the model in the terminal, with the template it was
trained with. Replies stream as they are generated; `clear` forgets the conversation, `exit` (or
end of input) quits, `/image PATH`, `/video PATH` and `/audio PATH` attach a file to the next message (a model
that takes such input: the media go before that message's text, encoded as training encodes them; videos' frames
sampled as LLaMA-Factory samples them). Generation settings come from the config's generation keys, overridable on
the command line (`temperature=0.2 max_new_tokens=128`)."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

from lathe.llm.inference.engine import ChatEngine, InvalidRequest

WELCOME = "Chat with the model: `clear` forgets the conversation, `exit` quits."
COMMANDS = {"/image": "image", "/video": "video", "/audio": "audio"}  # command -> the kind of media it attaches
WELCOME_IMAGES = "`/image PATH` attaches an image to your next message."


def chat_loop(engine: ChatEngine, system: str | None = None, read=input, write=None) -> int:
    """The loop itself; `read(prompt)` gives a line (EOFError ends), `write(text)` prints."""

    def default_write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    write = write or default_write
    takes = [command for command, kind in COMMANDS.items() if engine.media_refusal(kind) is None]
    welcome = WELCOME_IMAGES if takes == ["/image"] else ""
    if takes and not welcome:
        welcome = f"{', '.join(f'`{command} PATH`' for command in takes)} attach a file to your next message."
    write(WELCOME + (" " + welcome if welcome else "") + "\n")
    history: list[dict] = []
    attached: list[dict] = []  # media parts for the next message
    items: dict[tuple[str, str], object] = {}  # (kind, path) -> what was read when it was attached
    shown: set[str] = set()  # each warning once per session
    while True:
        try:
            query = read("\nUser: ").strip()
        except (EOFError, KeyboardInterrupt):
            write("\n")
            return 0
        if query == "exit":
            return 0
        if query == "clear":
            history, attached = [], []
            write("The conversation is cleared.\n")
            continue
        if not query:
            continue
        command = query.split(maxsplit=1)[0]
        if command in COMMANDS:
            write(attach(engine, COMMANDS[command], query[len(command) :].strip(), attached, items) + "\n")
            continue
        content = attached + [{"type": "text", "text": query}] if attached else query
        messages = (
            ([{"role": "system", "content": system}] if system else [])
            + history
            + [{"role": "user", "content": content}]
        )
        try:
            prompt_ids, media = engine.chat_inputs(
                messages, read_media=lambda part, where: items[part["type"][: -len("_url")], part["path"]]
            )
            params = engine.check_length(prompt_ids, engine.default_params())
        except InvalidRequest as error:
            write(f"(not sent: {error} Type `clear` to start a new conversation.)\n")
            continue
        with held_messages(shown):  # a warning of the first forward (transformers') waits for the reply's end
            write("Assistant: ")
            sequence = engine.generate(prompt_ids, params, on_text=write, media=media)
            if sequence.finish_reason == "length":
                write(" [cut at max_new_tokens]")
            write("\n")
        history += [{"role": "user", "content": content}, {"role": "assistant", "content": sequence.text}]
        attached = []


def attach(engine: ChatEngine, kind: str, path: str, attached: list[dict], items: dict) -> str:
    """Read the `kind` file at `path` (local files only) for the next message; what to tell the user."""
    refusal = engine.media_refusal(kind)
    if refusal is not None:
        return f"(not attached: {refusal})"
    try:
        item, described = read_local(kind, path)
    except Exception as error:  # noqa: BLE001 (a missing, remote or unreadable file: say so, keep chatting)
        return f"(not attached: {error})"
    items[kind, path] = item
    attached.append({"type": f"{kind}_url", "path": path})
    return f"({kind} {path} attached, {described}: it goes with your next message)"


def read_local(kind: str, path: str) -> tuple[object, str]:
    """(the image, or the video's / audio's bytes, a few words on it) of a local file; an error says why not."""
    if kind == "image":
        from lathe.llm.multimodal.images import open_image

        image = open_image(path, where="/image")
        image.load()
        return image, f"{image.width}x{image.height}"
    import os

    from lathe.llm.inference.image_urls import probe_stream

    if not os.path.isfile(path):
        raise FileNotFoundError(f"/{kind}: {path!r} not found")
    with open(path, "rb") as handle:
        data = handle.read()
    width, height = probe_stream(data, kind, f"/{kind}", repr(path))
    return data, f"{width}x{height}" if kind == "video" else f"{len(data)} bytes"


@contextlib.contextmanager
def held_messages(shown: set[str]):
    """Hold the warnings and log records raised meanwhile (the generation thread's included), then show each
    that `shown` lacks, as it would have been shown: after the reply instead of in the middle of its text."""
    handlers = {handler for name in ("", "transformers") for handler in logging.getLogger(name).handlers}
    records: list[tuple[logging.Handler, logging.LogRecord]] = []

    class Hold(logging.Filter):
        def __init__(self, handler):
            super().__init__()
            self.handler = handler

        def filter(self, record):
            records.append((self.handler, record))
            return False

    holds = {handler: Hold(handler) for handler in handlers}
    for handler, hold in holds.items():
        handler.addFilter(hold)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            yield
    finally:
        for handler, hold in holds.items():
            handler.removeFilter(hold)
        for item in caught:
            text = str(item.message)
            if text not in shown:
                shown.add(text)
                warnings.showwarning(item.message, item.category, item.filename, item.lineno)
        new = {}  # record -> the handlers that held it (a record reaches every handler on its way up)
        for handler, record in records:
            if record in new or record.getMessage() not in shown:
                new.setdefault(record, []).append(handler)
                shown.add(record.getMessage())
        for record, held_by in new.items():
            for handler in held_by:
                handler.handle(record)


def chat_command(config_path: str, overrides: list[str]) -> int:
    from lathe.llm.inference.config import parse_infer_config

    config = parse_infer_config(config_path, overrides, command="chat")
    engine = ChatEngine.from_config(config, max_batch=1)
    return chat_loop(engine)  # the template carries default_system, as in training
