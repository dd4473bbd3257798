"""A stand-in for MiniCPM-V / MiniCPM-o's remote code (openbmb's tokenization_minicpmv_fast.py and
processing_minicpmo.py, which live in the model repositories and cannot be had here), written for the tests: copied
into a tiny model folder as `processing_minicpm_standin.py` and loaded by both lathe and LLaMA-Factory with
`trust_remote_code: true` (tokenizer_config.json / preprocessor_config.json name its classes in `auto_map`).

It is deterministic and small, and exposes the interface LLaMA-Factory 0.9.5's MiniCPMVPlugin calls, with the
openbmb shapes:
- the tokenizer's im_start_id / im_end_id / slice_start_id / slice_end_id / audio_start_id / audio_end_id /
  spk_start_id / spk_end_id (the ids of the tokens that bound image, slice, audio and speaker runs);
- the image processor's max_slice_nums, use_image_id, get_sliced_grid, get_slice_image_placeholder (`<image_id>k
  </image_id>` + `<image>` + unk x image_feature_size + `</image>`, then a `<slice>...</slice>` per slice, rows
  joined by newlines) and its call, which takes images nested per row and returns pixel_values (per row, per
  slice: (3, patch, h * w / patch) float32), image_sizes (per row, per image: tensor([width, height])) and
  tgt_sizes (per row: (slices, 2) patch rows and columns);
- the processor's audio_feature_extract(audios per row, chunk_input=True, sampling_rate): padded features
  (audios, 4, frames), each row's frame counts, and each audio's placeholder (`<|audio_start|>` + unk per token +
  `<|audio_end|>` per chunk of CHUNK_TOKENS).
The slicing rule and the "features" are its own (a grid near the image's aspect ratio; four statistics per 160
samples): what the tests compare is how the plugin uses them, not openbmb's numbers. MiniCPMStandInModel is a tiny
model with MiniCPM-V's forward contract (one `data` dict, image runs at image_bound) and module names (vpm,
resampler, llm), for the three-step training comparison.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

HOP, FEATURES, FRAMES_PER_TOKEN, CHUNK_TOKENS = 160, 4, 4, 8
SETTINGS = ("max_slice_nums", "scale_resolution", "patch_size", "use_image_id")  # preprocessor_config.json's keys


class MiniCPMStandInTokenizer(PreTrainedTokenizerFast):
    """The tokenizer with the id properties MiniCPM-V's tokenizer adds (the tokens are special tokens of its file)."""

    im_start, im_end, slice_start, slice_end = "<image>", "</image>", "<slice>", "</slice>"
    audio_start, audio_end, spk_start, spk_end = "<|audio_start|>", "<|audio_end|>", "<|spk_bos|>", "<|spk_eos|>"

    def _id(self, token: str) -> int:
        return self.convert_tokens_to_ids(token)

    im_start_id = property(lambda self: self._id(self.im_start))
    im_end_id = property(lambda self: self._id(self.im_end))
    slice_start_id = property(lambda self: self._id(self.slice_start))
    slice_end_id = property(lambda self: self._id(self.slice_end))
    audio_start_id = property(lambda self: self._id(self.audio_start))
    audio_end_id = property(lambda self: self._id(self.audio_end))
    spk_start_id = property(lambda self: self._id(self.spk_start))
    spk_end_id = property(lambda self: self._id(self.spk_end))


class MiniCPMStandInImageProcessor:
    """Slices an image into a grid of at most max_slice_nums parts besides its whole (source) view."""

    def __init__(self, max_slice_nums=3, scale_resolution=28, patch_size=14, image_feature_size=4, use_image_id=True):
        self.max_slice_nums, self.scale_resolution, self.patch_size = max_slice_nums, scale_resolution, patch_size
        self.image_feature_size, self.use_image_id = image_feature_size, use_image_id

    def get_sliced_grid(self, image_size, max_slice_nums, never_split=False):
        """(columns, rows) of the slices, or None for an image that stays whole: as many slices as the image has
        scale_resolution squares (at most max_slice_nums), in the grid nearest its aspect ratio."""
        width, height = (int(side) for side in image_size)
        multiple = min(math.ceil(width * height / self.scale_resolution**2), max_slice_nums)
        if multiple <= 1 or never_split:
            return None
        grids = [(columns, multiple // columns) for columns in range(1, multiple + 1) if multiple % columns == 0]
        return min(grids, key=lambda grid: abs(math.log(grid[0] / grid[1]) - math.log(width / height)))

    def get_slice_image_placeholder(self, image_size, image_idx=0, max_slice_nums=None, use_image_id=None):
        max_slice_nums = self.max_slice_nums if max_slice_nums is None else int(max_slice_nums)
        use_image_id = self.use_image_id if use_image_id is None else bool(use_image_id)
        placeholder = "<image>" + "<unk>" * self.image_feature_size + "</image>"
        if use_image_id:
            placeholder = f"<image_id>{image_idx}</image_id>" + placeholder
        grid = self.get_sliced_grid(image_size, max_slice_nums)
        if grid is None:
            return placeholder
        columns, rows = grid
        part = "<slice>" + "<unk>" * self.image_feature_size + "</slice>"
        return placeholder + "\n".join(part * columns for _ in range(rows))

    def _pixels(self, image, width: int, height: int):
        """The image sampled at width x height (nearest pixel: no resampling library involved), (3, h, w) in
        [0, 1], minus 0.5."""
        array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        rows = (np.arange(height) * image.height) // height
        columns = (np.arange(width) * image.width) // width
        return np.ascontiguousarray(array[rows][:, columns].transpose(2, 0, 1)) - 0.5

    def _views(self, image, max_slice_nums):
        """The source view (each side a multiple of patch_size) and the slices of the grid, row by row."""
        patch = self.patch_size
        side = max(round(math.sqrt(image.width * image.height) / patch), 1)
        scale = side * patch / math.sqrt(image.width * image.height)
        width = max(round(image.width * scale / patch), 1) * patch
        height = max(round(image.height * scale / patch), 1) * patch
        views = [self._pixels(image, width, height)]
        grid = self.get_sliced_grid(image.size, max_slice_nums)
        if grid is not None:
            columns, rows = grid
            refined = self._pixels(image, columns * patch * 2, rows * patch)
            views += [
                refined[:, r * patch : (r + 1) * patch, c * patch * 2 : (c + 1) * patch * 2]
                for r in range(rows)
                for c in range(columns)
            ]
        return views

    def __call__(self, images, do_pad=True, max_slice_nums=None, return_tensors=None, **kwargs):
        max_slice_nums = self.max_slice_nums if max_slice_nums is None else max_slice_nums
        rows = [images] if images and not isinstance(images[0], list) else images
        pixel_values, image_sizes, tgt_sizes = [], [], []
        for row in rows:
            values, sizes, targets = [], [], []
            for image in row:
                for view in self._views(image, max_slice_nums):
                    # (3, patch, h * w / patch): patches side by side, as MiniCPM-V's reshape_by_patch lays them
                    channels, height, width = view.shape
                    patches = view.reshape(channels, height // self.patch_size, self.patch_size, width)
                    values.append(
                        torch.from_numpy(np.ascontiguousarray(patches.transpose(0, 2, 1, 3))).reshape(
                            channels, self.patch_size, -1
                        )
                    )
                    targets.append([height // self.patch_size, width // self.patch_size])
                sizes.append(torch.tensor(image.size))
            pixel_values.append(values)
            image_sizes.append(sizes)
            tgt_sizes.append(torch.tensor(targets) if targets else [])
        return {"pixel_values": pixel_values, "image_sizes": image_sizes, "tgt_sizes": tgt_sizes}


class MiniCPMStandInFeatureExtractor:
    """MiniCPM-o's feature extractor's place (openbmb's is Whisper's): (FEATURES, frames) per waveform, one frame per
    hop_length samples (the last one zero-padded)."""

    hop_length = HOP

    def __call__(self, audio, sampling_rate=16000, **kwargs):
        frames = math.ceil(len(audio) / HOP)
        padded = np.zeros(frames * HOP, dtype=np.float32)
        padded[: len(audio)] = audio
        windows = padded.reshape(frames, HOP)
        stats = [windows.mean(1), np.abs(windows).mean(1), windows.max(1), windows.min(1)]
        return torch.from_numpy(np.stack(stats).astype(np.float32))


class MiniCPMStandInProcessor:
    """The processor: the image processor, the tokenizer, the feature extractor and MiniCPM-o's
    audio_feature_extract."""

    def __init__(self, image_processor, tokenizer):
        self.image_processor, self.tokenizer = image_processor, tokenizer
        self.feature_extractor = MiniCPMStandInFeatureExtractor()

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoProcessor"):
        """What transformers calls on a remote-code class it loads (ProcessorMixin records the auto class)."""
        cls._auto_class = auto_class

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        with open(os.path.join(path, "preprocessor_config.json")) as handle:
            config = json.load(handle)
        settings = {key: config[key] for key in SETTINGS}
        return cls(MiniCPMStandInImageProcessor(**settings), MiniCPMStandInTokenizer.from_pretrained(path))

    def save_pretrained(self, path, **kwargs):
        """preprocessor_config.json (the settings, auto_map naming this class) and this code file, as a model
        folder holds them (the trainers save the processor with each checkpoint)."""
        os.makedirs(path, exist_ok=True)
        module = os.path.splitext(os.path.basename(__file__))[0]
        config = {key: getattr(self.image_processor, key) for key in SETTINGS}
        config["auto_map"] = {"AutoProcessor": f"{module}.{type(self).__name__}"}
        with open(os.path.join(path, "preprocessor_config.json"), "w") as handle:
            json.dump({**config, "processor_class": type(self).__name__}, handle, indent=2)
        shutil.copyfile(__file__, os.path.join(path, os.path.basename(__file__)))

    def get_audio_placeholder(self, samples: int) -> str:
        tokens = math.ceil(math.ceil(samples / self.feature_extractor.hop_length) / FRAMES_PER_TOKEN)
        chunks = [min(CHUNK_TOKENS, tokens - start) for start in range(0, tokens, CHUNK_TOKENS)]
        return "".join("<|audio_start|>" + "<unk>" * count + "<|audio_end|>" for count in chunks)

    def audio_feature_extract(self, audios, chunk_input=False, sampling_rate=16000, **kwargs):
        rows = [audios] if len(audios) and isinstance(audios[0], np.ndarray) else audios
        placeholders = [[self.get_audio_placeholder(len(audio)) for audio in row] for row in rows]
        features, lengths = [], []
        for row in rows:
            row_features = [self.feature_extractor(audio, sampling_rate) for audio in row]
            features += row_features
            lengths.append(torch.tensor([item.shape[1] for item in row_features]) if row_features else [])
        if not features:
            return [], lengths, placeholders
        most = max(item.shape[1] for item in features)
        padded = torch.zeros(len(features), FEATURES, most)
        for index, item in enumerate(features):
            padded[index, :, : item.shape[1]] = item
        return padded, lengths, placeholders


def _init_config(self, vocab_size=600, hidden_size=16, patch_size=14, query_num=4, **kwargs):
    self.vocab_size, self.hidden_size, self.patch_size, self.query_num = vocab_size, hidden_size, patch_size, query_num
    PretrainedConfig.__init__(self, **kwargs)


class MiniCPMStandInConfig(PretrainedConfig):
    """A tiny model in MiniCPM-V's shape (model_type minicpmv: LLaMA-Factory's composite parts vpm, resampler, llm)."""

    model_type = "minicpmv"
    __init__ = _init_config


class MiniCPMOStandInConfig(PretrainedConfig):
    """The same model typed minicpmo (MiniCPM-o's type: transformers 5 loads its tokenizer's remote class, which it
    skips for minicpmv). Its own class, not a subclass: transformers 5 rebuilds a config subclass's fields."""

    model_type = "minicpmo"
    __init__ = _init_config


class MiniCPMStandInLanguageModel(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.mlp = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)


class MiniCPMStandInModel(PreTrainedModel, GenerationMixin):
    """MiniCPM-V's forward contract: one `data` dict (the collator's), each image or slice run between image_bound's
    positions replaced by query_num resampled vision features (vpm: a linear map of each patch column, averaged;
    resampler: to query_num embeddings), MiniCPM-o's audio runs (audio_bounds) by apm's tokens of the row's audio
    features (audio_feature_lens frames each); a causal LM head (no attention: each position sees its own embedding and
    the running mean of those before it), the mean cross-entropy of the shifted labels."""

    config_class = MiniCPMStandInConfig

    def __init__(self, config):
        super().__init__(config)
        width = 3 * config.patch_size
        self.vpm = torch.nn.Linear(width, config.hidden_size)
        self.apm = torch.nn.Linear(FEATURES * FRAMES_PER_TOKEN, config.hidden_size)
        self.resampler = torch.nn.Linear(config.hidden_size, config.query_num * config.hidden_size)
        self.llm = MiniCPMStandInLanguageModel(config)
        self.post_init()

    def _init_weights(self, module):
        """The weights are set from the folder (or by the test): nothing to draw here."""

    def get_input_embeddings(self):  # as MiniCPM-V's: the language model's
        return self.llm.embed_tokens

    def set_input_embeddings(self, value):
        self.llm.embed_tokens = value

    def vision_features(self, pixels):
        columns = pixels.reshape(-1, pixels.shape[-1]).T  # (columns, 3 * patch)
        pooled = self.vpm(columns).mean(0)
        return self.resampler(pooled).reshape(self.config.query_num, self.config.hidden_size)

    def audio_tokens(self, features, frames: int):
        """One embedding per FRAMES_PER_TOKEN frames of one audio's (FEATURES, frames) features (apm)."""
        tokens = math.ceil(frames / FRAMES_PER_TOKEN)
        padded = torch.zeros(FEATURES, tokens * FRAMES_PER_TOKEN, dtype=features.dtype, device=features.device)
        padded[:, :frames] = features[:, :frames]
        return self.apm(padded.T.reshape(tokens, -1))

    def forward(self, data, **kwargs):
        from transformers.modeling_outputs import CausalLMOutput

        embeds = self.llm.embed_tokens(data["input_ids"]).clone()
        for row, (slices, bounds) in enumerate(zip(data["pixel_values"], data["image_bound"])):
            for pixels, (start, end) in zip(slices, bounds.tolist()):
                embeds[row, start:end] = self.vision_features(pixels.to(embeds.dtype))
        if "audio_bounds" in data:  # MiniCPM-o: each row's audios' tokens fill its audio runs in order
            audio = 0
            for row, (lengths, bounds) in enumerate(zip(data["audio_feature_lens"], data["audio_bounds"])):
                features = data["audio_features"].to(embeds.dtype)
                tokens = [self.audio_tokens(features[audio + k], int(n)) for k, n in enumerate(lengths.tolist())]
                audio += len(tokens)
                if tokens:
                    flat, used = torch.cat(tokens), 0
                    for start, end in bounds.tolist():
                        embeds[row, start:end] = flat[used : used + end - start]
                        used += end - start
        steps = torch.arange(1, embeds.shape[1] + 1, device=embeds.device).view(1, -1, 1)
        hidden = torch.tanh(self.llm.mlp(embeds + embeds.cumsum(1) / steps))
        logits = self.llm.lm_head(hidden)
        labels = data["labels"]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        return CausalLMOutput(loss=loss, logits=logits)


class MiniCPMOStandInModel(MiniCPMStandInModel):
    """The model of MiniCPMOStandInConfig (transformers checks a model's config_class against its config)."""

    config_class = MiniCPMOStandInConfig
