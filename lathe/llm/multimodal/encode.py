"""What the data pipeline calls for rows with media: the run's family plugin, made at the first such row (a text
run with a multimodal template never loads a processor), the placeholders expanded before the template encodes
the row, and the encoded row checked after cutoff_len (a media run cut through: the row is left out)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import fields

from lathe.llm.multimodal.base import KINDS, MediaSettings
from lathe.llm.multimodal.media import CANONICAL

EXPANDED = "media_expanded"  # the key on a message whose placeholders the family plugin expanded
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def load_processor(path: str, use_fast: bool = True, trust_remote_code: bool = False):
    """The model folder's processor, loaded as LLaMA-Factory loads it (`AutoProcessor.from_pretrained(path,
    use_fast=use_fast_tokenizer)`): with torchvision importable, transformers picks its torchvision image backend,
    without it the PIL one (pixel values differ slightly; lathe's equal LLaMA-Factory's in both). A processor that
    cannot be built without torchvision (Qwen2-VL's video processor) leaves the folder's image processor alone
    to serve image rows (with the feature extractor, where the folder has one: the Omni models' audio); a video row
    then names torchvision (check_video_processor). A processor that is the model
    folder's own code (Kimi-VL's, MiniCPM-V's) runs only with trust_remote_code, as the model does."""
    from transformers import AutoImageProcessor, AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path, use_fast=use_fast, trust_remote_code=trust_remote_code)
        if "Processor" in type(processor).__name__:  # not the tokenizer AutoProcessor falls back to
            return processor
    except ImportError:
        pass
    except (OSError, ValueError) as error:
        from lathe.llm.remote_code import remote_code_error

        named = remote_code_error(error, path, "processor")
        if named is not None:
            raise named from None
        raise ValueError(f"{path}: no processor for images/videos/audio could be loaded ({error})") from None
    try:
        image_processor = AutoImageProcessor.from_pretrained(
            path, use_fast=use_fast, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: no image processor (preprocessor_config.json) could be loaded ({error})") from None
    return with_feature_extractor(path, image_processor)


class ProcessorParts:
    """The image processor and feature extractor of a processor transformers could not build (the Qwen Omni and
    Gemma 4 processors need torchvision for their video processor): the attributes the family plugins read (the
    processor's own settings too: Gemma 4's audio_seq_length), and the folder's `processor_class` name."""

    def __init__(self, processor_class: str, nested: dict | None = None, **parts):
        self.processor_class = processor_class
        self.nested = nested  # the folder's processor_config.json, where the parts are nested in it
        self.__dict__.update(parts)

    def save_pretrained(self, path: str, **kwargs) -> None:
        """The files as the folder had them: its processor_config.json with every part nested (transformers 5's
        layout), or one preprocessor_config.json with both parts and the processor_class (the Omni repositories')."""
        import json

        if self.nested is not None:
            with open(os.path.join(path, "processor_config.json"), "w") as handle:
                json.dump(self.nested, handle, indent=2)
            return
        self.image_processor.save_pretrained(path)
        config_file = os.path.join(path, "preprocessor_config.json")
        with open(config_file) as handle:
            config = json.load(handle)
        extractor = {key: value for key, value in self.feature_extractor.to_dict().items() if key not in config}
        with open(config_file, "w") as handle:
            json.dump({**config, **extractor, "processor_class": self.processor_class}, handle, indent=2)


def _json_file(path: str) -> dict:
    import json

    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def with_feature_extractor(path: str, image_processor):
    """The image processor alone, or with the feature extractor the folder also describes as ProcessorParts: in
    preprocessor_config.json (an Omni model's one file holds both) or nested in processor_config.json (transformers
    5's layout, Gemma 4's), whose plain settings (audio_seq_length, ...) the parts carry too."""
    from transformers import AutoFeatureExtractor

    config = _json_file(os.path.join(path, "preprocessor_config.json"))
    nested = _json_file(os.path.join(path, "processor_config.json"))
    if "feature_extractor_type" in config:
        extractor = AutoFeatureExtractor.from_pretrained(path)
        parts = {"image_processor": image_processor, "feature_extractor": extractor}
        return ProcessorParts(config.get("processor_class", ""), **parts)
    if isinstance(nested.get("feature_extractor"), dict):
        settings = {key: value for key, value in nested.items() if not isinstance(value, (dict, list))}
        settings.pop("processor_class", None)
        extractor = AutoFeatureExtractor.from_pretrained(path)
        parts = {**settings, "image_processor": image_processor, "feature_extractor": extractor}
        return ProcessorParts(nested.get("processor_class", ""), nested, **parts)
    return image_processor


class MediaEncoder:
    """The data pipeline's handle on the run's multimodal family (lathe.llm.multimodal.base.FamilyPlugin)."""

    def __init__(
        self,
        template,
        tokenizer,
        model_path: str,
        settings: MediaSettings | None = None,
        processor=None,
        use_fast=True,
        trust_remote_code=False,
    ):
        self.template, self.tokenizer, self.model_path, self.use_fast = template, tokenizer, model_path, use_fast
        self.trust_remote_code = trust_remote_code
        self.settings = settings or MediaSettings()
        self._processor, self._plugin = processor, None

    @classmethod
    def for_run(cls, template, tokenizer, model_args) -> "MediaEncoder | None":
        if not getattr(template, "multimodal", ""):
            return None
        from lathe.llm.hub import model_folder  # a hub id: its local snapshot, as the tokenizer was read

        use_fast = getattr(model_args, "use_fast_tokenizer", True)
        settings, trust = MediaSettings.from_args(model_args), getattr(model_args, "trust_remote_code", False)
        return cls(template, tokenizer, model_folder(model_args), settings, None, use_fast, trust)

    @property
    def processor(self):
        if self._processor is None:
            self._processor = load_processor(self.model_path, self.use_fast, self.trust_remote_code)
        return self._processor

    @property
    def plugin(self):
        if self._plugin is None:
            from lathe.llm.multimodal.plugins import get_plugin

            self._plugin = get_plugin(self.template, self.processor, self.tokenizer, self.settings)
        return self._plugin

    def describe(self) -> dict:
        """What changes the encoded rows besides the data: the settings and the model folder's processor files."""
        files = {}
        for name in PROCESSOR_FILES:
            path = os.path.join(self.model_path, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    files[name] = hashlib.sha256(handle.read()).hexdigest()
        settings = {item.name: getattr(self.settings, item.name) for item in fields(self.settings)}
        return {"family": self.template.multimodal, "settings": settings, "processor_files": files}

    def __getstate__(self):  # datasets' workers and fingerprints: the processor is loaded again where needed
        return {**self.__dict__, "_processor": None, "_plugin": None}

    @staticmethod
    def row_paths(examples: dict, index: int) -> dict[str, list]:
        return {kind: list((examples.get(CANONICAL[kind]) or [None] * (index + 1))[index] or []) for kind in KINDS}

    def expand(self, messages: list[dict], paths: dict[str, list], where: str = "a row"):
        """(the messages with their placeholders expanded, the regularized media) for a row with media."""
        plugin = self.plugin
        plugin.check_kinds({kind: len(items) for kind, items in paths.items()}, where)
        media = {kind: plugin.regularize(kind, items, where) for kind, items in paths.items() if items}
        # marked: the template's refusal of a literal placeholder is for rows without media (LLaVA's expanded
        # token is `<image>` itself)
        expanded = [{**message, EXPANDED: True} for message in plugin.process_messages(messages, media)]
        return expanded, media

    def prefix_length(self, media: dict) -> int:
        """Tokens the family puts before the encoded row (PaliGemma's images), counted against cutoff_len first."""
        return self.plugin.prefix_length(media) if media else 0

    def finish(self, input_ids: list[int], labels: list[int], media: dict):
        """(input_ids, labels, why the row cannot train or None) after the template encoded and cut the row."""
        input_ids, labels = self.plugin.process_token_ids(input_ids, labels, media)
        return input_ids, labels, self.plugin.cut_reason(input_ids, media)


def media_kinds(dataset) -> tuple[str, ...]:
    """The kinds of media some row of a converted dataset has (its tokenized rows carry those columns)."""
    present = set(dataset.column_names)
    table = dataset.with_format("arrow")
    return tuple(
        kind for kind in KINDS if CANONICAL[kind] in present and table[CANONICAL[kind]].null_count < len(dataset)
    )


def output_columns(paths: list[dict[str, list]], kinds: tuple[str, ...]) -> dict[str, list]:
    """The tokenized rows' media columns (images / videos / audios: the paths the collator opens again)."""
    from lathe.llm.multimodal.media import COLUMNS

    return {COLUMNS[kind]: [row.get(kind) or None for row in paths] for kind in kinds}
