"""The images, videos and audio an API request sends (OpenAI `image_url` content parts; LLaMA-Factory's
`video_url` and `audio_url`), read safely: base64 data URLs, and local files (paths or file:// URLs) only inside the
folder the server was started with (--media_dir, LLaMA-Factory's SAFE_MEDIA_PATH); remote http(s) URLs are refused
(lathe reads no network). Every failure is an InvalidRequest (a 400 naming the part); an image's size and a video's
frame size are checked before anything is decoded, a file's byte size before it is read."""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from io import BytesIO
from urllib.parse import unquote, urlparse

from lathe.llm.inference.engine import InvalidRequest

DATA_URLS = {
    kind: re.compile(rf"^data:{kind}/[A-Za-z0-9.+-]+;base64,", re.IGNORECASE) for kind in ("image", "video", "audio")
}
NOUNS = {"image": "image", "video": "video", "audio": "audio file"}


@dataclass
class ImageRules:
    media_dir: str | None = None  # local files only below this folder; None: no local files at all
    max_images: int = 16  # per request
    max_image_pixels: int = (
        2**25
    )  # width x height, checked before decoding (a small PNG can hold gigapixels); videos' frames too
    max_image_bytes: int = 32 * 2**20  # a local file's size
    max_videos: int = 4  # per request
    max_video_bytes: int = 64 * 2**20
    max_audios: int = 8  # per request
    max_audio_bytes: int = 32 * 2**20


def read_image_url(part, rules: ImageRules, where: str):
    """The RGB image that an `image_url` content part names (its "image_url" is {"url": ...} or the URL itself)."""
    data, param, what = _part_bytes(part, "image", rules.max_image_bytes, rules, where)
    return _decoded(data, rules, param, what)


def read_video_url(part, rules: ImageRules, where: str) -> bytes:
    """The bytes of the video a `video_url` part names, once its stream is found readable and its frames no larger
    than max_image_pixels (the family's plugin then samples the frames as training does)."""
    data, param, what = _part_bytes(part, "video", rules.max_video_bytes, rules, where)
    width, height = probe_stream(data, "video", param, what)
    if width * height > rules.max_image_pixels:
        raise InvalidRequest(
            f"{param}: the video's frames are {width}x{height} pixels; at most {rules.max_image_pixels} "
            "pixels are accepted.",
            param=param,
        )
    return data


def read_audio_url(part, rules: ImageRules, where: str) -> bytes:
    """The bytes of the audio an `audio_url` part names, once FFmpeg finds an audio stream in them."""
    data, param, what = _part_bytes(part, "audio", rules.max_audio_bytes, rules, where)
    probe_stream(data, "audio", param, what)
    return data


def _part_bytes(part, kind: str, max_bytes: int, rules: ImageRules, where: str) -> tuple[bytes, str, str]:
    """(the bytes, the part's param, how to name them) of the data URL or media_dir file that a `<kind>_url` part
    names."""
    key = f"{kind}_url"
    value = part.get(key) if isinstance(part, dict) else None
    url = value.get("url") if isinstance(value, dict) else value
    param = f"{where}.{key}"
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f'{where} must be {{"type": "{key}", "{key}": {{"url": ...}}}}.', param=param)
    if url.startswith("data:"):
        return _data_url_bytes(url, kind, param), param, "the data URL"
    scheme = urlparse(url).scheme.lower()
    if scheme in ("http", "https"):
        raise InvalidRequest(
            f"{param}: {url[:80]!r} is a remote URL; this server reads no network: send the {NOUNS[kind]} as a data "
            f"URL (data:{kind}/<type>;base64,...) or as a file under its media folder.",
            param=param,
        )
    if scheme == "file":
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidRequest(f"{param}: a file:// URL must name a file on this machine.", param=param)
        url = unquote(parsed.path)
    elif len(scheme) > 1:  # ftp:, s3:, ... (one letter is a Windows drive)
        raise InvalidRequest(f"{param}: {scheme}: URLs are not supported: send a data URL or a file path.", param=param)
    return _file_bytes(url, rules, param, max_bytes), param, repr(url)


def _data_url_bytes(url: str, kind: str, param: str) -> bytes:
    if not DATA_URLS[kind].match(url):
        raise InvalidRequest(f"{param}: a data URL must be data:{kind}/<type>;base64,<data>.", param=param)
    try:
        return base64.b64decode(url.split(",", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{param}: the data URL's base64 is not valid.", param=param) from None


def _file_bytes(path: str, rules: ImageRules, param: str, max_bytes: int) -> bytes:
    """A file inside media_dir (symbolic links resolved first, so none leads out of it); where a refused file
    lies, or whether it exists, is never told."""
    if rules.media_dir is None:
        raise InvalidRequest(
            f"{param}: this server reads no local files: send a data URL, or start lathe api with "
            "--media_dir DIR to allow the files in DIR.",
            param=param,
        )
    if "\0" in path:
        raise InvalidRequest(f"{param}: a file path cannot hold a NUL character.", param=param)
    root = os.path.realpath(rules.media_dir)
    full = os.path.realpath(os.path.join(root, path))  # a relative path is relative to media_dir
    if os.path.commonpath([root, full]) != root:
        raise InvalidRequest(f"{param}: files outside the server's media folder are not served.", param=param)
    if not os.path.isfile(full):
        raise InvalidRequest(f"{param}: no file {path!r} in the server's media folder.", param=param)
    if os.path.getsize(full) > max_bytes:
        raise InvalidRequest(f"{param}: the file is larger than {max_bytes} bytes.", param=param)
    with open(full, "rb") as handle:
        return handle.read()


def probe_stream(data: bytes, kind: str, param: str, what: str) -> tuple[int, int]:
    """(width, height) of the first `kind` stream of the container in `data` (0, 0 for audio): its header read by
    FFmpeg, no frame decoded."""
    from lathe.llm.multimodal.audio import import_av

    av = import_av()
    try:
        with av.open(BytesIO(data), "r") as container:
            stream = next((item for item in container.streams if item.type == kind), None)
            if stream is None:
                raise InvalidRequest(f"{param}: {what} holds no {kind} stream.", param=param)
            return (stream.width, stream.height) if kind == "video" else (0, 0)
    except InvalidRequest:
        raise
    except Exception as error:  # noqa: BLE001 (FFmpeg raises many kinds for bad data; each is the client's 400)
        raise InvalidRequest(
            f"{param}: {what} is not a readable {NOUNS[kind]} ({type(error).__name__}).", param=param
        ) from None


def _decoded(data: bytes, rules: ImageRules, param: str, what: str):
    from PIL import Image

    try:
        image = Image.open(BytesIO(data))
        if image.width * image.height > rules.max_image_pixels:
            raise InvalidRequest(
                f"{param}: the image is {image.width}x{image.height} pixels; at most {rules.max_image_pixels} "
                "pixels are accepted.",
                param=param,
            )
        return image.convert("RGB")  # decodes it; GIF and the like: the first frame
    except InvalidRequest:
        raise
    except Exception as error:  # noqa: BLE001 (PIL raises many kinds for bad data; each is the client's 400)
        raise InvalidRequest(
            f"{param}: {what} is not a readable image ({type(error).__name__}).", param=param
        ) from None
