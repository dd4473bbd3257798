"""The `lathe` command line: parse the sub-command, hand it to its module. Kept import-light so
`lathe --help` answers fast (torch is imported only by commands that need it)."""

from __future__ import annotations

import argparse
import sys


def _env(_options) -> int:
    from lathe.env import describe

    print(describe())
    return 0


def _version(_options) -> int:
    print(f"lathe {lathe_version()}")
    return 0


def lathe_version() -> str:
    """The installed lathe's version (its package metadata), else lathe.__version__ (a source tree on the path)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lathe")
    except PackageNotFoundError:
        import lathe

        return lathe.__version__


def _pop_flags(overrides: list[str], *names: str) -> tuple[list[str], set[str]]:
    """Take lathe's own flags (--dry_run, --traceback) out of the config overrides, wherever they are."""
    found = {name for name in names if f"--{name}" in overrides or f"--{name.replace('_', '-')}" in overrides}
    spelled = {f"--{name}" for name in names} | {f"--{name.replace('_', '-')}" for name in names}
    return [item for item in overrides if item not in spelled], found


def _train(options) -> int:
    overrides, flags = _pop_flags(options.overrides, "dry_run", "traceback", "verbose")
    from lathe.llm.commands import train_command

    return train_command(
        options.config,
        overrides,
        dry_run="dry_run" in flags,
        traceback="traceback" in flags,
        verbose="verbose" in flags,
    )


def _pop_valued(overrides: list[str], options, spellings: dict[str, tuple[str, ...]]) -> list[str]:
    """Options of the command itself given after CONFIG (where REMAINDER collects them): set them on
    `options` and return the other items."""
    rest, index = [], 0
    while index < len(overrides):
        item = overrides[index]
        name = next((dest for dest, names in spellings.items() if item.split("=", 1)[0] in names), None)
        value = item.split("=", 1)[1] if "=" in item else overrides[index + 1] if index + 1 < len(overrides) else None
        if name is None:
            rest.append(item)
        elif value is not None and isinstance(getattr(options, name, None), list):  # a repeatable option
            getattr(options, name).append(value)
        elif value is not None:
            setattr(options, name, value)
        index += 2 if name is not None and "=" not in item else 1
    return rest


def _data_preview(options) -> int:
    options.overrides = _pop_valued(
        options.overrides,
        options,
        {"num_examples": ("--num_examples", "--num-examples", "-n"), "split": ("--split",), "dump": ("--dump",)},
    )
    overrides, flags = _pop_flags(options.overrides, "traceback")
    options.num_examples = int(options.num_examples)
    if options.split not in ("train", "eval"):
        raise SystemExit(f"lathe data preview: --split must be train or eval, got {options.split!r}")
    from lathe.llm.commands import data_preview_command

    return data_preview_command(
        options.config,
        overrides,
        num_examples=options.num_examples,
        split=options.split,
        traceback="traceback" in flags,
        dump=options.dump,
    )


_OVERRIDES_HELP = "key=value or --key value pairs; --traceback shows the full error"


def _add_config_command(commands, name: str, run, help: str, description: str, overrides_help: str = _OVERRIDES_HELP):
    """A sub-command that reads CONFIG, then key=value overrides (and its own flags) in any order."""
    command = commands.add_parser(name, help=help, description=description)
    command.add_argument("config", help="YAML or JSON config file")
    command.add_argument("overrides", nargs=argparse.REMAINDER, help=overrides_help)
    command.set_defaults(run=run)
    return command


def _add_train_parsers(commands) -> None:
    _add_config_command(
        commands,
        "train",
        _train,
        help="train a model from a LLaMA-Factory-style YAML config (stage pt, sft, rm, dpo or kto)",
        description="Train from a LLaMA-Factory-style config. Prints the resolved configuration and the plan "
        "(examples, tokens, steps, trainable parameters) first. Overrides win over the file: "
        "`lathe train c.yaml learning_rate=1e-4 --num_train_epochs 2`.",
        overrides_help="key=value or --key value pairs; --dry_run prints the plan and stops; --traceback shows the "
        "full error; --verbose shows Ray's own INFO logs (quiet otherwise)",
    )

    data = commands.add_parser("data", help="inspect the data a config trains on")
    data_commands = data.add_subparsers(dest="data_command", metavar="COMMAND", required=True)
    preview = data_commands.add_parser(
        "preview", help="print tokenized examples with the trained spans marked and the share of trained tokens"
    )
    preview.add_argument("config", help="YAML or JSON config file")
    preview.add_argument("--num_examples", "-n", type=int, default=3, help="examples to show")
    preview.add_argument("--split", choices=("train", "eval"), default="train", help="which split to show")
    preview.add_argument(
        "--dump", default=None, help="write every example and the training collator's tensors to this safetensors file"
    )
    preview.add_argument("overrides", nargs=argparse.REMAINDER, help="key=value or --key value pairs")
    preview.set_defaults(run=_data_preview)


def _export(options) -> int:
    overrides, flags = _pop_flags(options.overrides, "traceback")
    from lathe.llm.commands import export_command

    return export_command(options.config, overrides, traceback="traceback" in flags)


def _chat(options) -> int:
    overrides, flags = _pop_flags(options.overrides, "traceback")
    from lathe.llm.commands import chat_command

    return chat_command(options.config, overrides, traceback="traceback" in flags)


API_OPTIONS = {
    "host": ("--host",),
    "port": ("--port",),
    "api_key": ("--api_key", "--api-key"),
    "model_name": ("--model_name", "--model-name"),
    "max_tokens": ("--max_tokens", "--max-tokens"),
    "max_batch": ("--max_batch", "--max-batch"),
    "media_dir": ("--media_dir", "--media-dir"),
    "max_body_bytes": ("--max_body_bytes", "--max-body-bytes"),
    "allowed_hosts": ("--allowed_host", "--allowed-host"),
}


def _api(options) -> int:
    import os

    options.overrides = _pop_valued(options.overrides, options, API_OPTIONS)
    overrides, flags = _pop_flags(options.overrides, "traceback", "quiet")
    server = {
        "access_log": "quiet" not in flags,  # one line per request unless --quiet
        # LLaMA-Factory's environment variables work too (API_HOST, API_PORT, API_KEY, API_MODEL_NAME).
        "host": options.host or os.environ.get("API_HOST") or "127.0.0.1",
        "port": int(options.port or os.environ.get("API_PORT") or 8000),
        "api_key": options.api_key or os.environ.get("LATHE_API_KEY") or os.environ.get("API_KEY"),
        "model_name": options.model_name or os.environ.get("API_MODEL_NAME"),
        "max_tokens": int(options.max_tokens) if options.max_tokens else None,
        "max_batch": int(options.max_batch) if options.max_batch else 16,
        # image files are read from this folder only (LLaMA-Factory's SAFE_MEDIA_PATH, unless its
        # ALLOW_LOCAL_FILES is off); none: data URLs only
        "media_dir": options.media_dir
        or (
            os.environ.get("SAFE_MEDIA_PATH")
            if os.environ.get("ALLOW_LOCAL_FILES", "1").lower() in ("1", "true", "y")
            else None
        ),
        "max_body_bytes": int(options.max_body_bytes) if options.max_body_bytes else None,
        "allowed_hosts": tuple(options.allowed_hosts),
    }
    from lathe.llm.commands import api_command

    return api_command(options.config, overrides, server, traceback="traceback" in flags)


def _expand(options) -> int:
    from lathe.llm.commands import expand_command

    return expand_command(
        options.model_name_or_path,
        options.output_dir,
        options.num_expand,
        max_shard_size=options.max_shard_size,
        trust_remote_code=options.trust_remote_code,
        traceback=options.traceback,
    )


def _add_expand_parser(commands) -> None:
    expand = commands.add_parser(
        "expand",
        help="LLaMA Pro block expansion: add identity-initialised copies of blocks (train them with use_llama_pro)",
        description="Write MODEL with NUM_EXPAND more hidden layers: after every (layers / NUM_EXPAND)-th block, a copy "
        "of it whose o_proj and down_proj are zero, so the new model computes what MODEL does (checked before "
        "anything is written). Then train with finetuning_type freeze (or lora), use_llama_pro: true and "
        "freeze_trainable_layers: NUM_EXPAND, as with LLaMA-Factory's scripts/llama_pro.py.",
    )
    expand.add_argument("model_name_or_path", help="local model folder")
    expand.add_argument("output_dir", help="new folder for the expanded model")
    expand.add_argument(
        "--num_expand", "--num-expand", type=int, required=True, help="blocks to add; divides the layer count"
    )
    expand.add_argument("--max_shard_size", "--max-shard-size", default="5GB", help="largest safetensors shard (5GB)")
    expand.add_argument(
        "--trust_remote_code", "--trust-remote-code", action="store_true", help="allow the folder's own code"
    )
    expand.add_argument("--traceback", action="store_true", help="show the full error")
    expand.set_defaults(run=_expand)


def _add_inference_parsers(commands) -> None:
    _add_config_command(
        commands,
        "chat",
        _chat,
        help="chat with a model in the terminal, with its training template (streaming; clear, exit)",
        description="Interactive chat from a LLaMA-Factory-style inference config (model_name_or_path, "
        "adapter_name_or_path, template, finetuning_type, generation keys). Overrides such as temperature=0.2 "
        "max_new_tokens=128 win over the file.",
    )

    api = commands.add_parser(
        "api",
        help="serve the model with an OpenAI-compatible HTTP API (chat/completions, completions, models)",
        description="An OpenAI-compatible server (FastAPI + uvicorn; pip install 'lathe[api]'). Listens on "
        "127.0.0.1:8000 unless told otherwise; with an API key (--api_key or LATHE_API_KEY) every route needs "
        "`Authorization: Bearer KEY`. Concurrent requests are decoded together in batches of up to --max_batch.",
    )
    api.add_argument("config", help="YAML or JSON config file")
    for dest, spellings in API_OPTIONS.items():
        repeated = {"action": "append", "default": []} if dest == "allowed_hosts" else {"default": None}
        api.add_argument(*spellings, dest=dest, help=argparse.SUPPRESS, **repeated)
    api.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        help="--host H --port P --api_key K --model_name NAME --max_tokens CAP --max_batch B --media_dir DIR "
        "(image_url files allowed from DIR only) --max_body_bytes N (1000000) --allowed_host NAME (a Host name to "
        "answer besides the bound address and localhost; repeatable), then key=value config overrides; "
        "--quiet drops the access line printed per request; --traceback shows the full error",
    )
    api.set_defaults(run=_api)

    _add_config_command(
        commands,
        "export",
        _export,
        help="merge LoRA adapters into the base and write a checked, sharded safetensors model folder",
        description="Export from a LLaMA-Factory-style inference config (model_name_or_path, adapter_name_or_path, "
        "template, finetuning_type, export_dir, export_size, infer_dtype). Adapters are merged in float32 and "
        "checked against base + adapter; the folder is loaded back and checked before success is reported.",
    )


def _webui(options) -> int:
    import os

    # The key is read here, at the CLI's edge, and handed down: nothing under lathe/llm/webui reads the environment.
    api_key = options.api_key or os.environ.get("LATHE_WEBUI_KEY") or None
    from lathe.llm.commands import webui_command

    config = getattr(options, "config", None)
    return webui_command(
        options.root,
        options.host,
        options.port,
        api_key,
        chat_config=config,
        traceback=options.traceback,
        allowed_hosts=tuple(options.allowed_hosts),
    )


def _add_webui_parsers(commands) -> None:
    for name, help in (
        ("webui", "a local web page to fine-tune, watch runs, chat and export (FastAPI; pip install 'lathe[api]')"),
        ("webchat", "the web page's chat alone, with the model of an inference CONFIG loaded"),
    ):
        command = commands.add_parser(
            name,
            help=help,
            description=f"{help}. Binds 127.0.0.1 unless --host says otherwise; any other host needs a key "
            "(--api_key or LATHE_WEBUI_KEY), then every route asks for it. Reads and writes only under --root.",
        )
        if name == "webchat":
            command.add_argument("config", help="YAML or JSON inference config (model_name_or_path, adapter, template)")
        command.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
        command.add_argument("--port", type=int, default=7860, help="port (7860)")
        command.add_argument("--root", default=".", help="the folder the page works in: models, data, runs (.)")
        command.add_argument("--api_key", "--api-key", default=None, help="key every request must carry")
        command.add_argument(
            "--allowed_host",
            "--allowed-host",
            dest="allowed_hosts",
            action="append",
            default=[],
            help="a Host name to answer besides the bound address and localhost (repeatable; * allows any)",
        )
        command.add_argument("--traceback", action="store_true", help="show the full error")
        command.set_defaults(run=_webui)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lathe", description="Train and fine-tune PyTorch models.")
    parser.add_argument("--version", action="store_true", help="print lathe's version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    env = commands.add_parser(
        "env", help="print versions of python, torch, lathe and optional packages, and the devices"
    )
    env.set_defaults(run=_env)
    commands.add_parser("version", help="print lathe's version (as --version)").set_defaults(run=_version)
    _add_train_parsers(commands)
    _add_inference_parsers(commands)
    _add_expand_parser(commands)
    _add_webui_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if options.version:
        return _version(options)
    if getattr(options, "run", None) is None:
        parser.print_help()
        return 0
    return options.run(options)
