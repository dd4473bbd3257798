"""Hub ids -> local folders: model_name_or_path, adapters, ref_model and hub datasets, as LLaMA-Factory finds them.

A name that is a local folder is used as it is. Any other name that is a valid repository id ("Org/Name")
is looked up on the Hugging Face Hub through huggingface_hub (its local cache, HF_HUB_OFFLINE, HF_ENDPOINT,
HF_TOKEN, with cache_dir, model_revision and hf_hub_token from the config), or on ModelScope when
USE_MODELSCOPE_HUB is set (the `modelscope` package, imported here only). Folders are resolved before any
heavy work, and a name that cannot be found is one line that says how to get it. Downloading never runs
code: trust_remote_code still decides whether a folder's Python files may run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from lathe.llm.path_typos import local_path_problem

__all__ = [
    "HubOptions",
    "hub_options",
    "is_repo_id",
    "resolve_folder",
    "model_folder",
    "adapter_folders",
    "resolve_config",
    "resolve_raw_config",
    "resolve_hub_datasets",
]

# Huggingface_hub's repository-id rule: [org/]name of letters, digits, "-", "_", ".".
REPO_ID = re.compile(r"^(?:[\w\-.]+/)?[\w\-.]+$")
# Weight formats transformers does not read for a causal LM (or copies of the weights for other programs):
# a snapshot leaves them on the Hub, so a repository with `original/` or GGUF files costs no extra download.
SKIPPED = ["original/*", "*.pth", "*.gguf", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite", "consolidated*"]
MODELSCOPE_HINT = "pip install modelscope"


@dataclass(frozen=True)
class HubOptions:
    """Where names that are not local folders come from (LLaMA-Factory's cache_dir, model_revision, tokens)."""

    hub: str = "huggingface"  # USE_MODELSCOPE_HUB=1 -> modelscope
    cache_dir: str | None = None
    revision: str = "main"
    token: str | None = None  # hf_hub_token (None: huggingface_hub's own, HF_TOKEN or `hf auth login`)
    ms_token: str | None = None  # ms_hub_token


def hub_options(model_args) -> HubOptions:
    """The options of a ModelArguments (model_hub is read from the environment when the config is parsed)."""
    return HubOptions(
        hub=getattr(model_args, "model_hub", "huggingface"),
        cache_dir=getattr(model_args, "cache_dir", None),
        revision=getattr(model_args, "model_revision", None) or "main",
        token=getattr(model_args, "hf_hub_token", None),
        ms_token=getattr(model_args, "ms_hub_token", None),
    )


def is_repo_id(name: str) -> bool:
    """Whether a name could be a hub repository id (a path such as ./x, /x or a/b/c cannot)."""
    return (
        bool(REPO_ID.match(name))
        and len(name) <= 96
        and ".." not in name
        and "--" not in name
        and not any(part.startswith((".", "-")) or part.endswith((".", "-")) for part in name.split("/"))
    )


_RESOLVED: dict[tuple, str] = {}  # one look-up per name and options: the loaders ask for the same folder often


def resolve_folder(name: str, options: HubOptions, key: str = "model_name_or_path", repo_type: str = "model") -> str:
    """The local folder behind `name`: itself when it is a folder, else the hub snapshot (downloaded if needed)."""
    if os.path.isdir(name):
        return name
    typo = local_path_problem(name) if repo_type == "model" else None  # ./x, models/tni, modles/tiny: not hub ids
    if typo:
        raise FileNotFoundError(f"{key} {name!r} {typo}")
    if not is_repo_id(name):
        raise FileNotFoundError(f"{key} {name!r} is not a local folder (nor a hub id such as Org/Name).")
    from huggingface_hub import constants

    memo = (name, options, repo_type, constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE, constants.ENDPOINT)
    if not os.path.isdir(_RESOLVED.get(memo, "")):  # a snapshot removed since is looked up again
        if options.hub == "modelscope":
            _RESOLVED[memo] = _modelscope_snapshot(name, options, key, repo_type)
        elif options.hub == "huggingface":
            _RESOLVED[memo] = _huggingface_snapshot(name, options, key, repo_type)
        else:
            raise ValueError(
                f"{key} {name!r}: the {options.hub} hub is not supported (USE_OPENMIND_HUB); lathe downloads from the "
                "Hugging Face Hub, or ModelScope with USE_MODELSCOPE_HUB=1."
            )
    return _RESOLVED[memo]


def model_folder(model_args) -> str:
    """The local folder of model_name_or_path."""
    return resolve_folder(model_args.model_name_or_path, hub_options(model_args))


def adapter_folders(model_args) -> list[str]:
    """The local folders of adapter_name_or_path, in order."""
    options = hub_options(model_args)
    return [resolve_folder(name, options, "adapter_name_or_path") for name in model_args.adapter_name_or_path or []]


def resolve_config(config) -> None:
    """Resolve every model and adapter name of a parsed config now, before the configuration is printed and
    anything heavy starts: a missing model stops the run at once, with the command that downloads it."""
    options = hub_options(config.model)
    resolve_folder(config.model.model_name_or_path, options)  # train_from_scratch too: its config.json
    for adapter in config.model.adapter_name_or_path or []:
        resolve_folder(adapter, options, "adapter_name_or_path")
    finetuning = getattr(config, "finetuning", None)
    if finetuning is not None and getattr(finetuning, "ref_model", None):
        resolve_folder(finetuning.ref_model, options, "ref_model")
        for adapter in finetuning.ref_model_adapters or []:
            resolve_folder(adapter, options, "ref_model_adapters")


def resolve_raw_config(values: dict, hub: str) -> None:
    """resolve_config for a config's raw values, before `lathe train` starts its ranks under torchrun: the model
    is downloaded once, and a missing one is one line instead of one per rank. Values the ranks would refuse
    are left for their parse to report."""
    options = HubOptions(
        hub=hub,
        cache_dir=values.get("cache_dir"),
        revision=str(values.get("model_revision") or "main"),
        token=values.get("hf_hub_token"),
        ms_token=values.get("ms_hub_token"),
    )
    for key in ("model_name_or_path", "adapter_name_or_path", "ref_model", "ref_model_adapters"):
        value = values.get(key)
        names = value.split(",") if isinstance(value, str) else []
        for name in (name.strip() for name in names):
            if name:
                resolve_folder(name, options, key)


def resolve_hub_datasets(attrs, model_args) -> None:
    """Download (or find in the cache) the repository of each hub dataset entry, as LLaMA-Factory picks it:
    ms_hub_url with USE_MODELSCOPE_HUB=1 (or when it is the only one), else hf_hub_url; OpenMind is refused."""
    options = hub_options(model_args)
    for attr in attrs:
        urls = attr.hub_urls
        if not urls:
            continue
        if "ms_hub_url" in urls and (options.hub == "modelscope" or "hf_hub_url" not in urls):
            key, hub = "ms_hub_url", "modelscope"
        elif "hf_hub_url" in urls:
            key, hub = "hf_hub_url", "huggingface"
        else:
            key, hub = "om_hub_url", "openmind"
        where = f"dataset {attr.name!r}: {key}"
        # A dataset's revision is its repository's main branch (LLaMA-Factory passes no revision for data).
        dataset_options = HubOptions(
            hub=hub, cache_dir=options.cache_dir, token=options.token, ms_token=options.ms_token
        )
        attr.snapshot = resolve_folder(urls[key], dataset_options, where, repo_type="dataset")


def _download_command(name: str, options: HubOptions, repo_type: str) -> str:
    parts = ["hf download", name]
    if repo_type != "model":
        parts.append(f"--repo-type {repo_type}")
    if options.revision != "main":
        parts.append(f"--revision {options.revision}")
    if options.cache_dir:
        parts.append(f"--cache-dir {options.cache_dir}")
    return " ".join(parts)


def _huggingface_snapshot(name: str, options: HubOptions, key: str, repo_type: str) -> str:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hub_errors

    kwargs = dict(
        repo_id=name, repo_type=repo_type, revision=options.revision, cache_dir=options.cache_dir, token=options.token
    )
    where = options.cache_dir or constants.HF_HUB_CACHE
    get_it = f"download it with `{_download_command(name, options, repo_type)}` on a machine that is online"
    try:
        if constants.HF_HUB_OFFLINE:
            return _cached_snapshot(snapshot_download, kwargs)
        try:
            listing = snapshot_download(**kwargs, dry_run=True)
        except hub_errors.DryRunError as error:
            if isinstance(error.__cause__, hub_errors.RepositoryNotFoundError):
                raise error.__cause__ from None
            return _cached_snapshot(snapshot_download, kwargs)  # the Hub is unreachable: the cache, as transformers
        skipped = SKIPPED if repo_type == "model" else []
        if repo_type == "model" and any(f.filename.endswith(".safetensors") for f in listing):
            skipped = skipped + ["*.bin", "*.pt"]  # transformers reads the safetensors copy of the weights
        return snapshot_download(**kwargs, ignore_patterns=skipped or None)
    except hub_errors.GatedRepoError:
        raise FileNotFoundError(
            f"{key} {name!r} is a gated repository: accept its terms on the Hub, then log in (`hf auth login`), "
            "set HF_TOKEN or hf_hub_token."
        ) from None
    except hub_errors.RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{key} {name!r} is not a local folder, and the Hub has no {repo_type} repository of that name (or it is "
            "private: log in with `hf auth login`, set HF_TOKEN or hf_hub_token)."
        ) from None
    except hub_errors.RevisionNotFoundError:
        raise FileNotFoundError(
            f"{key} {name!r}: the Hub has no revision {options.revision!r} of it (model_revision)."
        ) from None
    except hub_errors.LocalEntryNotFoundError as error:
        if constants.HF_HUB_OFFLINE:
            why = "HF_HUB_OFFLINE is set"
            fix = f"{get_it}, or unset HF_HUB_OFFLINE"
        else:
            why = "the Hub cannot be reached"
            fix = get_it
        revision = f" (revision {options.revision})" if options.revision != "main" else ""
        raise FileNotFoundError(
            f"{key} {name!r}{revision} is not a local folder and is not in the Hugging Face cache {where} ({why}): "
            f"{fix}, or {'give the entry a local file_name' if repo_type == 'dataset' else f'point {key} at a local folder'}."
        ) from (None if constants.HF_HUB_OFFLINE else error)
    except hub_errors.HfHubHTTPError as error:
        raise FileNotFoundError(f"{key} {name!r}: the Hub answered {error}".splitlines()[0]) from None


def _cached_snapshot(snapshot_download, kwargs: dict) -> str:
    """The cached snapshot folder, as transformers uses it offline: a folder that transformers filled file by
    file (or that a lathe download left without the skipped formats) is complete enough for loading."""
    from huggingface_hub.errors import IncompleteSnapshotError

    try:
        return snapshot_download(**kwargs, local_files_only=True)
    except IncompleteSnapshotError as error:
        if error.snapshot_path and os.path.isdir(error.snapshot_path):
            return error.snapshot_path
        raise


def _modelscope_snapshot(name: str, options: HubOptions, key: str, repo_type: str) -> str:
    try:
        import modelscope  # noqa: F401  (optional: only USE_MODELSCOPE_HUB=1 needs it)
        from modelscope.hub.snapshot_download import snapshot_download
    except ImportError:
        raise ImportError(
            f"{key} {name!r}: USE_MODELSCOPE_HUB=1 downloads from ModelScope, which needs the modelscope package: "
            f"`{MODELSCOPE_HINT}` (or unset USE_MODELSCOPE_HUB to use the Hugging Face Hub)."
        ) from None
    if options.ms_token:
        from modelscope.hub.api import HubApi

        HubApi().login(options.ms_token)
    revision = "master" if options.revision == "main" else options.revision  # ModelScope's default branch
    try:
        return snapshot_download(name, revision=revision, cache_dir=options.cache_dir, repo_type=repo_type)
    except Exception as error:  # modelscope raises plain exceptions of many kinds: say which name failed
        raise FileNotFoundError(
            f"{key} {name!r}: ModelScope could not provide it ({type(error).__name__}: {error})".splitlines()[0]
        ) from None
