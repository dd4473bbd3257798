"""lathe against LLaMA-Factory on a tiny Gemma 3n (tests/llm/golden/llamafactory_gemma3n.json, made by
make_llamafactory_gemma3n.py), run by tests/llm/test_multimodal_gemma3n.py in one subprocess with the torchvision test
recipe and timm (Gemma 3n's vision tower is timm's MobileNetV5): per batch of the image-and-audio row and the row
without media, lathe's collated ids and labels and the model's loss on them; and `lathe train`'s cases."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from tests.llm.video_check import HERE, _module

GEN = _module("make_gemma3n", HERE / "golden" / "make_llamafactory_gemma3n.py")


def losses() -> dict:
    """batch name -> {keys, input_ids, labels, loss} of lathe's plugin and collator on the generator's rows, and
    the model's weight sum (the golden's loss is comparable where both transformers draw one model)."""
    import torch

    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED
    from lathe.llm.multimodal.plugins import plugin_class
    from lathe.llm.templates import get_template_and_fix_tokenizer

    families = GEN.FAMILIES
    tokenizer = GEN.make_tokenizer()
    processor = GEN.make_processor(tokenizer)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.TEMPLATE))
    plugin = plugin_class("gemma3n")(processor, tokenizer, MediaSettings(**families.settings_of("gemma3n")))
    model = GEN.make_model(tokenizer)
    features = []
    for row in GEN.ROWS:
        given = families.media_of("gemma3n", row)
        media = {kind: given[f"{kind}s"] for kind in ("image", "audio") if given[f"{kind}s"]}
        messages = [
            {**message, EXPANDED: True} for message in plugin.process_messages(families.messages_of(row), media)
        ]
        ids, labels = encode_supervised_example(
            messages[:-1], messages[-1:], "", "", template, tokenizer, families.CUTOFF_LEN
        )
        feature = {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)}
        features.append({**feature, **{f"{kind}s": items for kind, items in media.items()}})
    collator = MultimodalCollator(SFTDataCollator(tokenizer, model=model, pad_to_multiple_of=8), plugin, model)
    out = {"weights": GEN.weights_sum(model), "batches": {}, "lora_all": lora_all_refusal(model)}
    for name, indexes in GEN.batch_names().items():
        batch = collator([dict(features[index]) for index in indexes])
        with torch.no_grad():
            loss = model(**batch).loss.item()
        out["batches"][name] = {
            "keys": sorted(batch),
            "input_ids": batch["input_ids"].tolist(),
            "labels": batch["labels"].tolist(),
            "loss": loss,
        }
    return out


def lora_all_refusal(model) -> str:
    """lathe's answer to `lora_target: all` on this model (LLaMA-Factory stops on it: the golden's gemma3n_lora),
    asked of the loaded model directly rather than by a training run that stops there."""
    from types import SimpleNamespace

    from lathe.llm.model.lora import resolve_targets

    args = SimpleNamespace(
        finetuning_type="lora",
        lora_target=["all"],
        use_llama_pro=False,
        freeze_vision_tower=True,
        freeze_multi_modal_projector=True,
        freeze_language_model=False,
    )
    try:
        resolve_targets(model, args)
    except ValueError as error:
        return str(error)
    return "accepted"


def train(root: str) -> dict:
    """`lathe train` on the generator's folders and cases that LLaMA-Factory trains: per case the logged losses and
    grad norms and the trainable and total parameter counts."""
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    from tests.llm.train_counts import ParameterCount

    results, folders = {}, GEN.write_folders(Path(root), fix_tokenizer)
    for name, keys in GEN.CASES.items():
        if name in GEN.STOPS:  # LLaMA-Factory stops there: lora_all_refusal asks lathe without a run
            continue
        count, output = ParameterCount(), Path(root) / name
        run_train(parse_train_config(GEN.train_config(*folders, output, **keys)), callbacks=[count])
        history = json.loads((output / "trainer_state.json").read_text())["log_history"]
        results[name] = {
            "loss": [entry["loss"] for entry in history if "loss" in entry],
            "grad_norm": [entry["grad_norm"] for entry in history if "loss" in entry],
            "trainable": count.counts[0],
            "total": count.counts[1],
        }
    return results


def run(root: str) -> None:
    """Prints {"losses": ..., "train": ...}: each part's result or the traceback that stopped it."""
    out = {}
    for part, function in {"losses": losses, "train": lambda: train(root)}.items():
        try:
            out[part] = function()
        except Exception:  # noqa: BLE001 (reported to the test that reads this part)
            out[part] = {"error": traceback.format_exc()}
    print(json.dumps(out))
