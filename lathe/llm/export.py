"""`lathe export CONFIG`: a self-contained model folder from a training run, checked before it is
called done.

    base model (+ LoRA adapters, merged in float32) -> cast to the export dtype
    -> safetensors shards of at most export_size GB (+ index) -> tokenizer with the template's
       chat_template and EOS -> generation_config.json with the template's stop tokens
    -> verification: each merge equals base + adapter on probe prompts and changes the base; the
       folder, loaded back with transformers, gives the merged model's logits.

What goes wrong elsewhere and is checked here: a merge that silently changes nothing (an untrained
or mismatched adapter), a served model that never stops (EOS of the template not in
generation_config), a chat_template that renders differently from training.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

PROBE_MESSAGES = (
    [{"role": "user", "content": "Hello! Who are you?"}],
    [{"role": "user", "content": "Reverse the string: lathe"}],
    [
        {"role": "user", "content": "1 + 1 ="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And 2 + 2?"},
    ],
)
# Merged vs unmerged LoRA in float32 differ by rounding only; a real adapter moves logits by far more.
MERGE_TOLERANCE = 1e-3
CHANGE_THRESHOLD = 1e-5


@dataclass
class ExportReport:
    export_dir: str
    dtype: str
    shards: int
    bytes: int
    merged_adapters: list[str]
    merge_error: float | None  # max |merged - base+adapter| over the probes (relative to the logits' scale)
    change_from_base: float | None  # max |merged - base| over the probes
    reload_error: float  # max |exported folder - merged model|, in the export dtype
    dequantized: str | None = None  # the quantization the base was loaded with and dequantized from (quantization_bit)
    processor_saved: bool = False  # a vision-language model's processor files (preprocessor_config.json, ...)
    gguf_files: list = field(default_factory=list)  # (GGUFFile, Modelfile path) per export_gguf type


def export_command(config_path, overrides: list[str]) -> ExportReport:
    from lathe.llm.inference.config import parse_infer_config

    config = parse_infer_config(config_path, overrides, command="export")
    return export_model(config)


def export_model(config) -> ExportReport:

    from lathe.llm.inference.loading import load_for_inference

    export_dir = config.export.export_dir
    if not export_dir:
        raise ValueError("export_dir is required: the folder to write the exported model into.")
    if os.path.isdir(export_dir) and os.listdir(export_dir):
        raise ValueError(f"export_dir {export_dir!r} is not empty: choose a new folder (nothing is overwritten).")
    from lathe.llm.hub import adapter_folders

    if config.export.export_gguf:
        from lathe.llm.gguf.writer import check_gguf_types

        # a missing package or an architecture llama.cpp does not run is said before the merge, not after
        check_gguf_types(config.export.export_gguf, config.model.model_name_or_path)

    adapters = adapter_folders(config.model)
    device = _export_device(config.export.export_device)

    # Float32 for the merge: merging a low-rank update into half-precision weights rounds it away.
    model, tokenizer, template = load_for_inference(config, dtype="float32", with_adapters=False)
    model, dequantized = _dequantized(model, config.model)
    model.to(device)
    probes = _probe_inputs(tokenizer, template, device, config, model)
    merge_error = change = None
    if adapters:
        model, merge_error, change = _merge_adapters(model, adapters, probes)
    merged_logits = _logits(model, probes)

    dtype = _export_dtype(config.model, model)
    model = model.to(dtype)
    model.config.dtype = dtype
    processor_saved = _write(
        model, tokenizer, template, export_dir, config.export.export_size, config.data.template, config.model
    )
    if config.finetuning.stage == "rm":
        _copy_value_head(config.model, export_dir)
    reload_error = _check_reloaded(export_dir, probes, merged_logits, dtype, device)
    shards, size = _shard_facts(export_dir)
    gguf_files = []
    if config.export.export_gguf:
        from lathe.llm.gguf import export_gguf

        gguf_files = export_gguf(export_dir, config.export.export_gguf, template, tokenizer)
    return ExportReport(
        export_dir,
        str(dtype).replace("torch.", ""),
        shards,
        size,
        adapters,
        merge_error,
        change,
        reload_error,
        dequantized,
        processor_saved,
        gguf_files,
    )


def _dequantized(model, model_args):
    """A base loaded quantized (quantization_bit, or a pre-quantized checkpoint) as plain float32 layers holding
    the dequantized weights: the weights a QLoRA adapter was trained on, so the merge is exactly what was
    trained. (Without quantization_bit, an adapter merges into the checkpoint's full-precision weights,
    as in LLaMA-Factory; they differ from the trained base by the quantization error.)"""
    import torch

    from lathe.llm.model.quantization import dequantize, is_quantized

    if not is_quantized(model):
        return model, None
    method = getattr(model, "quantization_method", None)
    described = (
        f"{model_args.quantization_bit}-bit {model_args.quantization_method}"
        if model_args.quantization_bit
        else str(method)
    )
    try:
        model = dequantize(model, torch.float32)
    except (NotImplementedError, ValueError, AttributeError) as error:
        raise ValueError(
            f"This {described} model cannot be dequantized for export ({error}): export from the "
            "full-precision base instead (without quantization_bit)."
        ) from error
    logger.info("Merging into the dequantized %s base.", described)
    return model, described


def _export_device(name: str):
    import torch

    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu")


def _probe_inputs(tokenizer, template, device, config=None, model=None) -> list[dict]:
    """A few conversations rendered by the template up to the assistant's turn (what a served model sees), as
    the model's inputs; for a vision-language model one more with an image, so the vision tower is checked too."""
    import torch

    from lathe.llm.inference.vision import image_probe

    rows = []
    for messages in PROBE_MESSAGES:
        prompt_ids, _ = template.encode_oneturn(tokenizer, list(messages) + [{"role": "assistant", "content": ""}])
        rows.append({"input_ids": torch.tensor([prompt_ids])})
    with_image = image_probe(config, model, tokenizer, template) if model is not None else None
    if with_image is not None:
        rows.append(with_image)
    return [{key: value.to(device) for key, value in row.items()} for row in rows]


def _logits(model, probes) -> list:
    import torch

    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        return [
            model(
                **{key: value.to(dtype) if value.is_floating_point() else value for key, value in probe.items()}
            ).logits.float()
            for probe in probes
        ]


def _max_difference(first: list, second: list) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(first, second))


def _scale(logits: list) -> float:
    return max(1.0, max(float(row.abs().max()) for row in logits))


def _merge_adapters(model, adapters: list[str], probes):
    """Merge each adapter in order, checking that merged == base + adapter, and that it changed something."""
    from pathlib import Path

    from lathe.llm.model.lora import import_peft

    PeftModel = import_peft().PeftModel

    worst_error, smallest_change = 0.0, None
    for adapter in adapters:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"adapter_name_or_path: {adapter!r} has no adapter_config.json (a peft LoRA adapter folder is expected)."
            )
        before = _logits(model, probes)
        with_adapter = PeftModel.from_pretrained(model, adapter)
        unmerged = _logits(with_adapter, probes)
        model = with_adapter.merge_and_unload()
        merged = _logits(model, probes)
        error = _max_difference(merged, unmerged) / _scale(unmerged)
        change = _max_difference(merged, before)
        if error > MERGE_TOLERANCE:
            raise RuntimeError(
                f"Merging {adapter!r} changed the model's outputs: merged vs base + adapter differ by "
                f"{error:.2e} (relative; tolerance {MERGE_TOLERANCE}). Nothing was exported."
            )
        if change <= CHANGE_THRESHOLD:
            raise RuntimeError(
                f"The adapter {adapter!r} changes nothing: the merged model's logits equal the base "
                f"model's (max difference {change:.1e}). Was it trained, and for this base model "
                f"({adapter_base(adapter)})? Nothing was exported."
            )
        worst_error = max(worst_error, error)
        smallest_change = change if smallest_change is None else min(smallest_change, change)
        logger.info(
            "Merged %s: max |merged - (base + adapter)| = %.2e (relative), max change from the base %.3g",
            adapter,
            error,
            change,
        )
    return model, worst_error, smallest_change


def adapter_base(adapter: str) -> str:
    try:
        with open(os.path.join(adapter, "adapter_config.json"), encoding="utf-8") as f:
            return f"trained on {json.load(f).get('base_model_name_or_path')!r}"
    except (OSError, ValueError):
        return "base model unknown"


def _export_dtype(model_args, model):
    """infer_dtype when set; else the dtype the base checkpoint was saved in (float32 if unknown)."""
    import torch

    if model_args.infer_dtype != "auto":
        return getattr(torch, model_args.infer_dtype)
    from lathe.llm.model.loader import load_config

    saved = getattr(load_config(model_args), "dtype", None)
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    return saved if isinstance(saved, torch.dtype) else torch.float32


def _copy_value_head(model_args, export_dir: str) -> None:
    """A reward model's value_head.safetensors, from the last adapter folder or else the model folder
    (LLaMA-Factory's export with stage: rm does the same)."""
    import shutil

    from lathe.llm.hub import adapter_folders, model_folder
    from lathe.llm.model.value_head import VALUE_HEAD_FILE

    source = (adapter_folders(model_args) or [model_folder(model_args)])[-1]
    path = os.path.join(source, VALUE_HEAD_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"stage: rm, but {source} has no {VALUE_HEAD_FILE}: it is not a reward model's output.")
    shutil.copy(path, os.path.join(export_dir, VALUE_HEAD_FILE))
    logger.info("Copied the value head to %s", export_dir)


def _write(model, tokenizer, template, export_dir: str, export_size: float, template_name, model_args=None) -> bool:
    """Weights, processor files (a vision-language model's; True when written), tokenizer and chat_template."""
    from lathe.llm.inference.vision import save_processor
    from lathe.llm.workflows.outputs import set_stop_tokens

    os.makedirs(export_dir, exist_ok=True)
    set_stop_tokens(model, tokenizer, template)
    # safetensors, one shard up to export_size GB (transformers writes the index when there are several)
    model.save_pretrained(export_dir, max_shard_size=max(1, int(export_size * 10**9)))
    if template_name is not None:
        # The folder's chat_template renders conversations as lathe's template did in training: the model's own
        # when it does (it may render more, e.g. tools), else the template's. (With no template named, the
        # template was parsed from, and checked against, the tokenizer's own.)
        from lathe.llm.templates.check import chat_template_differences

        own = tokenizer.chat_template
        if not isinstance(own, str) or chat_template_differences(template, tokenizer):
            tokenizer.chat_template = template.jinja_chat_template(tokenizer)
            if isinstance(own, str):
                logger.warning(
                    "The tokenizer's chat_template renders conversations differently from template %r: "
                    "the exported folder gets the template's chat_template instead.",
                    template_name,
                )
        from lathe.llm.templates.jinja_tools import JINJA_TOOL_FORMATS, renders_tools

        # lathe's own chat_template (not the model's): a model trained on tool calls could not be given tools.
        if not renders_tools(template) and tokenizer.chat_template == template.jinja_chat_template(tokenizer):
            logger.warning(
                "The exported chat_template does not render tools: tool_format %r of template %r is not "
                "written as Jinja (%s are), so apply_chat_template(..., tools=...) and servers reading it raise "
                "when given tools; lathe chat / lathe api render them as in training.",
                template.tool_format,
                template_name,
                ", ".join(JINJA_TOOL_FORMATS),
            )
    processor_saved = model_args is not None and save_processor(model_args, model, export_dir)
    tokenizer.save_pretrained(export_dir)  # after the processor: these tokenizer files and chat_template win
    return processor_saved


def _check_reloaded(export_dir: str, probes, merged_logits, dtype, device) -> float:
    """Load the folder as any user would and compare its logits with the merged model's."""
    import torch
    from transformers import AutoConfig

    from lathe.llm.model.loader import auto_model_class

    # AutoModelForCausalLM, or AutoModelForImageTextToText for a vision-language model (Qwen2-VL, ...)
    model_class = auto_model_class(AutoConfig.from_pretrained(export_dir, local_files_only=True))
    reloaded = model_class.from_pretrained(export_dir, dtype=dtype, local_files_only=True).to(device).eval()
    error = _max_difference(_logits(reloaded, probes), merged_logits) / _scale(merged_logits)
    # A cast to half precision moves logits by about its precision; a wrong or missing tensor, by far more.
    tolerance = MERGE_TOLERANCE if dtype == torch.float32 else 5e-2
    if error > tolerance:
        raise RuntimeError(
            f"The exported model in {export_dir!r} does not reproduce the merged model: logits differ by "
            f"{error:.2e} (relative; tolerance {tolerance}). Do not use it."
        )
    return error


def _shard_facts(export_dir: str) -> tuple[int, int]:
    files = [name for name in os.listdir(export_dir) if name.endswith(".safetensors")]
    return len(files), sum(os.path.getsize(os.path.join(export_dir, name)) for name in files)


def format_report(report: ExportReport) -> str:
    lines = [
        f"Exported to {report.export_dir}: {report.shards} safetensors shard(s), {report.bytes / 1e6:,.1f} MB, {report.dtype}"
    ]
    if report.dequantized:
        lines.append(
            f"  base            dequantized from {report.dequantized} (the weights the adapter was trained on)"
        )
    if report.merged_adapters:
        lines.append(f"  merged          {', '.join(report.merged_adapters)}")
        lines.append(
            f"  merge check     merged = base + adapter within {report.merge_error:.1e} (relative); "
            f"changes the base by up to {report.change_from_base:.3g}"
        )
    if report.processor_saved:
        lines.append("  processor       image processor (preprocessor_config.json) saved beside the tokenizer")
    lines.append(
        f"  reload check    the folder loads with transformers and gives the merged logits within {report.reload_error:.1e}"
    )
    if report.gguf_files:
        from lathe.llm.gguf import run_commands

        for gguf_file, modelfile_path in report.gguf_files:
            lines.append(f"  gguf            {gguf_file.path} ({gguf_file.type}, {gguf_file.bytes / 1e6:,.1f} MB)")
            lines.append(f"  ollama          {modelfile_path}")
        lines.append("  run it with     " + "\n                  ".join(run_commands(*report.gguf_files[0])))
    return "\n".join(lines)
