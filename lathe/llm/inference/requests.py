"""OpenAI request bodies -> what the engine needs, checked field by field: every mistake becomes an
InvalidRequest naming the field (a 400 with OpenAI's error body), never a crash in the server."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from lathe.llm.inference.engine import InvalidRequest
from lathe.llm.inference.generation import SamplingParams
from lathe.llm.inference.image_urls import ImageRules, read_audio_url, read_image_url, read_video_url

MAX_STOP_STRINGS = 4  # OpenAI's limit
JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+"', re.DOTALL)  # a JSON string literal, escapes included


@dataclass
class Limits:
    max_tokens: int  # the largest max_tokens a request may ask for
    max_n: int = 8  # choices per request
    max_body_bytes: int = 1_000_000
    max_json_depth: int = 64  # nesting of objects and lists; OpenAI bodies, tool schemas included, need far fewer
    images: ImageRules = field(default_factory=ImageRules)  # which image / video / audio parts are read, how large


def parse_body(raw: bytes, limits: Limits):
    """The request body as JSON, its size and nesting depth checked before it is parsed: Python's parser
    recurses once per level, so 50,000 nested lists would end in a RecursionError, not a 400."""
    if len(raw) > limits.max_body_bytes:
        raise InvalidRequest(
            f"The request body is larger than {limits.max_body_bytes} bytes.", code="request_too_large"
        )
    depth = json_depth(raw)
    if depth > limits.max_json_depth:
        raise InvalidRequest(
            f"The request body nests JSON {depth} levels deep; at most {limits.max_json_depth} are allowed."
        )
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"The request body is not valid JSON: {error}") from None
    except RecursionError:  # cannot happen within max_json_depth; a 400 all the same
        raise InvalidRequest("The request body nests JSON too deeply.") from None
    try:  # "\ud800" is valid JSON but no character: the tokenizer could not take it
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidRequest(
            f"The request body holds {error.object[error.start]!r}, a lone surrogate that is not a Unicode character."
        ) from None
    return body


def json_depth(raw: bytes) -> int:
    """The deepest nesting of [ and { outside string literals (of valid JSON; for invalid JSON an estimate
    that only decides whether to try parsing it)."""
    import numpy as np

    structure = np.frombuffer(JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = np.isin(structure, (ord("["), ord("{"))).astype(np.int32) - np.isin(structure, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def _number(body: dict, name: str, low: float, high: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise InvalidRequest(f"{name} must be {kind}, got {value!r}.", param=name)
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}, got {value}.", param=name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {value!r}.", param=name)
    return value


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(
            f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them.", param="stop"
        )
    return stops


@dataclass
class ParsedRequest:
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    with_tools: bool = False  # tools were offered: a reply in the template's tool-call format is a tool call
    media: dict | None = None  # the request's images' tensors (chat requests with image_url parts)


def parse_common(body: dict, engine, limits: Limits) -> ParsedRequest:
    """The fields /v1/chat/completions and /v1/completions share."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise InvalidRequest("model must be a string.", param="model")
    if _flag(body, "logprobs") or body.get("logit_bias"):
        raise InvalidRequest(
            "logprobs and logit_bias are not supported.", param="logprobs" if body.get("logprobs") else "logit_bias"
        )
    max_tokens = _number(body, "max_completion_tokens", 1, float("inf"), integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", 1, float("inf"), integer=True)
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise InvalidRequest(
            f"max_tokens {max_tokens} is above this server's limit of {limits.max_tokens}.", param="max_tokens"
        )
    temperature = _number(body, "temperature", 0, 2)
    top_p = _number(body, "top_p", 0, 1)
    if top_p == 0:
        raise InvalidRequest("top_p must be above 0.", param="top_p")
    n = _number(body, "n", 1, limits.max_n, integer=True) or 1
    seed = _number(body, "seed", -(2**63), 2**63 - 1, integer=True)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool)
    ):
        raise InvalidRequest('stream_options must be an object like {"include_usage": true}.', param="stream_options")
    if options is not None and not stream:
        raise InvalidRequest("stream_options is only allowed with stream: true.", param="stream_options")
    params = engine.default_params(
        max_new_tokens=min(max_tokens or engine.generating.max_new_tokens, limits.max_tokens),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=_stop(body),
        presence_penalty=_number(body, "presence_penalty", -2, 2) or 0.0,
        frequency_penalty=_number(body, "frequency_penalty", -2, 2) or 0.0,
    )
    if temperature == 0:
        params.do_sample = False
    elif temperature is not None:
        params.do_sample = True  # the client asked for sampling at this temperature
    return ParsedRequest(params, n, stream, bool((options or {}).get("include_usage", False)))


def _check_tool_call_arguments(messages, limits: Limits) -> None:
    """Tool-call arguments are JSON inside a string, unseen by parse_body's depth check: bound them too."""
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if (
                isinstance(arguments, str)
                and json_depth(arguments.encode("utf-8", "surrogatepass")) > limits.max_json_depth
            ):
                raise InvalidRequest(
                    f"messages[{index}].tool_calls: the arguments nest JSON more than "
                    f"{limits.max_json_depth} levels deep.",
                    param=f"messages[{index}].tool_calls",
                )


def parse_chat(body: dict, engine, limits: Limits) -> tuple[list[int], ParsedRequest]:
    parsed = parse_common(body, engine, limits)
    _check_tool_call_arguments(body.get("messages"), limits)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidRequest("tools must be a list of tool definitions.", param="tools")
    functions = [tool.get("function", tool) for tool in tools or [] if isinstance(tool, dict)]
    if functions and parsed.stream:
        # a reply is known to be a tool call only once it is complete (as LLaMA-Factory, which refuses too)
        raise InvalidRequest("stream: true with tools is not supported: ask without streaming.", param="stream")
    parsed.with_tools = bool(functions)
    prompt_ids, parsed.media = engine.chat_inputs(
        body.get("messages"), tools=functions or None, read_media=media_reader(limits.images)
    )
    engine.check_length(prompt_ids, parsed.params)
    return prompt_ids, parsed


def media_reader(rules: ImageRules):
    """read_media for engine.chat_inputs: each image_url / video_url / audio_url part read under `rules`, at most
    max_images / max_videos / max_audios of each kind per request."""
    kinds = {
        "image_url": ("images", rules.max_images, read_image_url),
        "video_url": ("videos", rules.max_videos, read_video_url),
        "audio_url": ("audio files", rules.max_audios, read_audio_url),
    }
    counts = dict.fromkeys(kinds, 0)

    def read(part, where: str):
        noun, limit, reader = kinds[part["type"]]
        counts[part["type"]] += 1
        if counts[part["type"]] > limit:
            raise InvalidRequest(f"{where}: at most {limit} {noun} per request.", param=where)
        return reader(part, rules, where)

    return read


def parse_completion(body: dict, engine, limits: Limits) -> tuple[list[int], ParsedRequest]:
    parsed = parse_common(body, engine, limits)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # a one-prompt batch
    prompt_ids = engine.text_prompt(prompt)
    try:
        engine.check_length(prompt_ids, parsed.params)
    except InvalidRequest as error:
        raise InvalidRequest(str(error), param="prompt", code=error.code) from None
    return prompt_ids, parsed
