"""The chat engine of `lathe chat` and `lathe api`: OpenAI-style messages rendered by the training
template, and a scheduler that decodes concurrent requests together.

Messages: an optional leading system message, then user (or tool results) and assistant turns
alternating, ending on a user or tool turn; content is a string or a list of text parts (and, for a
vision-language model, image_url parts in user turns: lathe/llm/inference/vision.py encodes them). They map
onto the template's roles as in training (tool -> observation; an assistant's tool_calls -> a
function message), so the prompt is token for token what the model saw in training.

Scheduling: requests queue; a worker thread takes up to `max_batch` of them and decodes them as one
batch (lathe/llm/inference/generation.py). A request that arrives meanwhile waits for the next batch.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import dataclass

from lathe.llm.inference.generation import BatchGenerator, SamplingParams, Sequence
from lathe.llm.multimodal.images import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

logger = logging.getLogger(__name__)

ROLE_NAMES = ("system", "user", "assistant", "tool")


class InvalidRequest(ValueError):
    """A request the engine cannot serve; `param` names the offending field (OpenAI's error.param)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


# OpenAI-style media content parts (LLaMA-Factory's api/protocol.py types) -> the kind and its placeholder
MEDIA_PARTS = {"image_url": ("image", IMAGE_PLACEHOLDER), "video_url": ("video", VIDEO_PLACEHOLDER)}
MEDIA_PARTS["audio_url"] = ("audio", AUDIO_PLACEHOLDER)
PLURALS = {"image": "images", "video": "videos", "audio": "audio"}


def message_text(content, where: str, media: list | None = None) -> str:
    """The text of a message's content. With `media` (a list), each `image_url` / `video_url` / `audio_url` part
    becomes its `<image>` / `<video>` / `<audio>` placeholder and (its place, the part) is appended to `media`;
    without, media parts are refused."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if media is not None and kind in MEDIA_PARTS:
                media.append((f"{where}.content[{index}]", part))
                parts.append(MEDIA_PARTS[kind][1])
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kinds = "a text part ({'type': 'text', 'text': ...})"
                raise InvalidRequest(
                    f"{where}.content[{index}] must be "
                    + (
                        f"{kinds} or an image_url, video_url or audio_url part."
                        if media is not None
                        else f"{kinds}; images, videos and audio are not supported."
                    ),
                    param=f"{where}.content",
                )
            parts.append(part["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise InvalidRequest(f"{where}.content must be a string or a list of content parts.", param=f"{where}.content")


def to_template_messages(messages, media: list | None = None) -> tuple[list[dict], str | None]:
    """OpenAI messages -> (the template's turns, the system text); media parts go to `media` (message_text)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list.", param="messages")
    system, turns = None, []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where} must be an object with role and content.", param=where)
        role = message.get("role")
        if role not in ROLE_NAMES:
            raise InvalidRequest(f"{where}.role {role!r} is not one of {', '.join(ROLE_NAMES)}.", param=f"{where}.role")
        text = message_text(message.get("content"), where, media if role == "user" else None)
        if role == "system":
            if turns:
                raise InvalidRequest(f"{where}: a system message must come before the conversation.", param=where)
            system = text if system is None else system + "\n" + text
            continue
        expected_user = len(turns) % 2 == 0
        if (role in ("user", "tool")) != expected_user:
            raise InvalidRequest(
                f"{where}.role is {role!r}, but turns must alternate user (or tool) and assistant, starting with user.",
                param=f"{where}.role",
            )
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])}
                for call in _tool_calls(message["tool_calls"], where)
            ]
            turns.append({"role": "function", "content": json.dumps(calls, ensure_ascii=False)})
        else:
            turns.append(
                {"role": {"user": "user", "tool": "observation", "assistant": "assistant"}[role], "content": text}
            )
    if len(turns) % 2 == 0:
        raise InvalidRequest(
            "The last message must be from the user (or a tool result): there is nothing to answer.", param="messages"
        )
    return turns, system


def _tool_calls(calls, where: str) -> list:
    try:
        for call in calls:
            json.loads(call["function"]["arguments"])
            str(call["function"]["name"])
    except (TypeError, KeyError, ValueError):
        raise InvalidRequest(
            f"{where}.tool_calls must be a list of {{'function': {{'name', 'arguments' (JSON)}}}}.",
            param=f"{where}.tool_calls",
        ) from None
    return calls


@dataclass
class Job:
    sequence: Sequence
    done: threading.Event
    on_done: object = None  # called with the job, from the worker thread, when it has finished
    error: BaseException | None = None


class ChatEngine:
    def __init__(
        self,
        model,
        tokenizer,
        template,
        generating,
        max_batch: int = 16,
        context_length: int | None = None,
        image_encoder=None,
    ):
        self.model, self.tokenizer, self.template, self.generating = model, tokenizer, template, generating
        self.stop_token_ids = template.get_stop_token_ids(tokenizer)
        self.generator = BatchGenerator(model, tokenizer, self.stop_token_ids, generating.skip_special_tokens)
        self.max_batch = max_batch
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.context_length = context_length or getattr(text_config, "max_position_embeddings", None) or 2048
        # lathe/llm/inference/vision.py's ImageEncoder; None: images are refused as for a text-only model
        self.image_encoder = image_encoder
        self._queue: queue.Queue[Job] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config, **kwargs) -> "ChatEngine":
        from lathe.llm.inference.loading import load_for_inference
        from lathe.llm.inference.vision import load_image_encoder

        model, tokenizer, template = load_for_inference(config)
        encoder = load_image_encoder(config, model, template, tokenizer)
        return cls(model, tokenizer, template, config.generating, image_encoder=encoder, **kwargs)

    # ---- prompts ----------------------------------------------------------------------------------
    def chat_prompt(self, messages, tools=None) -> list[int]:
        """The prompt of a text conversation (media parts are refused: chat_inputs takes them)."""
        return self.chat_inputs(messages, tools)[0]

    def chat_inputs(self, messages, tools=None, read_media=None) -> tuple[list[int], dict]:
        """(prompt ids, the media's tensors) of a conversation. With `read_media(part, where)` (which returns the
        part's image, video or audio), the user messages' `image_url` / `video_url` / `audio_url` parts are read and
        encoded as training encodes them."""
        from lathe.llm.templates.tools import InvalidMessage

        parts = [] if read_media is not None else None
        turns, system = to_template_messages(messages, parts)
        media = {}
        if parts:
            items: dict[str, list] = {}
            for where, part in parts:
                kind = MEDIA_PARTS[part["type"]][0]
                refusal = self.media_refusal(kind)
                if refusal is not None:
                    raise InvalidRequest(refusal, param=where)
                items.setdefault(kind, []).append(read_media(part, where))
            turns, media = self.encode_media(turns, items)
        tools_text = json.dumps(tools, ensure_ascii=False) if tools else None
        try:
            prompt_ids, _ = self.template.encode_oneturn(
                self.tokenizer, turns + [{"role": "assistant", "content": ""}], system=system, tools=tools_text
            )
        except InvalidMessage as error:
            raise InvalidRequest(str(error), param="messages") from None
        if media:
            prompt_ids, media = self.image_encoder.finish(prompt_ids, media, self.model)
        return prompt_ids, media

    def image_refusal(self) -> str | None:
        """Why this model takes no images, or None."""
        return self.media_refusal("image")

    def media_refusal(self, kind: str) -> str | None:
        """Why this model takes no `kind` ("image", "video", "audio") input, or None."""
        if self.image_encoder is None:
            return f"This model takes no {PLURALS[kind]}."
        return self.image_encoder.refusal_of(kind)

    def encode_media(self, turns: list[dict], items: dict[str, list]) -> tuple[list[dict], dict]:
        try:
            return self.image_encoder.encode(
                turns, items.get("image", []), videos=items.get("video", []), audios=items.get("audio", [])
            )
        except ValueError as error:
            raise InvalidRequest(str(error), param="messages") from None

    def text_prompt(self, prompt) -> list[int]:
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequest("prompt must be a non-empty string.", param="prompt")
        return list(self.tokenizer(prompt)["input_ids"])

    def default_params(self, **overrides) -> SamplingParams:
        g = self.generating
        values = dict(
            max_new_tokens=g.max_new_tokens,
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            do_sample=g.do_sample,
            repetition_penalty=g.repetition_penalty,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return SamplingParams(**values)

    def check_length(self, prompt_ids: list[int], params: SamplingParams) -> SamplingParams:
        """A prompt that fills the context is an error; otherwise max_new_tokens is cut to what fits."""
        room = self.context_length - len(prompt_ids)
        if room <= 0:
            raise InvalidRequest(
                f"The prompt is {len(prompt_ids)} tokens; the model's context is {self.context_length}.",
                param="messages",
                code="context_length_exceeded",
            )
        params.max_new_tokens = min(params.max_new_tokens, room)
        return params

    # ---- generation -------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], params: SamplingParams, on_text=None, media=None) -> Sequence:
        """Queue one sequence and wait for it (it may be decoded together with others)."""
        job = self.submit(prompt_ids, params, on_text, media=media)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.sequence

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def submit(self, prompt_ids: list[int], params: SamplingParams, on_text=None, on_done=None, media=None) -> Job:
        job = Job(Sequence(list(prompt_ids), params, on_text, media=media or None), threading.Event(), on_done)
        self._queue.put(job)
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="lathe-generate", daemon=True)
                self._worker.start()
        return job

    def _serve(self) -> None:
        while True:
            jobs = [self._queue.get()]
            while len(jobs) < self.max_batch:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self.generator.generate([job.sequence for job in jobs])
            except BaseException as error:  # handed to each waiting request; the worker goes on
                logger.exception("Generation failed for a batch of %d request(s).", len(jobs))
                for job in jobs:
                    job.error = error
            for job in jobs:
                job.done.set()
                if job.on_done is not None:
                    job.on_done(job)
