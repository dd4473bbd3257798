"""`lathe train` and `lathe data preview`: read the config, print what will happen, hand over to the
stage's recipe. Imported only when one of these commands runs (it pulls in transformers)."""

from __future__ import annotations

import errno
import logging
import os
import sys

from lathe.llm.workflows.stages import run_train

__all__ = [
    "train_command",
    "data_preview_command",
    "export_command",
    "expand_command",
    "chat_command",
    "api_command",
    "webui_command",
    "run_train",
]

# Errors that mean "the config or the files are wrong": shown as one message, not a traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, ImportError)
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _setup_logging() -> None:
    import warnings

    logging.basicConfig(level=logging.INFO, format="[%(levelname)s|%(name)s] %(message)s", stream=sys.stderr)
    # peft still calls the transformers-4 name; the warning says nothing a lathe user can act on.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    try:
        import transformers

        transformers.logging.set_verbosity_warning()
    except ImportError:
        pass


def _report(error: BaseException, command: str) -> int:
    print(f"lathe {command}: error: {error}", file=sys.stderr)
    if os.environ.get("LATHE_LAUNCH_ERRORS"):  # a rank under `lathe train`'s torchrun: the launcher prints it last
        from lathe.llm.launch.torchrun import record_error

        record_error(f"lathe {command}: error: {error}")
    for note in getattr(error, "__notes__", []):
        print(note, file=sys.stderr)
    print(f"(run `lathe {command} ... --traceback` to see where it happened)", file=sys.stderr)
    return 2


def _reported(command: str, traceback: bool, run, errors: tuple = USER_ERRORS) -> int:
    """run()'s exit code; an error that means "the config or the files are wrong" is one message and exit
    code 2 instead of a traceback (unless --traceback)."""
    _setup_logging()
    try:
        return run()
    except errors as error:
        if traceback:
            raise
        return _report(error, command)
    except OSError as error:  # a full disk (or quota, or file size limit): the file and what is intact, no traceback
        if traceback or error.errno not in DISK_FULL:
            raise
        return _report(error, command)
    except RuntimeError as error:  # torch.save's full disk, explained in notes by the checkpoint writer
        if traceback or getattr(error, "disk_errno", None) not in DISK_FULL:
            raise
        notes = " ".join(getattr(error, "__notes__", []))
        print(f"lathe {command}: error: {os.strerror(error.disk_errno)}. {notes} Cause: {error}", file=sys.stderr)
        return 2


def train_command(
    config_path: str, overrides: list[str], dry_run: bool = False, traceback: bool = False, verbose: bool = False
) -> int:
    """`lathe train CONFIG [key=value ...]`: print the resolved configuration and the plan, then train. With
    `verbose`, third-party services' own INFO logs (Ray's) are shown too."""
    from lathe.llm.config.sections import hub_from_environment
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.config.values import RawConfig
    from lathe.llm.hub import resolve_config, resolve_raw_config
    from lathe.llm.launch.startup import StartupCollector
    from lathe.llm.launch.stopping import Interrupted, StopOnSignal, TrainingStopped
    from lathe.llm.launch.torchrun import launch_settings, planned_processes, ray_wanted, relaunch
    from lathe.llm.workflows.plan import format_config, print_once

    def train() -> int:
        raw = RawConfig(config_path, overrides)  # the one read of the file: every step below takes its values
        settings = None if dry_run else launch_settings(raw.values)
        if settings is not None:
            resolve_raw_config(raw.values, hub_from_environment())  # once, not per rank
        if not dry_run and ray_wanted():  # USE_RAY=1: Ray Train's workers run the ranks
            from lathe.llm.launch.ray_train import run_with_ray

            return run_with_ray(raw, config_path, overrides, verbose=verbose)
        if settings is not None:  # under torchrun when several processes are asked for
            return relaunch(settings, config_path, overrides)
        # Ctrl-C / SIGTERM: stop after the step, save a checkpoint, say how to resume (lathe/llm/launch/stopping.py).
        # Not on several processes: they would stop at different steps and wait on each other forever.
        # The imports until training begins run without the collector's full scans (lathe/llm/launch/startup.py).
        stop = StopOnSignal(config_path, overrides, enabled=int(os.environ.get("WORLD_SIZE", "1")) == 1)
        with StartupCollector() as startup, stop:
            try:
                config = parse_train_config(raw)
                # hub ids: found (or downloaded) before the configuration and the plan are printed
                resolve_config(config)
                if dry_run:  # plan for the processes a real run would start (per process: memory, batch)
                    config.processes = planned_processes(raw.values)
                print_once(config, format_config(config))
                run_train(config, dry_run=dry_run, callbacks=[*stop.callbacks(), startup])
            except (Interrupted, TrainingStopped) as stopped:
                return stop.report(stopped)
        if dry_run:
            print("Dry run: nothing was trained.")
        return 0

    return _reported("train", traceback, train)


DUMP_STAGES = ("sft", "pt")


def _training_collator(config, tokenizer, media=None):
    """The collator the stage trains with, for `--dump` (the model on the meta device: its config and
    attention implementation are all a collator reads)."""
    if config.finetuning.stage == "pt":
        from lathe.llm.workflows.pt import PretrainCollator

        return PretrainCollator(tokenizer)
    from lathe.llm.model.loader import load_model
    from lathe.llm.workflows.sft import make_collator

    model = load_model(tokenizer, config.model, config.finetuning, is_trainable=config.training.do_train, meta=True)
    return make_collator(config, tokenizer, model, media)


def data_preview_command(
    config_path: str,
    overrides: list[str],
    num_examples: int = 3,
    split: str = "train",
    traceback: bool = False,
    dump: str | None = None,
) -> int:
    """`lathe data preview CONFIG`: the template, its stop tokens and whether the chat_template saved with the
    model agrees with it; then a few tokenized examples with the trained spans marked, and (sft) the rows cutoff_len
    cuts through media and those it leaves with no trained token, row by row (row_notes.py). With `dump`, every
    example of the split and the training collator's tensors are written there (lathe/llm/data/dump.py)."""
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.templates.check import template_report

    def preview() -> int:
        config = parse_train_config(config_path, overrides)
        if dump and config.finetuning.stage not in DUMP_STAGES:  # before the data is read
            raise ValueError(f"lathe data preview --dump supports stage sft and pt, not {config.finetuning.stage!r}.")
        tokenizer = load_tokenizer(config.model)
        template = get_template_and_fix_tokenizer(tokenizer, config.data)
        print(template_report(template, tokenizer))
        from lathe.llm.multimodal.encode import MediaEncoder

        media = MediaEncoder.for_run(template, tokenizer, config.model)
        datasets = get_dataset(
            template,
            config.model,
            config.data,
            config.training,
            stage=config.finetuning.stage,
            tokenizer=tokenizer,
            media=media,
        )
        dataset = datasets["train_dataset"] if split == "train" else datasets["eval_dataset"]
        if dataset is None:
            raise ValueError(f"the config gives no {split} split (eval needs val_size or eval_dataset).")
        print_preview(config, datasets, dataset, split, tokenizer, num_examples)
        if dump:
            from lathe.llm.data.dump import dump_examples

            if isinstance(dataset, dict):
                raise ValueError("--dump writes one split: with eval_on_each_dataset, dump the train split.")
            counts = dump_examples(dataset, _training_collator(config, tokenizer, media), dump)
            print(
                f"Wrote {counts['examples']} examples and the collator's tensors for each one and "
                f"{counts['pairs']} pairs to {dump} ({counts['errors']} collator errors)."
            )
        return 0

    return _reported("data preview", traceback, preview)


def print_preview(config, datasets: dict, dataset, split: str, tokenizer, num_examples: int) -> None:
    """The preview of each part of a split (eval_on_each_dataset: one per dataset) and, for sft, the rows cutoff_len
    cuts through media or leaves with no trained token (lathe/llm/data/row_notes.py)."""
    from lathe.llm.data.preview import preview_examples
    from lathe.llm.data.row_notes import describe_row_notes

    parts = dataset.items() if isinstance(dataset, dict) else [(split, dataset)]
    for name, part in parts:
        print(f"== {name} (stage {config.finetuning.stage}, template {config.data.template or 'from the tokenizer'})")
        print(preview_examples(part, tokenizer, n=num_examples))
        if config.finetuning.stage == "sft":
            key = "train" if split == "train" else ("validation" if name == split else f"validation_{name}")
            media = any(column in part.column_names for column in ("images", "videos", "audios"))
            print(describe_row_notes((datasets.get("row_notes") or {}).get(key), name, media))


def export_command(config_path: str, overrides: list[str], traceback: bool = False) -> int:
    """`lathe export CONFIG [key=value ...]`: merge, cast, shard, verify, write (lathe/llm/export.py)."""
    from lathe.llm.export import export_command as run_export
    from lathe.llm.export import format_report

    def export() -> int:
        print(format_report(run_export(config_path, overrides)), flush=True)
        return 0

    return _reported("export", traceback, export, USER_ERRORS + (RuntimeError,))


def expand_command(
    model_name_or_path: str,
    output_dir: str,
    num_expand: int,
    max_shard_size: str = "5GB",
    trust_remote_code: bool = False,
    traceback: bool = False,
) -> int:
    """`lathe expand MODEL OUTPUT_DIR --num_expand N`: LLaMA Pro block expansion (lathe/llm/model/llama_pro.py)."""
    from lathe.llm.config.sections import hub_from_environment
    from lathe.llm.hub import HubOptions, resolve_folder
    from lathe.llm.model.llama_pro import expand_blocks

    def expand() -> int:
        folder = resolve_folder(model_name_or_path, HubOptions(hub=hub_from_environment()))
        result = expand_blocks(folder, output_dir, num_expand, max_shard_size, trust_remote_code)
        before, after = result["layers"]
        print(
            f"Expanded {model_name_or_path} from {before} to {after} layers into {output_dir} (the copies start as the "
            f"identity: logits equal the original's). Fine-tune it with:\n  model_name_or_path: {output_dir}\n"
            f"  finetuning_type: freeze\n  freeze_trainable_layers: {num_expand}\n  use_llama_pro: true",
            flush=True,
        )
        return 0

    return _reported("expand", traceback, expand, USER_ERRORS + (RuntimeError, OSError))


def chat_command(config_path: str, overrides: list[str], traceback: bool = False) -> int:
    """`lathe chat CONFIG [key=value ...]`: an interactive terminal chat (lathe/llm/inference/chat.py)."""
    from lathe.llm.inference.chat import chat_command as run_chat

    return _reported("chat", traceback, lambda: run_chat(config_path, overrides))


def api_command(config_path: str, overrides: list[str], server: dict, traceback: bool = False) -> int:
    """`lathe api CONFIG [key=value ...]`: the OpenAI-compatible server (lathe/llm/inference/api.py)."""
    from lathe.llm.inference.api import api_command as run_api

    return _reported("api", traceback, lambda: run_api(config_path, overrides, **server))


def webui_command(
    root: str, host: str, port: int, api_key, chat_config: str | None = None, traceback=False, allowed_hosts=()
) -> int:
    """`lathe webui` / `lathe webchat CONFIG`: the local web page (lathe/llm/webui/server.py)."""
    from lathe.llm.webui.server import serve

    def webui() -> int:
        chat = None
        if chat_config is not None:
            from lathe.llm.config.values import RawConfig

            chat = dict(RawConfig(chat_config, []).values)
        return serve(root, host, port, api_key, chat_config=chat, allowed_hosts=allowed_hosts)

    return _reported("webui", traceback, webui)
