"""The interface every multimodal family implements (one module per family, registered in plugins.py): the
media settings of a run, the parameter-name parts of the composite model, and the plugin's four steps."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from lathe.llm.multimodal.images import (
    AUDIO_PLACEHOLDER,
    DEFAULT_IMAGE_MAX_PIXELS,
    DEFAULT_IMAGE_MIN_PIXELS,
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    fit_pixels,
    open_image,
)

KINDS = ("image", "video", "audio")
PLACEHOLDERS = {"image": IMAGE_PLACEHOLDER, "video": VIDEO_PLACEHOLDER, "audio": AUDIO_PLACEHOLDER}


@dataclass
class MediaSettings:
    """LLaMA-Factory's processor keys (ProcessorArguments, same defaults), read from the run's model arguments."""

    image_max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS
    image_min_pixels: int = DEFAULT_IMAGE_MIN_PIXELS
    image_do_pan_and_scan: bool = False
    crop_to_patches: bool = False
    video_max_pixels: int = 256 * 256
    video_min_pixels: int = 16 * 16
    video_fps: float = 2.0
    video_maxlen: int = 128
    use_audio_in_video: bool = False
    audio_sampling_rate: int = 16000

    @classmethod
    def from_args(cls, args) -> "MediaSettings":
        return cls(**{item.name: getattr(args, item.name, item.default) for item in fields(cls)})


@dataclass(frozen=True)
class Composite:
    """Parameter-name parts of a vision-language model (LLaMA-Factory's COMPOSITE_MODELS entry), matched as
    substrings: what freeze_vision_tower / freeze_multi_modal_projector / freeze_language_model freeze, and the
    modules LoRA never wraps unless asked (lora_conflict_keys)."""

    vision_keys: tuple[str, ...]
    projector_keys: tuple[str, ...]
    language_keys: tuple[str, ...] = ("language_model", "lm_head")
    lora_conflict_keys: tuple[str, ...] = ()

    def frozen_keys(self, vision: bool = True, projector: bool = True, language: bool = False) -> set[str]:
        keys: set[str] = set()
        for frozen, names in (
            (vision, self.vision_keys),
            (projector, self.projector_keys),
            (language, self.language_keys),
        ):
            if frozen:
                keys.update(names)
        return keys


@dataclass
class FamilyPlugin:
    """A family's media handling, built once per run by plugins.get_plugin(template, processor, tokenizer, settings).

    Subclasses set the class attributes and override the steps their family changes; each step has LLaMA-Factory
    0.9.5's mm_plugin name and meaning:
    - regularize(kind, items): open each item of a row's media column (paths already joined to media_dir) and make
      it what the processor takes (images: fit_pixels);
    - process_messages(messages, media): each placeholder replaced by the family's media tokens (media: kind -> the
      regularized items of one row);
    - prefix_length(media): how many tokens process_token_ids puts before the row (PaliGemma's image prefix); the
      pipeline counts them against cutoff_len first, as LLaMA-Factory does; default 0;
    - process_token_ids(input_ids, labels, media): the encoded row, changed where the family needs it (PaliGemma's
      image prefix); default unchanged;
    - cut_reason(input_ids, media): why a row cut by cutoff_len cannot train (a media run cut), or None;
    - batch_inputs(media_rows, batch, model, row_ids): the tensors the model takes besides the text (pixel_values,
      grids, position ids, token_type_ids, ...) for a padded batch whose rows carried media_rows (one dict per row);
      row_ids: each row's input_ids before padding (stand-in tokens included); packed rows (a family with `packs`)
      come with the text collator's 2-D position_ids (0 where each example starts) and 4-D attention mask;
    - stand_in(): LLaMA-Factory's fake media, kind -> items: the collator gives each kind a batch lacks to its first
      row (a white image, silence), or None;
    - finish_batch(batch): the collated batch in the form the family's model takes (MiniCPM-V's one `data` dict);
      default unchanged.
    """

    processor: Any
    tokenizer: Any
    settings: MediaSettings = field(default_factory=MediaSettings)
    # Class-level facts of the family (ClassVar: not constructor arguments; a subclass just assigns them).
    name: ClassVar[str] = ""
    kinds: ClassVar[tuple[str, ...]] = ("image",)  # what the family encodes; other kinds are a clear error
    composites: ClassVar[dict] = {}  # model_type -> Composite
    # the family's model types LLaMA-Factory registers no composite for (they train whole, freeze_* do nothing):
    # still vision-language models, whose batches take the media tensors
    whole_model_types: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[str, ...]] = ()  # family-only settings it honours: image_do_pan_and_scan, ...
    missing: ClassVar[dict] = {}  # kind -> why lathe's family takes none (appended to the error)
    packs: ClassVar[bool] = False  # batch_inputs takes packed rows (position_ids restarting per example)
    no_packing: ClassVar[str] = ""  # why a family that does not pack cannot (appended to its one-line error)

    def check_packing(self, what: str) -> None:
        """One line naming the family (and why) where packed rows cannot carry its media."""
        if not self.packs:
            why = self.no_packing or "its tensors are not split per packed example"
            raise ValueError(f"{what}: lathe's {self.name} family does not pack: {why} (set packing: false)")

    def check_settings(self) -> None:
        """One line for a setting this family does not have (LLaMA-Factory ignores them silently)."""
        for option in ("image_do_pan_and_scan", "crop_to_patches", "use_audio_in_video"):
            if getattr(self.settings, option) and option not in self.options:
                raise ValueError(f"{option}: the {self.name} family has no such option (it is not applied there)")

    def composite(self, model_type: str) -> Composite | None:
        return (self.composites or {}).get(model_type)

    def check_kinds(self, counts: dict[str, int], where: str) -> None:
        for kind, count in counts.items():
            if count and kind not in self.kinds:
                why = (self.missing or {}).get(kind, "")
                raise ValueError(
                    f"{where}: {count} {kind}(s) given, but lathe's {self.name} family takes no {kind} input"
                    + (f": {why}" if why else "")
                )

    def regularize(self, kind: str, items: list, where: str = "") -> list:
        if kind != "image":
            raise ValueError(f"{where}: {kind} input is not supported by the {self.name} family in lathe yet")
        s = self.settings
        return [fit_pixels(open_image(item, None, where), s.image_max_pixels, s.image_min_pixels) for item in items]

    def process_messages(self, messages: list[dict], media: dict[str, list]) -> list[dict]:
        return messages

    def prefix_length(self, media: dict[str, list]) -> int:
        return 0

    def process_token_ids(self, input_ids: list[int], labels: list[int], media: dict[str, list]):
        return input_ids, labels

    def cut_reason(self, input_ids: list[int], media: dict[str, list]) -> str | None:
        return None

    def batch_inputs(self, media_rows: list[dict[str, list]], batch: dict, model, row_ids=None) -> dict:
        raise NotImplementedError

    def stand_in(self) -> dict[str, list] | None:
        return None

    def finish_batch(self, batch: dict) -> dict:
        return batch
