"""A tiny vision-language example: a Qwen2-VL of about 0.3M parameters built from a config (random weights:
`train_from_scratch: true`), a character-level tokenizer with Qwen2-VL's vision tokens, the image processor, and
colour swatches with "What colour is this?" rows in LLaMA-Factory's mllm_demo shape. Nothing is downloaded.

    python examples/vision/make_assets.py            # writes examples/vision/model and examples/vision/data
    lathe train examples/vision.yaml                  # sft on CPU (about a minute)
    lathe chat examples/vision.yaml                   # then: /image examples/vision/data/images/red_0.png
                                                      #       What colour is this?

The output is deterministic (seeded); the files are not committed: run this first.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
IMAGES_PER_COLOUR, SIZE = 8, 28  # a 28x28 image is one vision token after the 2x2 merge
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VISION = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
WORDS = ["system", "user", "assistant"]
CHARACTERS = ["\n"] + [chr(code) for code in range(32, 127)]


def build_tokenizer():
    """Characters as tokens (plus the chat and vision tokens): small, lossless, and no download."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL + VISION + WORDS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(rf"{'|'.join(WORDS)}|[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in SPECIAL + VISION])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", *VISION],
        clean_up_tokenization_spaces=False,
    )


def build_config(tokenizer):
    from transformers import Qwen2VLConfig

    ids = dict(zip(VISION, tokenizer.convert_tokens_to_ids(VISION)))
    return Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]},
            "max_position_embeddings": 256,
            "tie_word_embeddings": True,
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None,
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def write_assets(root: Path = HERE) -> None:
    from PIL import Image
    from transformers import Qwen2VLImageProcessor

    model, data = Path(root) / "model", Path(root) / "data"
    (data / "images").mkdir(parents=True, exist_ok=True)
    model.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(model))
    build_config(tokenizer).save_pretrained(str(model))
    Qwen2VLImageProcessor(min_pixels=SIZE * SIZE, max_pixels=SIZE * SIZE).save_pretrained(str(model))
    rng, rows = random.Random(0), []
    for colour, rgb in COLOURS.items():
        for index in range(IMAGES_PER_COLOUR):  # the colour, a little noise on each pixel
            pixels = [tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in rgb) for _ in range(SIZE * SIZE)]
            image = Image.new("RGB", (SIZE, SIZE))
            image.putdata(pixels)
            image.save(data / "images" / f"{colour}_{index}.png")
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": "<image>What colour is this?"},
                        {"role": "assistant", "content": colour},
                    ],
                    "images": [f"images/{colour}_{index}.png"],
                }
            )
    rng.shuffle(rows)
    (data / "colours.json").write_text(json.dumps(rows, indent=1))
    info = {
        "colours": {
            "file_name": "colours.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "images": "images"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
        }
    }
    (data / "dataset_info.json").write_text(json.dumps(info, indent=2))
    print(f"wrote {model} ({len(tokenizer)} tokens) and {data} ({len(rows)} rows)")


if __name__ == "__main__":
    write_assets(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
