"""`lathe chat CONFIG [key=value ...]`: talk to the model in the terminal, with the template it was
trained with. Replies stream as they are generated; `clear` forgets the conversation, `exit` (or
end of input) quits, `/image PATH` attaches an image to the next message (a vision-language model: the
images go before that message's text, encoded as training encodes them). Generation settings come from
the config's generation keys, overridable on the command line (`temperature=0.2 max_new_tokens=128`)."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

from lathe.llm.inference.engine import ChatEngine, InvalidRequest

WELCOME = "Chat with the model: `clear` forgets the conversation, `exit` quits."
IMAGE_COMMAND = "/image"
WELCOME_IMAGES = "`/image PATH` attaches an image to your next message."


def chat_loop(engine: ChatEngine, system: str | None = None, read=input, write=None) -> int:
    """The loop itself; `read(prompt)` gives a line (EOFError ends), `write(text)` prints."""

    def default_write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    write = write or default_write
    takes_images = engine.image_refusal() is None
    write(WELCOME + (" " + WELCOME_IMAGES if takes_images else "") + "\n")
    history: list[dict] = []
    attached: list[dict] = []  # image parts for the next message
    images: dict[str, object] = {}  # path -> the image read when it was attached
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
        if query.split(maxsplit=1)[0] == IMAGE_COMMAND:
            write(attach_image(engine, query[len(IMAGE_COMMAND) :].strip(), attached, images) + "\n")
            continue
        content = attached + [{"type": "text", "text": query}] if attached else query
        messages = (
            ([{"role": "system", "content": system}] if system else [])
            + history
            + [{"role": "user", "content": content}]
        )
        try:
            prompt_ids, media = engine.chat_inputs(messages, read_image=lambda part, where: images[part["path"]])
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


def attach_image(engine: ChatEngine, path: str, attached: list[dict], images: dict) -> str:
    """Read the image at `path` (local files only) for the next message; what to tell the user."""
    from lathe.llm.multimodal.images import open_image

    refusal = engine.image_refusal()
    if refusal is not None:
        return f"(not attached: {refusal})"
    try:
        image = open_image(path, where="/image")
        image.load()
    except Exception as error:  # noqa: BLE001 (a missing, remote or unreadable file: say so, keep chatting)
        return f"(not attached: {error})"
    images[path] = image
    attached.append({"type": "image_url", "path": path})
    return f"(image {path} attached, {image.width}x{image.height}: it goes with your next message)"


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
