"""Shared by the multimodal training tests and the LLaMA-Factory golden generator: a tiny Qwen2-VL model folder
(random weights from a config, the committed BPE tokenizer plus the vision tokens, the PIL image processor), images
drawn here, and a data folder in LLaMA-Factory's mllm demo shape (sharegpt messages + an images column)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

GOLDEN_DIR = Path(__file__).parent / "golden"


def generator():
    """tests/llm/golden/make_llamafactory_qwen2vl.py as a module (the model, tokenizer and images it makes)."""
    spec = importlib.util.spec_from_file_location("make_qwen2vl", GOLDEN_DIR / "make_llamafactory_qwen2vl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (messages, images): the demo shape of LLaMA-Factory's mllm_demo (sharegpt with role/content tags)
ROWS = [
    ([("user", "<image>Who are they?"), ("assistant", "The quick brown fox.")], ["wide.png"]),
    ([("user", "Compare <image> and <image> ."), ("assistant", "Two plus two is four.")], ["small.png", "large.png"]),
    (
        [("user", "<image>hello"), ("assistant", "four"), ("user", "What is two plus two?"), ("assistant", "four")],
        ["square.png"],
    ),
    ([("user", "What is two plus two?"), ("assistant", "Two plus two is four.")], []),
]
TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
# preference rows: (prompt, chosen, rejected, images); kto rows: (prompt, answer, desirable, images)
PAIRS = [
    ("<image>Who are they?", "The quick brown fox.", "four", ["wide.png"]),
    ("Compare <image> and <image> .", "Two plus two is four.", "hello", ["small.png", "large.png"]),
    ("<image>What is two plus two?", "four", "The quick brown fox.", ["square.png"]),
    ("What is two plus two?", "Two plus two is four.", "five", []),
]
INFO = {
    "mllm_video_demo": {
        "file_name": "mllm_video_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "videos": "videos"},
        "tags": TAGS,
    },
    "identity": {"file_name": "identity.json"},
    "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
    "rlhf_v": {
        "file_name": "rlhf_v.json",
        "ranking": True,
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected", "images": "images"},
    },
    "mllm_pairs": {
        "file_name": "mllm_pairs.json",
        "formatting": "sharegpt",
        "ranking": True,
        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected", "images": "images"},
        "tags": {**TAGS, "role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"},
    },
    "mllm_kto": {
        "file_name": "mllm_kto.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "kto_tag": "label", "images": "images"},
        "tags": TAGS,
    },
    "text_demo": {
        "file_name": "text_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    },
    "mllm_demo": {
        "file_name": "mllm_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    },
}


def make_model(tokenizer, model_type: str = "qwen2_vl"):
    """A tiny random model of the family's class: Qwen2-VL (the golden generator's), Qwen2.5-VL or Qwen3-VL."""
    gen = generator()
    if model_type == "qwen2_vl":
        return gen.make_model(tokenizer)
    import torch
    import transformers

    ids = dict(zip(gen.VISION_TOKENS, tokenizer.convert_tokens_to_ids(gen.VISION_TOKENS)))
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
    }
    tokens = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    if model_type == "qwen2_5_vl":
        text["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 1, 1]}
        vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
        vision.update(window_size=56, fullatt_block_indexes=[1])
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
        cls = transformers.Qwen2_5_VLForConditionalGeneration
    else:
        text.update(
            head_dim=8, rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True}
        )
        vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
        vision.update(patch_size=16, num_position_embeddings=16, deepstack_visual_indexes=[0])
        config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **tokens)
        cls = transformers.Qwen3VLForConditionalGeneration
    torch.manual_seed(0)
    return cls(config).eval()


def make_image_processor(model_type: str = "qwen2_vl"):
    gen = generator()
    if model_type != "qwen3_vl":
        return gen.make_image_processor()
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor(patch_size=16, min_pixels=32 * 32, max_pixels=32 * 32 * 64)


def make_model_folder(path: Path, model_type: str = "qwen2_vl") -> Path:
    tokenizer = generator().make_tokenizer()
    make_model(tokenizer, model_type).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    make_image_processor(model_type).save_pretrained(str(path))
    return path


def make_data_folder(path: Path, rows=ROWS) -> Path:
    gen = generator()
    (path / "images").mkdir(parents=True, exist_ok=True)
    for name in gen.IMAGE_SIZES:
        gen.make_image(name).save(path / "images" / f"{name}.png")
    data = [
        {
            "messages": [{"role": role, "content": content} for role, content in messages],
            "images": [f"images/{name}" for name in images],
        }
        for messages, images in rows
    ]
    (path / "mllm_demo.json").write_text(json.dumps(data, indent=1))
    pairs = [
        {
            "conversations": [{"from": "human", "value": prompt}],
            "chosen": {"from": "gpt", "value": chosen},
            "rejected": {"from": "gpt", "value": rejected},
            "images": [f"images/{name}" for name in images],
        }
        for prompt, chosen, rejected, images in PAIRS
    ]
    (path / "mllm_pairs.json").write_text(json.dumps(pairs, indent=1))
    kto = [
        {
            "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
            "label": index % 2 == 0,
            "images": [f"images/{name}" for name in images],
        }
        for index, (prompt, answer, _, images) in enumerate(PAIRS)
    ]
    (path / "mllm_kto.json").write_text(json.dumps(kto, indent=1))
    # LLaMA-Factory's rlhf_v registry entry (a hub dataset there; a file of rows made here) and the two text demos
    (path / "rlhf_v.json").write_text(json.dumps([{k: v for k, v in row.items()} for row in pairs], indent=1))
    identity = [
        {"instruction": f"Who are you? ({i})", "input": "", "output": f"I am a tiny model, {i}."} for i in range(3)
    ]
    alpaca = [{"instruction": f"Add {i} and 1.", "input": "", "output": f"It is {i + 1}."} for i in range(3)]
    from tests.llm.media_files import write_video

    write_video(path / "clip.mp4", 64, 48, 13, 5)
    video = {"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "x"}]}
    (path / "mllm_video_demo.json").write_text(json.dumps([{**video, "videos": ["clip.mp4"]}]))
    (path / "identity.json").write_text(json.dumps(identity))
    (path / "alpaca_en_demo.json").write_text(json.dumps(alpaca))
    text = [{"messages": row["messages"]} for row in data if not row["images"]] * 4
    (path / "text_demo.json").write_text(json.dumps(text, indent=1))
    (path / "dataset_info.json").write_text(json.dumps(INFO, indent=1))
    return path


def train_config(model: Path, data: Path, output: Path, **keys) -> dict:
    """LLaMA-Factory's qwen2_vl full sft settings, three steps of two rows, on CPU."""
    return {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "mllm_demo",
        "dataset_dir": str(data),
        "template": "qwen2_vl",
        "cutoff_len": 1024,
        "image_max_pixels": 40 * 40,
        "image_min_pixels": 16 * 16,
        "output_dir": str(output),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-2,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "use_cpu": True,
        "preprocessing_num_workers": None,
        "dataloader_num_workers": 0,
        **keys,
    }
