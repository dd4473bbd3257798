"""The MiniCPM-V 4.6 family (minicpm_v_4_6 template; transformers' minicpmv4_6 model: a NaViT vision tower, image
tokens found by get_placeholder_mask) as LLaMA-Factory 0.9.5's MiniCPMV4_6Plugin encodes images. The image processor
cuts each image into the whole image plus a grid of slices, each with its patch size (target_sizes); `<image>` becomes
`<image_id>k</image_id>` (k the image's number in its row) + `<image>` + the image token x (the whole image's patches
/ 16, or / 4 with downsample_mode "4x") + `</image>`, then the slices' rows, joined by newlines, each slice
`<slice>` + its tokens + `</slice>`. The collator adds the image processor's outputs as they come (pixel_values,
target_sizes, grids, num_patches_per_image) and downsample_mode, as LLaMA-Factory passes them.

Where lathe differs: each slice gets its own token count (transformers' MiniCPMV4_6Processor's rule; LLaMA-Factory
gives every slice the first one's, which the model refuses where they differ), and the DOWNSAMPLE_MODE environment
variable LLaMA-Factory reads is not read (the image processor's downsample_mode is). Video is refused: LLaMA-Factory
0.9.5 fails on every video row here (it builds a video's tokens from image outputs the video processor does not
give)."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image>", None
COMPOSITES = {  # as LLaMA-Factory registers it
    "minicpmv4_6": composite(
        vision=("model.vision_tower",), projector=("model.merger",), language=("model.language_model", "lm_head")
    )
}
DEFAULT_TOKENS = {  # LLaMA-Factory's defaults where neither the processor nor the tokenizer names one
    "image_token": "<image>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
}


class MiniCPMV46Parts:
    """What the family reads of a MiniCPMV4_6Processor: its image processor and tokens (from the processor, else
    the tokenizer's named tokens, else LLaMA-Factory's defaults). transformers builds the processor only with
    torchvision (its video processor); lathe's loader then gives the image processor alone."""

    def __init__(self, processor, tokenizer):
        self.image_processor = getattr(processor, "image_processor", None)
        if self.image_processor is None and hasattr(processor, "preprocess"):
            self.image_processor = processor
        if not hasattr(self.image_processor, "scale_resolution"):
            raise ValueError(
                f"the minicpm_v_4_6 family needs MiniCPM-V 4.6's image processor (MiniCPMV4_6ImageProcessor, "
                f"transformers >= 5.23); {type(processor).__name__} is not it"
            )
        for name, default in DEFAULT_TOKENS.items():
            setattr(self, name, getattr(processor, name, None) or getattr(tokenizer, name, None) or default)
        image = self.image_processor
        self.use_image_id = getattr(processor, "default_use_image_id", getattr(image, "use_image_id", True))
        self.slice_mode = getattr(processor, "slice_mode", getattr(image, "slice_mode", True))
        self.downsample_mode = getattr(image, "downsample_mode", "16x")


def image_inputs(images, processor) -> dict:
    """The image processor's outputs for the images as they are: LLaMA-Factory's plugin applies no pixel budget
    for this family (image_max_pixels / image_min_pixels do nothing; scale_resolution and max_slice_nums do)."""
    return dict(processor.image_processor(list(images), return_tensors="pt")) if images else {}


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` replaced by its image and slice runs (the image's number in the row first, with use_image_id)."""
    parts: MiniCPMV46Parts = processor
    if not images:
        return [dict(message) for message in messages]
    outputs = image_inputs(images, parts)
    divisor = 4 if parts.downsample_mode == "4x" else 16
    runs, start = [], 0
    for index, patches in enumerate(outputs["num_patches_per_image"]):
        counts = (outputs["target_sizes"][start : start + patches].prod(-1) // divisor).tolist()
        start += patches
        run = parts.image_start_token + parts.image_token * int(counts[0]) + parts.image_end_token
        if parts.use_image_id:
            run = f"{parts.image_id_start_token}{index}{parts.image_id_end_token}{run}"
        rows, columns = outputs["grids"][index]
        if parts.slice_mode and rows > 0 and columns > 0:
            slices = [parts.slice_start_token + parts.image_token * int(n) + parts.slice_end_token for n in counts[1:]]
            run += "\n".join("".join(slices[row * columns : (row + 1) * columns]) for row in range(rows))
        runs.append(run)
    return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: runs[k])


def media_tokens(processor) -> tuple[str, ...]:
    parts: MiniCPMV46Parts = processor
    return (parts.image_start_token, parts.image_token, parts.image_end_token, parts.slice_end_token)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """The image processor's outputs of the batch's images and the downsample_mode the tokens were counted with
    (the model's forward reads it)."""
    parts: MiniCPMV46Parts = processor
    inputs = image_inputs(images, parts)
    inputs["downsample_mode"] = parts.downsample_mode
    return inputs


class MiniCPMV46Plugin(ModulePlugin):
    """LLaMA-Factory's MiniCPM-V 4.6 plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "minicpm_v_4_6"
    missing = {"video": "LLaMA-Factory 0.9.5's minicpm_v_4_6 plugin fails on every video row (not implemented)"}

    def __init__(self, processor, tokenizer, settings: MediaSettings | None = None):
        parts = processor if isinstance(processor, MiniCPMV46Parts) else MiniCPMV46Parts(processor, tokenizer)
        super().__init__(parts, tokenizer, settings or MediaSettings())
