"""`get_dataset`: registry -> files -> canonical rows -> train/validation split -> tokenized rows, cached.

The one entry point the workflows call. Order and semantics follow LLaMA-Factory 0.9.5's
`get_dataset`: datasets are loaded, sampled and converted one by one, merged (`mix_strategy`), split
(`val_size`, or `eval_dataset`), and each split is tokenized by the stage's processor. On top of that,
the whole result is cached under a key of everything it depends on (see cache.py): a second run with
the same inputs loads the tokenized rows without reading the data files' rows at all.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from lathe.llm.data import cache, processors, truncation
from lathe.llm.data.converters import ConversionReport
from lathe.llm.data.loader import load_datasets, merge_datasets, split_validation
from lathe.llm.data.preview import trained_fraction
from lathe.llm.data.registry import DatasetAttr, get_dataset_list, resolve_data_files
from lathe.llm.hub import resolve_hub_datasets

logger = logging.getLogger("lathe.llm.data")

STAGES = ("pt", "sft", "rm", "dpo", "kto")
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "lathe", "tokenized")
HERE = os.path.dirname(os.path.abspath(__file__))


def get_dataset(
    template, model_args, data_args, training_args, stage: str, tokenizer, cache_dir: str | None = None, media=None
) -> dict[str, Any]:
    """{"train_dataset": Dataset | None, "eval_dataset": Dataset | {name: Dataset} | None}.

    `cache_dir` holds the tokenization cache (default ~/.cache/lathe/tokenized) and the raw arrow files
    `datasets` makes from the data files. `media` (lathe.llm.multimodal.encode.MediaEncoder) encodes rows with
    images, videos or audio; None: such rows are an error.
    """
    if stage not in STAGES:
        raise ValueError(
            f"stage '{stage}' is not supported yet by lathe's data pipeline (supported: {', '.join(STAGES)})."
        )
    if getattr(data_args, "streaming", False):
        raise ValueError("streaming is not supported yet: lathe tokenizes the whole dataset once and caches it.")
    tokenized_path = getattr(data_args, "tokenized_path", None)
    if tokenized_path and os.path.exists(tokenized_path) and not os.path.isdir(tokenized_path):
        raise ValueError(f"tokenized_path {tokenized_path} is a file; it must name a folder (new, or a saved dataset).")
    if tokenized_path and cache.has_tokenized_data(tokenized_path):
        logger.warning(
            "Loading the tokenized dataset from tokenized_path %s: the data arguments are ignored "
            "(as in LLaMA-Factory); remove that folder to tokenize again.",
            tokenized_path,
        )
        stats = (cache.read_manifest(tokenized_path) or {}).get("stats")
        return dataset_module(cache.load_tokenized_path(tokenized_path), stats)
    if not getattr(data_args, "dataset", None) and not getattr(data_args, "eval_dataset", None):
        raise ValueError("No dataset: set `dataset` (and/or `eval_dataset`) to names from dataset_info.json.")

    root = os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR)
    plan = DataPlan.make(template, model_args, data_args, training_args, stage, tokenizer)
    plan.media = media
    key = cache.cache_key(plan.key_parts())
    main_first = getattr(training_args, "main_process_first", None)
    with main_first(desc="pre-process dataset") if main_first else contextlib.nullcontext():
        # Replicas read what the main process wrote, even when it was told to overwrite.
        overwrite = (
            getattr(data_args, "overwrite_cache", False) and getattr(training_args, "local_process_index", 0) == 0
        )
        entry = None if overwrite else cache.load_entry(root, key)
        if entry is not None:
            splits, manifest = entry
            logger.info("Tokenized dataset loaded from the cache: %s", cache.entry_path(root, key))
            _log_reports(manifest, data_args.cutoff_len, cached=True)
        else:
            splits, manifest = build_and_cache(plan, root, key)
    truncation.check_dropped_rows(manifest.get("stats", {}).get("train"), data_args)
    truncation.check_cut_tokens(manifest.get("stats", {}).get("train"), data_args)
    if tokenized_path and getattr(training_args, "should_save", True):
        cache.save_tokenized_path(splits, tokenized_path, key, manifest.get("stats"))
        logger.info("Tokenized dataset saved at %s; later runs with tokenized_path load it.", tokenized_path)
    return dataset_module(splits, manifest.get("stats"))


@dataclass
class DataPlan:
    """Everything `get_dataset` needs, resolved once: registry entries, their files, the stage."""

    template: Any
    model_args: Any
    data_args: Any
    stage: str
    tokenizer: Any
    packing: bool  # resolved: None in the config means true for pt, false for sft
    train_attrs: list[DatasetAttr]
    eval_attrs: list[DatasetAttr]
    generate: bool  # predict_with_generate: evaluation rows are prompts to generate from
    seed: int
    files: dict[str, list[str]]
    media: Any = None  # the MediaEncoder of a multimodal template

    @classmethod
    def make(cls, template, model_args, data_args, training_args, stage, tokenizer) -> "DataPlan":
        train_attrs = get_dataset_list(data_args.dataset, data_args.dataset_dir)
        eval_attrs = get_dataset_list(getattr(data_args, "eval_dataset", None), data_args.dataset_dir)
        resolve_hub_datasets(train_attrs + eval_attrs, model_args)
        return cls(
            template=template,
            model_args=model_args,
            data_args=data_args,
            stage=stage,
            tokenizer=tokenizer,
            packing=data_args.packing if getattr(data_args, "packing", None) is not None else stage == "pt",
            train_attrs=train_attrs,
            eval_attrs=eval_attrs,
            generate=bool(getattr(training_args, "predict_with_generate", False)),
            seed=getattr(training_args, "seed", 42),
            files={attr.name: resolve_data_files(attr, data_args.dataset_dir)[0] for attr in train_attrs + eval_attrs},
        )

    def processor(self, is_eval: bool) -> Callable:
        return processors.select_processor(self.stage, self.packing, generate=is_eval and self.generate)

    def key_parts(self) -> dict[str, Any]:
        processors = (
            {self.processor(False), self.processor(True)}
            if self.eval_attrs or self._val_size()
            else {self.processor(False)}
        )
        code = glob.glob(os.path.join(HERE, "*.py")) + glob.glob(os.path.join(HERE, "..", "templates", "*.py"))
        code += [_source_file(function) for function in processors]
        return {
            "stage": self.stage,
            "datasets": {
                "train": [self._describe(attr) for attr in self.train_attrs],
                "eval": [self._describe(attr) for attr in self.eval_attrs],
            },
            "data_args": cache.describe_data_args(self.data_args, self.packing),
            "model_args": {
                name: cache.stable_structure(getattr(self.model_args, name, None))
                for name in ("split_special_tokens", "add_tokens", "add_special_tokens", "use_fast_tokenizer")
            },
            "seed": self.seed,
            "generate_eval": self.generate,
            "template": cache.stable_structure(self.template),
            "tokenizer": cache.describe_tokenizer(self.tokenizer),
            "processors": sorted(f"{f.__module__}.{f.__qualname__}" for f in processors),
            "code": cache.source_digest([path for path in code if path] + _media_code()),
            **({"media": self.media.describe()} if self.media is not None else {}),
            # media rows hold paths joined to media_dir: another folder is other rows
            **({"media_dir": self.data_args.media_dir} if self._has_media_columns() else {}),
        }

    def _describe(self, attr: DatasetAttr) -> dict[str, Any]:
        fields = {key: value for key, value in vars(attr).items() if key != "info_path"}
        fields["files"] = [(os.path.basename(path), cache.hash_file(path)) for path in self.files[attr.name]]
        return fields

    def _has_media_columns(self) -> bool:
        return any(attr.images or attr.videos or attr.audios for attr in self.train_attrs + self.eval_attrs)

    def _val_size(self) -> float:
        return float(getattr(self.data_args, "val_size", 0) or 0)


def _media_code() -> list[str]:
    return glob.glob(os.path.join(HERE, "..", "multimodal", "*.py"))


def _source_file(function: Callable) -> str | None:
    import inspect

    try:
        return inspect.getsourcefile(function)
    except TypeError:
        return None


def build_and_cache(plan: DataPlan, root: str, key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load, convert, merge, split and tokenize into a staging folder, then publish it as the entry `key`;
    returns (splits, manifest)."""
    data_args = plan.data_args
    rng = np.random.RandomState(plan.seed)  # LLaMA-Factory's draws after set_seed(seed)
    raw_cache = os.path.join(root, "raw")
    train_sets, reports = load_datasets(plan.train_attrs, data_args, plan.stage, rng, raw_cache)
    eval_sets, eval_reports = load_datasets(plan.eval_attrs, data_args, plan.stage, rng, raw_cache, plan.generate)
    reports += eval_reports
    raw: dict[str, Any] = {}
    if train_sets:
        raw["train"] = merge_datasets(list(train_sets.values()), data_args, plan.seed)
        if plan._val_size() > 1e-6:
            if eval_sets:
                raise ValueError("Set either val_size (split the training data) or eval_dataset, not both.")
            raw["train"], raw["validation"] = split_validation(raw["train"], plan._val_size(), plan.seed)
    if eval_sets and getattr(data_args, "eval_on_each_dataset", False):
        raw.update({f"validation_{name}": dataset for name, dataset in eval_sets.items()})
    elif eval_sets:
        raw["validation"] = merge_datasets(list(eval_sets.values()), data_args, plan.seed)

    with cache.staging_folder(root, key) as staging:
        files, stats = {}, {}
        for name, dataset in raw.items():
            notes: list = []
            processed, recorded = tokenize_split(plan, name, dataset, staging, notes)
            files[name] = [os.path.relpath(item["filename"], staging) for item in processed.cache_files]
            stats[name] = split_stats(processed, rows_before=len(dataset))
            if recorded:
                stats[name]["row_notes"] = notes
        manifest = {
            "key": key,
            "splits": files,
            "stats": stats,
            "created": time.time(),
            "one_row_per_example": plan.stage != "pt" and not plan.packing,
            "reports": [report.to_dict() for report in reports if report.skipped],
        }
        cache.write_manifest(staging, manifest)
    entry = cache.load_entry(root, key)
    if entry is None:
        raise RuntimeError(f"the tokenization cache entry {cache.entry_path(root, key)} was written but cannot be read")
    _log_reports(manifest, data_args.cutoff_len, cached=False)
    return entry


def tokenize_split(plan: DataPlan, name: str, dataset, staging: str, notes: list | None = None):
    """One split through the stage's processor, written as arrow files inside the staging folder; `notes` receives
    the rows cut through media or left untrained (row_notes.py) where the processor notes them in this process.
    Returns (the tokenized split, whether `notes` was filled)."""
    recorded = False
    processor = plan.processor(is_eval=name != "train")
    map_kwargs = dict(
        batch_size=getattr(plan.data_args, "preprocessing_batch_size", 1000),
        num_proc=getattr(plan.data_args, "preprocessing_num_workers", None),
        cache_file_name=os.path.join(staging, f"{name}.arrow"),
        load_from_cache_file=False,
        new_fingerprint=cache.hash_text(f"{staging}/{name}")[:32],
        desc=f"Tokenizing the {name} split",
    )
    with truncation.quiet_length_warning(plan.tokenizer):  # lathe reports what cutoff_len cut instead
        if processor is processors.pretrain:  # blocks are cut from the whole split's token stream, not batch by batch
            from lathe.llm.data.pretrain import pretrain_blocks

            processed = pretrain_blocks(dataset, plan.tokenizer, _resolved_data_args(plan), map_kwargs)
        else:
            options = (
                {"measure": True} if processors.can_measure(processor) else {}
            )  # sft: what cutoff_len cuts per row
            options.update(processors.media_options(plan, processor, dataset))
            function = functools.partial(
                processor,
                template=plan.template,
                tokenizer=plan.tokenizer,
                data_args=_resolved_data_args(plan),
                **options,
            )
            in_process = (map_kwargs["num_proc"] or 1) == 1
            recorded = notes is not None and "notes" in processors.parameters(processor) and in_process
            if recorded:
                from lathe.llm.data.row_notes import with_row_notes

                function, map_kwargs["with_indices"] = with_row_notes(function, notes), True
            from lathe.llm.multimodal.images import UndecodableMedia
            from lathe.llm.multimodal.media import name_row

            try:
                processed = dataset.map(function, batched=True, remove_columns=dataset.column_names, **map_kwargs)
            except UndecodableMedia as error:  # name the row too (rows are processed in batches)
                raise name_row(error, dataset) from None
    if len(processed) == 0:
        what = "with text" if plan.stage == "pt" else "usable after tokenization"
        raise ValueError(
            f"The {name} split has no examples {what} ({len(dataset)} rows before tokenization); "
            f"see the warnings above for skipped rows."
        )
    if not processed.cache_files or any(not item["filename"].startswith(staging) for item in processed.cache_files):
        processed = processed.flatten_indices(cache_file_name=os.path.join(staging, f"{name}-flat.arrow"))
    return processed, recorded


def _resolved_data_args(plan: DataPlan):
    """The processors read `packing`; give them the value the stage implies when the config left it None."""
    if getattr(plan.data_args, "packing", None) == plan.packing:
        return plan.data_args
    import copy

    resolved = copy.copy(plan.data_args)
    resolved.packing = plan.packing
    return resolved


def split_stats(dataset, rows_before: int) -> dict[str, Any]:
    """Rows, tokens and trained tokens (labels != -100) of a tokenized split, and what cutoff_len cut
    ("truncation": truncation.split_truncation, None for pre-training, which cuts nothing)."""
    trained, tokens = trained_fraction(dataset)
    return {
        "rows_before": rows_before,
        "rows": len(dataset),
        "tokens": tokens,
        "trained_tokens": trained,
        "truncation": truncation.split_truncation(dataset),
    }


def _log_reports(manifest: dict[str, Any], cutoff_len: int, cached: bool) -> None:
    """Skipped rows were reported while converting; a cache hit repeats them, since they still apply."""
    for values in manifest.get("reports", []) if cached else []:
        logger.warning("when this cache entry was built, %s", ConversionReport.from_dict(values).summary())
    for name, stats in manifest.get("stats", {}).items():
        dropped = stats["rows_before"] - stats["rows"]
        if cached and manifest.get("one_row_per_example") and dropped > 0:
            logger.warning(
                "when this cache entry was built, tokenizing the %s split skipped %d of %d examples",
                name,
                dropped,
                stats["rows_before"],
            )
        logger.info(
            "%s split: %d rows (from %d), %d tokens%s",
            name,
            stats["rows"],
            stats["rows_before"],
            stats["tokens"],
            f", {stats['trained_tokens']} trained",
        )
        cut = truncation.report(name, stats.get("truncation"), cutoff_len)
        if cut is not None:
            getattr(logger, cut[0])(cut[1])


def dataset_module(splits: dict[str, Any], stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """LLaMA-Factory's DatasetModule: "train" -> train_dataset; "validation" -> eval_dataset, or
    "validation_<name>" splits -> eval_dataset as {name: Dataset}. With `stats` (the cache manifest's),
    "truncation" holds what cutoff_len cut per split ({split: counts}, see truncation.py, and "rows_before": the
    examples before tokenizing, which may have left some out)."""
    module: dict[str, Any] = {"train_dataset": splits.get("train"), "eval_dataset": splits.get("validation")}
    if module["eval_dataset"] is None:
        named = {
            name[len("validation_") :]: dataset for name, dataset in splits.items() if name.startswith("validation_")
        }
        module["eval_dataset"] = named or None
    if stats is not None:
        module["row_notes"] = {name: values.get("row_notes") for name, values in stats.items()}
        module["truncation"] = {
            name: values.get("truncation") and {**values["truncation"], "rows_before": values["rows_before"]}
            for name, values in stats.items()
        }
    return module
