"""The MiniCPM-V family (minicpm_v template: images) and MiniCPM-o (minicpm_o: images and audio), as LLaMA-Factory
0.9.5's MiniCPMVPlugin encodes them with the model's own processor.

MiniCPM-V's processor and tokenizer are the model folder's code (openbmb's MiniCPMVImageProcessor, MiniCPMVTokenizer,
MiniCPMOProcessor; not in transformers): they load only with trust_remote_code: true, and a run without them stops
naming that. What they give, and what this module does with it:
- each `<image>` becomes the image processor's get_slice_image_placeholder(size, k, max_slice_nums, use_image_id):
  `<image_id>k</image_id>` (k numbers the row's images) + the `<image>...</image>` run of the whole image + a
  `<slice>...</slice>` run per slice of its grid; the sizes are those of the images fitted into the pixel budget;
- each `<audio>` (MiniCPM-o) becomes the processor's placeholder from audio_feature_extract (`<|audio_start|>` ...
  `<|audio_end|>` per chunk);
- the collator gives the model one `data` dict (its forward takes `data`): the padded text, position_ids 0..n-1
  per row, the image processor's per-row pixel_values / image_sizes / tgt_sizes (images grouped by row),
  image_bound (per row: after each `<image>` / `<slice>`, each `</image>` / `</slice>`, in the unpadded row), and for
  MiniCPM-o audio_features, audio_feature_lens (per row), audio_bounds and spk_bounds; input_ids and labels beside
  it, as LLaMA-Factory's collator returns them.
- a `<video>` (MiniCPM-V and MiniCPM-o: LLaMA-Factory's one plugin takes it for both templates) becomes one slice placeholder per sampled frame (max_slice_nums 2, no image ids), each
  frame's size read from the row's video; the collator calls the image processor with the batch's videos (one
  pixel_values / image_sizes / tgt_sizes entry per video). LLaMA-Factory 0.9.5 reads every frame's size from a row's
  first video (a second one fails: IndexError), refuses images and videos in one row, and gives the model one entry
  per video, not per row: lathe refuses those rows and batches, each in one line naming LLaMA-Factory's failure."""

from __future__ import annotations

from lathe.llm.multimodal.common import ModulePlugin, composite, fit_images, placeholder_runs
from lathe.llm.multimodal.images import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN = "<image>", "<video>", None  # MiniCPM-o's plugin class below adds audio
VIDEO_SLICES = 2  # LLaMA-Factory slices a video's frames into at most 2 parts (and numbers no image ids)
IMAGE_BOUNDS = (("im_start_id", "slice_start_id"), ("im_end_id", "slice_end_id"))
AUDIO_BOUNDS = {"audio_bounds": ("audio_start_id", "audio_end_id"), "spk_bounds": ("spk_start_id", "spk_end_id")}
# The tokens behind MiniCPM-V's tokenizer properties (openbmb's tokenization_minicpmv_fast.py). transformers 5 loads
# a minicpmv folder's tokenizer without its remote class (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), so the
# properties are missing there (LLaMA-Factory 0.9.5 then fails in its collator); lathe reads the tokens' ids.
BOUND_TOKENS = {
    "im_start_id": "<image>",
    "im_end_id": "</image>",
    "slice_start_id": "<slice>",
    "slice_end_id": "</slice>",
    "audio_start_id": "<|audio_start|>",
    "audio_end_id": "<|audio_end|>",
    "spk_start_id": "<|spk_bos|>",
    "spk_end_id": "<|spk_eos|>",
}
ENDS = ("</image>", "</slice>", "<|audio_end|>")  # a run cut before its end token is a cut medium
# LLaMA-Factory's registrations (MiniCPM-V's own module names: vpm the vision tower, resampler the projector, llm the
# language model; MiniCPM-o's audio tower, pooler, projection and TTS count as towers)
COMPOSITES = {
    "minicpmv": composite(vision=("vpm",), projector=("resampler",), language=("llm",)),
    "minicpmo": composite(
        vision=("vpm", "apm", "audio_avg_pooler", "audio_projection_layer", "tts"),
        projector=("resampler",),
        language=("llm",),
        lora_conflict=("audio_projection_layer",),
    ),
}


def token_id(tokenizer, name: str) -> int | None:
    """The id MiniCPM-V's tokenizer property `name` gives, or that of its token (None: the tokenizer lacks it)."""
    if hasattr(tokenizer, name):
        return getattr(tokenizer, name)
    if not hasattr(tokenizer, "convert_tokens_to_ids"):
        return None
    found = tokenizer.convert_tokens_to_ids(BOUND_TOKENS[name])
    return None if found is None or found == getattr(tokenizer, "unk_token_id", None) else found


def check_processor(processor, tokenizer, audio: bool, family: str = "minicpm_v") -> None:
    """One line naming what the model's own code would give and this processor / tokenizer lacks."""
    image_processor = getattr(processor, "image_processor", None)
    missing = [
        f"image_processor.{name}"
        for name in ("get_slice_image_placeholder", "max_slice_nums", "use_image_id")
        if not hasattr(image_processor, name)
    ]
    names = [name for pair in IMAGE_BOUNDS for name in pair]
    if audio:
        missing += [] if hasattr(processor, "audio_feature_extract") else ["audio_feature_extract"]
        names += [name for pair in AUDIO_BOUNDS.values() for name in pair]
    missing += [f"tokenizer.{name} ({BOUND_TOKENS[name]})" for name in names if token_id(tokenizer, name) is None]
    if missing:
        raise ValueError(
            f"the {family} family needs the model's own processor and tokenizer (MiniCPM-V's code in the model "
            f"folder); {type(processor).__name__} / {type(tokenizer).__name__} lack {', '.join(missing)}: set "
            "trust_remote_code: true to load them"
        )


def image_processor_call(images, processor, settings) -> dict:
    """The image processor's outputs for images fitted into the pixel budget: a flat list (one row) or nested by
    row, with the model's own max_slice_nums (LLaMA-Factory's call)."""
    image_processor = processor.image_processor
    nested = [fit_images(row, settings) for row in images] if images and isinstance(images[0], list) else None
    prepared = nested if nested is not None else fit_images(images, settings)
    kwargs = {"do_pad": True, "max_slice_nums": image_processor.max_slice_nums, "return_tensors": "pt"}
    return dict(image_processor(prepared, **kwargs))


def check_videos(images: list, videos: list) -> None:
    """The rows LLaMA-Factory 0.9.5's MiniCPMVPlugin fails on, named."""
    if videos and images:
        raise ValueError(
            'a minicpm_v / minicpm_o row takes images or videos, not both: LLaMA-Factory 0.9.5 refuses it ("MiniCPM-V model does '
            'not support input images and videos at the same time")'
        )
    if len(videos) > 1:
        raise ValueError(
            f"a minicpm_v / minicpm_o row takes one video, this one has {len(videos)}: LLaMA-Factory 0.9.5 reads every frame's size "
            "from the row's first video and fails on the second's frames (IndexError: list index out of range)"
        )


def video_frames_call(videos, processor) -> dict:
    """The image processor's outputs for the videos' frames, one row per video (LLaMA-Factory's call)."""
    frames = [video.frames for video in videos]
    return dict(processor.image_processor(frames, do_pad=True, max_slice_nums=VIDEO_SLICES, return_tensors="pt"))


def process_messages(messages, images, audios, processor, settings, videos=()) -> list[dict]:
    """Each `<image>` replaced by its slice placeholder (numbered over the row's images), a `<video>` by one per
    frame, each `<audio>` by the processor's audio placeholder."""
    messages = [dict(message) for message in messages]
    videos = list(videos)
    check_videos(images, videos)
    if videos:
        sizes, place = video_frames_call(videos, processor)["image_sizes"][0], processor.image_processor
        run = "".join(place.get_slice_image_placeholder(size, k, VIDEO_SLICES, False) for k, size in enumerate(sizes))
        messages = placeholder_runs(messages, VIDEO_PLACEHOLDER, lambda k: run)
    if images:
        image_processor = processor.image_processor
        sizes = image_processor_call(images, processor, settings)["image_sizes"][0]
        slices, use_id = image_processor.max_slice_nums, image_processor.use_image_id
        runs = [image_processor.get_slice_image_placeholder(sizes[k], k, slices, use_id) for k in range(len(images))]
        messages = placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: runs[k])
    if audios:
        rate = settings.audio_sampling_rate
        placeholders = processor.audio_feature_extract([audios], chunk_input=True, sampling_rate=rate)[2][0]
        messages = placeholder_runs(messages, AUDIO_PLACEHOLDER, lambda k: placeholders[k])
    return messages


def media_tokens(processor) -> tuple[str, ...]:
    return ENDS


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def bounds(row_ids: list[int], starts: set[int], ends: set[int]):
    """(runs, 2): the position after each start token and the position of each end token, in order."""
    import torch

    ids = torch.tensor(row_ids)
    first = torch.where(torch.isin(ids, torch.tensor(sorted(starts))))[0] + 1
    last = torch.where(torch.isin(ids, torch.tensor(sorted(ends))))[0]
    if len(first) != len(last):
        raise ValueError(f"a MiniCPM-V row has {len(first)} media start tokens and {len(last)} end tokens")
    return torch.hstack([first.unsqueeze(-1), last.unsqueeze(-1)])


def grouped(items: list, counts: list[int]) -> list[list]:
    rows, start = [], 0
    for count in counts:
        rows.append(items[start : start + count])
        start += count
    return rows


def media_inputs(images, audios, counts, batch_ids, processor, tokenizer, settings, shape, videos=()) -> dict:
    """The model's `data` entries besides the padded text, for a batch of `shape` (rows, length)."""
    import torch

    starts, ends = ({token_id(tokenizer, name) for name in names} for names in IMAGE_BOUNDS)
    inputs = image_processor_call(grouped(images, counts["image"]), processor, settings) if images else {}
    if videos:
        if any(count != 1 for count in counts["video"]):
            raise ValueError(
                "a minicpm_v / minicpm_o batch with videos needs one video in every row: LLaMA-Factory 0.9.5's collator gives "
                "the model one pixel_values entry per video, not per row (the other rows' images are dropped and "
                "the entries no longer match the rows): batch video rows together (per_device_train_batch_size: 1 "
                "keeps every row apart)"
            )
        inputs = video_frames_call(videos, processor)
    inputs["image_bound"] = [bounds(ids, starts, ends) for ids in batch_ids]
    if audios:
        for key, (start, end) in AUDIO_BOUNDS.items():
            start_id, end_id = token_id(tokenizer, start), token_id(tokenizer, end)
            inputs[key] = [bounds(ids, {start_id}, {end_id}) for ids in batch_ids]
        features, lengths, _ = processor.audio_feature_extract(
            grouped(audios, counts["audio"]), chunk_input=True, sampling_rate=settings.audio_sampling_rate
        )
        # a row without audio has no lengths: an empty tensor, as LLaMA-Factory makes one
        lengths = [item.clone().detach() if torch.is_tensor(item) else torch.tensor(item) for item in lengths]
        inputs.update({"audio_features": features, "audio_feature_lens": lengths})
    rows, length = shape
    inputs["position_ids"] = torch.arange(length).long().repeat(rows, 1)
    return inputs


class MiniCPMVPlugin(ModulePlugin):
    """LLaMA-Factory's MiniCPM-V plugin (minicpm_v template: images)."""

    name = "minicpm_v"

    def check_processor(self, audio: bool) -> None:
        check_processor(self.processor, self.tokenizer, audio, self.name)

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        self.check_processor(bool(media.get("audio")))
        return super().process_messages(messages, media)

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids=None) -> dict:
        if row_ids is None:
            raise ValueError(f"the {self.name} family needs each row's unpadded input_ids (MultimodalCollator)")
        kinds = ("image", "video", "audio")
        images, videos, audios = ([item for row in media_rows for item in row.get(kind) or []] for kind in kinds)
        self.check_processor(bool(audios))
        counts = {kind: [len(row.get(kind) or []) for row in media_rows] for kind in kinds}
        shape, parts = tuple(batch["input_ids"].shape), (self.processor, self.tokenizer, self.settings)
        return media_inputs(images, audios, counts, row_ids, *parts, shape, videos=videos)

    def finish_batch(self, batch: dict) -> dict:
        """MiniCPM-V's forward takes one `data` dict: LLaMA-Factory's collator nests the batch there."""
        return {"data": batch, "input_ids": batch["input_ids"], "labels": batch["labels"]}


class MiniCPMOPlugin(MiniCPMVPlugin):
    """The minicpm_o template: LLaMA-Factory's same plugin with `<audio>` (MiniCPM-o's audio placeholders, features
    and bounds; a batch without audio, a video batch too, gets the stand-in silence). Videos as MiniCPM-V's."""

    name = "minicpm_o"


MiniCPMOPlugin.kinds = ("image", "video", "audio")  # after the class: ModulePlugin sets kinds from the module's tokens
