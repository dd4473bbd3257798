"""The Gemma 4 family as LLaMA-Factory 0.9.5 encodes it: the gemma4 template takes images and videos, gemma4n also
audio (lathe's gemma4n family, gemma4n.py). `<image>` becomes `<|image>` + the image processor's soft-token count of
`<|image|>` + `<image|>`; `<video>` one such run of `<|video|>` per sampled frame, each after its "mm:ss" time and
joined by spaces; `<audio>` `<|audio>` + `<|audio|>` per audio-encoder frame + `<audio|>`. The collator adds the
processors' tensors and mm_token_type_ids (1 image, 2 video, 3 audio soft tokens, 0 elsewhere).

The tokens and counts are read from the tokenizer and the processor's parts, not from Gemma4Processor itself:
transformers builds that only with torchvision (its video processor), and an image or audio row needs none."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs
from lathe.llm.multimodal.images import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN = "<|image|>", "<|video|>", None
COMPOSITES = {  # as LLaMA-Factory registers them
    "gemma4": composite(
        vision=("vision_tower", "audio_tower"),
        projector=("model.embed_vision", "model.embed_audio"),
        lora_conflict=("per_layer_projection_norm",),
    )
}
TOKEN_TYPES = {"image": 1, "video": 2, "audio": 3}  # transformers' mm_token_type_ids
AUDIO_SEQ_LENGTH = 750  # Gemma4Processor's default cap on an audio's soft tokens


class Gemma4Parts:
    """What the family reads of a Gemma4Processor, from the tokenizer and the processor (or the parts of it lathe
    loaded without torchvision: the image processor alone, or with the feature extractor)."""

    def __init__(self, processor, tokenizer):
        self.processor = processor
        parts = ("image_processor", "video_processor", "feature_extractor")
        self.image_processor, self.video_processor, self.feature_extractor = (
            getattr(processor, name, None) for name in parts
        )
        if self.image_processor is None and hasattr(processor, "preprocess"):  # the image processor alone
            self.image_processor = processor
        self.tokenizer = tokenizer
        self.audio_seq_length = getattr(processor, "audio_seq_length", AUDIO_SEQ_LENGTH)
        named = ("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token")
        for name in named:
            setattr(self, name, getattr(processor, name, None) or getattr(tokenizer, name, None))
        self.video_token = VIDEO_TOKEN  # Gemma4Processor adds it to the tokenizer (not in the tokenizer's names)
        missing = [name for name in ("image_token", "boi_token", "eoi_token") if not getattr(self, name)]
        if missing:
            raise ValueError(
                f"the gemma4 family reads the tokenizer's {', '.join(missing)} (Gemma 4's tokenizer_config.json "
                "names them): this tokenizer has none"
            )

    def token_ids(self) -> dict[str, int]:
        """Soft token id -> its mm_token_type_ids value."""
        ids = {}
        for kind, token in (("image", self.image_token), ("video", self.video_token), ("audio", self.audio_token)):
            if token is not None:
                ids[self.tokenizer.convert_tokens_to_ids(token)] = TOKEN_TYPES[kind]
        return ids


def parts_of(processor) -> Gemma4Parts:
    if not isinstance(processor, Gemma4Parts):
        raise TypeError("the gemma4 family's functions take Gemma4Parts(processor, tokenizer)")
    return processor


def audio_token_count(samples: int, extractor, cap: int) -> int:
    """Audio soft tokens of a waveform of `samples` samples: the feature extractor's mel frames (a half-frame of
    padding on the left, frames of frame_length + 1 every hop_length), then the encoder's two stride-2 convolutions
    (kernel 3, padding 1), capped at audio_seq_length (Gemma4Processor._compute_audio_num_tokens)."""
    frames = (samples + extractor.frame_length // 2 - (extractor.frame_length + 1)) // extractor.hop_length + 1
    if frames <= 0:
        return 0
    for _ in range(2):
        frames = (frames + 2 - 3) // 2 + 1
    return min(frames, cap)


def video_inputs(videos, processor, settings: MediaSettings) -> dict:
    """The video processor's tensors for the sampled frames, with LLaMA-Factory's metadata (the frames already
    sampled: do_sample_frames off; timestamps frames_indices / video_fps)."""
    from lathe.llm.multimodal.common import video_processor_of

    if not videos:
        return {}
    video_processor = video_processor_of(processor)
    metadata = [
        {
            "fps": settings.video_fps,
            "duration": video.duration,
            "total_num_frames": len(video.frames),
            "frames_indices": video.frames_indices,
        }
        for video in videos
    ]
    return dict(
        video_processor(
            videos=[video.frames for video in videos],
            video_metadata=metadata,
            return_tensors="pt",
            return_metadata=True,
            do_sample_frames=False,
        )
    )


def process_messages(messages, images, audios, processor, settings: MediaSettings, videos=()) -> list[dict]:
    """Each `<image>`, `<video>` and `<audio>` replaced by its run of soft tokens (counts as the processors give)."""
    parts = parts_of(processor)
    image_counts = []
    if images:
        image_counts = [int(n) for n in image_processor_inputs(images, parts, settings)["num_soft_tokens_per_image"]]
    video_runs = []
    if videos:
        per_frame = video_inputs(videos, parts, settings)["num_soft_tokens_per_video"]
        for video, count in zip(videos, per_frame):
            frame = f"{parts.boi_token}{parts.video_token * int(count)}{parts.eoi_token}"
            stamps = [index / settings.video_fps for index in video.frames_indices]
            video_runs.append(" ".join(f"{int(t // 60):02d}:{int(t % 60):02d} {frame}" for t in stamps))
    audio_runs = []
    if audios:
        extractor = parts.feature_extractor
        if extractor is None or parts.audio_token is None:
            raise ValueError(
                "gemma4n audio needs the processor's feature extractor and the tokenizer's audio_token, "
                "boa_token and eoa_token (Gemma 4's processor_config.json / tokenizer_config.json)"
            )
        for audio in audios:  # counted from the waveform (LLaMA-Factory 0.9.5 counts a file's path characters)
            count = audio_token_count(len(audio), extractor, parts.audio_seq_length)
            audio_runs.append(f"{parts.boa_token}{parts.audio_token * count}{parts.eoa_token}")
    runs = {
        IMAGE_PLACEHOLDER: iter(f"{parts.boi_token}{parts.image_token * n}{parts.eoi_token}" for n in image_counts),
        VIDEO_PLACEHOLDER: iter(video_runs),
        AUDIO_PLACEHOLDER: iter(audio_runs),
    }
    expanded = []
    for message in messages:
        content = message["content"]
        # LLaMA-Factory expands a message's images, then its videos, then its audio (each kind in order)
        for placeholder, replacements in runs.items():
            pieces = content.split(placeholder)
            content = pieces[0] + "".join(next(replacements) + piece for piece in pieces[1:])
        expanded.append({**message, "content": content})
    return expanded


def media_tokens(processor) -> tuple[str, ...]:
    """The runs' tokens: begin and end of an image (and of a video frame), the soft tokens, and audio's."""
    parts = parts_of(processor)
    tokens = (parts.boi_token, parts.image_token, parts.video_token, parts.eoi_token)
    if parts.audio_token is not None:
        tokens += (parts.boa_token, parts.audio_token, parts.eoa_token)
    return tokens


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def mm_token_type_ids(batch_ids: list[list[int]], processor) -> list[list[int]]:
    """Each row's token types: 1 image, 2 video, 3 audio soft token, else 0 (Gemma4Processor's)."""
    types = parts_of(processor).token_ids()
    return [[types.get(token, 0) for token in ids] for ids in batch_ids]


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings, videos=()) -> dict:
    """The image processor's pixel_values and image_position_ids, the video processor's pixel_values_videos,
    video_position_ids and num_frames_per_video, the feature extractor's input_features and input_features_mask
    (padded to its 30-second window, as LLaMA-Factory asks), and the rows' mm_token_type_ids. The soft-token counts
    and video metadata are dropped, as LLaMA-Factory drops them (no model input)."""
    parts = parts_of(processor)
    inputs = image_processor_inputs(images, parts, settings)
    inputs.update(video_inputs(list(videos), parts, settings))
    if audios:
        features = parts.feature_extractor(list(audios), padding="max_length", return_tensors="pt")
        inputs.update(dict(features))
    for key in ("num_soft_tokens_per_image", "num_soft_tokens_per_video", "video_metadata"):
        inputs.pop(key, None)
    inputs["mm_token_type_ids"] = mm_token_type_ids(batch_ids, parts)
    return inputs


class Gemma4Plugin(ModulePlugin):
    """LLaMA-Factory's Gemma 4 plugin (gemma4 template): the functions above as the pipeline's FamilyPlugin steps."""

    name = "gemma4"
    missing = {"audio": "the gemma4 template takes none; Gemma 4 audio is the gemma4n template's"}

    def __init__(self, processor, tokenizer, settings: MediaSettings | None = None):
        parts = processor if isinstance(processor, Gemma4Parts) else Gemma4Parts(processor, tokenizer)
        super().__init__(parts, tokenizer, settings or MediaSettings())

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids=None) -> dict:
        """mm_token_type_ids padded to the batch's length, as the text was (LLaMA-Factory pads them to its longest
        row only, shorter than input_ids under pad_to_multiple_of, which Gemma 4's bidirectional-vision mask cannot
        take)."""
        from lathe.train.data.padding import get_padding_side, pad_rows

        inputs = super().batch_inputs(media_rows, batch, model, row_ids)
        length, side = batch["input_ids"].shape[-1], get_padding_side(self.tokenizer)
        inputs["mm_token_type_ids"] = pad_rows(inputs["mm_token_type_ids"], 0, length, side)
        return inputs
