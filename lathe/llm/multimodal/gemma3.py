"""The Gemma 3 family (gemma3 template) as LLaMA-Factory 0.9.5 encodes images: each `<image>` becomes the
processor's full image sequence ("\\n\\n<start_of_image>" + image_seq_length soft tokens + "<end_of_image>\\n\\n");
with image_do_pan_and_scan the original image is followed by its crops, each with its own sequence. The
collator adds pixel_values and token_type_ids (1 on the image's soft tokens, for the model's bidirectional
attention over them)."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image_soft_token>", None
COMPOSITES = {"gemma3": composite()}  # as LLaMA-Factory registers them
PAN_AND_SCAN_TEXT = "Here is the original image {image} and here are some crops to help you see better "


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` replaced by the image sequence (and, with pan and scan, one more per crop)."""
    sequence = processor.full_image_sequence
    if not settings.image_do_pan_and_scan:
        return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: sequence)
    crops = []
    if images:
        import torch

        # crops per image, in order. LLaMA-Factory 0.9.5 reads num_crops[0][k] (transformers 4's nested lists);
        # transformers 5 returns one flat tensor, where that read fails on any image.
        crops = torch.as_tensor(image_processor_inputs(images, processor, settings)["num_crops"]).flatten().tolist()

    def with_crops(index: int) -> str:
        return PAN_AND_SCAN_TEXT.format(image=sequence) + " ".join([sequence] * int(crops[index]))

    return placeholder_runs(messages, IMAGE_PLACEHOLDER, with_crops)


def media_tokens(processor) -> tuple[str, ...]:
    """The image sequence's tokens: begin, soft token, end."""
    tokenizer = processor.tokenizer
    return (processor.boi_token, getattr(tokenizer, "image_token", IMAGE_TOKEN), tokenizer.eoi_token)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def token_type_ids(batch_ids: list[list[int]], image_token_id: int) -> list[list[int]]:
    """1 where a row holds the image soft token, else 0."""
    return [[int(token == image_token_id) for token in ids] for ids in batch_ids]


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values of the batch's images (crops included) and the rows' token_type_ids."""
    inputs = image_processor_inputs(images, processor, settings)
    inputs.pop("num_crops", None)
    # the soft token's id: the tokenizer's (transformers 5.23's Gemma3Processor.image_token_id is <start_of_image>,
    # 5.6's, which LLaMA-Factory 0.9.5 read, the soft token)
    soft_token_id = getattr(processor.tokenizer, "image_token_id", None)
    inputs["token_type_ids"] = token_type_ids(
        batch_ids, soft_token_id if soft_token_id is not None else processor.image_token_id
    )
    return inputs


class Gemma3Plugin(ModulePlugin):
    """LLaMA-Factory's Gemma 3 plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "gemma3"
    options = ("image_do_pan_and_scan",)
    packs = False
    no_packing = (
        "its image tokens attend to each other both ways (token_type_ids), which the packed rows' 4-D mask does not "
        "hold (LLaMA-Factory 0.9.5's neat packing fails in the model: IndexError, too many indices)"
    )
