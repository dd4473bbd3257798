"""The Chat tab: one model loaded with lathe chat's engine (its template, adapters, generation keys), replaced
when the page asks for another model or adapter, answers streamed piece by piece."""

from __future__ import annotations

import queue
import threading

from lathe.llm.webui.paths import check_config_paths

MAX_NEW_TOKENS = 1024  # a request may not ask for more (every request is bounded)
MAX_MESSAGES = 200
CHAT_KEYS = (
    "model_name_or_path",
    "adapter_name_or_path",
    "template",
    "finetuning_type",
    "infer_dtype",
)


class ChatSession:
    def __init__(self, root: str):
        self.root = root
        self.engine = None
        self.loaded: dict | None = None
        self._lock = threading.Lock()

    def load(self, form: dict, whole_config: bool = False) -> dict:
        """Load (or switch to) the model + adapters the form names; the previous one is released. The page
        sends CHAT_KEYS only; `lathe webchat CONFIG` passes its whole config (`whole_config`: generation keys
        and all, as `lathe chat CONFIG` reads them); paths are checked under the root either way."""
        from lathe.llm.inference.config import parse_infer_config
        from lathe.llm.inference.engine import ChatEngine

        keys = form if whole_config else CHAT_KEYS
        values = {key: form[key] for key in keys if form.get(key) not in (None, "")}
        if not whole_config and form.get("trust_remote_code") not in (None, "", False, "false"):
            if form.get("confirm_remote_code") is not True:
                raise ValueError(
                    "trust_remote_code runs Python code from the model folder: confirm it (confirm_remote_code) to go on."
                )
            values["trust_remote_code"] = True
        if not values.get("model_name_or_path"):
            raise ValueError("model_name_or_path is required.")
        values = check_config_paths(self.root, values)
        with self._lock:
            self.engine = None  # free the old model before loading the next
            config = parse_infer_config(values, [], command="chat")
            self.engine = ChatEngine.from_config(config, max_batch=1)
            self.loaded = values
        return {"loaded": values, "template": self.engine.template.name}

    @staticmethod
    def media_reader():
        """read_media for one request: `lathe api`'s reader and bounds, no local paths from the browser."""
        from lathe.llm.inference.image_urls import ImageRules
        from lathe.llm.inference.requests import media_reader

        return media_reader(ImageRules(media_dir=None))

    def stream(self, messages: list, max_new_tokens=None, temperature=None):
        """The answer's text as it is decoded (the engine's worker thread fills a queue); the request is checked
        and submitted here, before the reply starts."""
        from lathe.llm.inference.engine import InvalidRequest

        engine = self.engine
        if engine is None:
            raise ValueError("load a model first.")
        if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
            raise InvalidRequest(f"messages: expected 1 to {MAX_MESSAGES} messages.")
        limit = min(int(max_new_tokens or engine.generating.max_new_tokens or 256), MAX_NEW_TOKENS)
        # images, videos and audio come as `image_url` / `video_url` / `audio_url` parts holding data URLs (the page
        # reads the chosen file), read as `lathe api` reads them; no local paths from the browser (media_dir None)
        prompt_ids, media = engine.chat_inputs(messages, read_media=self.media_reader())
        params = engine.check_length(
            prompt_ids,
            engine.default_params(
                max_new_tokens=limit, temperature=None if temperature is None else float(temperature)
            ),
        )
        pieces: queue.Queue = queue.Queue()
        done = object()
        job = engine.submit(prompt_ids, params, on_text=pieces.put, on_done=lambda *_: pieces.put(done), media=media)
        return self.answer(pieces, job, done)

    @staticmethod
    def answer(pieces: queue.Queue, job, done):
        """The answer's pieces as the worker thread queues them (a request the engine refused has raised before
        the reply started: a 400 naming it)."""
        while True:
            try:
                piece = pieces.get(timeout=600)
            except queue.Empty:
                return
            if piece is done:
                break
            yield piece
        if job.error is not None:
            yield f"\n[error: {job.error}]"
