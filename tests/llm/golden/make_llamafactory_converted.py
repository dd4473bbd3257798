"""Dump LLaMA-Factory's format conversion of the test datasets (for tests/llm/test_converters.py) and
its whole `get_dataset` on a few configurations (for tests/llm/test_pipeline.py).

Run from the repository root in LLaMA-Factory's environment (bench/setup_llamafactory.sh):

    PYTHONPATH=bench/lf_stubs HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        bench/.venv-lf/bin/python tests/llm/golden/make_llamafactory_converted.py

It loads each dataset of tests/llm/data/dataset_info.json listed in NAMES with LLaMA-Factory's own
registry parser and loader (`get_dataset_list`, `_load_single_dataset`: files, num_samples,
max_samples, conversion) after `np.random.seed(42)`, as its `set_seed(42)` leaves it, and writes
the canonical columns of every row, dropped ones included (LLaMA-Factory empties their _prompt and
_response), to tests/llm/golden/llamafactory_converted.json. Then it runs LLaMA-Factory's `get_dataset`
(sft, template qwen, the saved tokenizer tests/llm/golden/tokenizers/bpe) on PIPELINE_CASES, again after
`np.random.seed(42)`, and writes every split's input_ids and labels to llamafactory_pipeline.json.
"""

import json
import os
import sys
import tempfile
from types import SimpleNamespace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DATA = os.path.join(ROOT, "tests", "llm", "data")
OUTPUT = os.path.join(ROOT, "tests", "llm", "golden", "llamafactory_converted.json")
PIPELINE_OUTPUT = os.path.join(ROOT, "tests", "llm", "golden", "llamafactory_pipeline.json")
TOKENIZER = os.path.join(ROOT, "tests", "llm", "golden", "tokenizers", "bpe")
# Data arguments of each get_dataset case (template qwen, sft, seed 42, packing off).
PIPELINE_CASES = {
    "val_fraction": {"dataset": "alpaca_json,sharegpt_json,alpaca_csv", "val_size": 0.34, "cutoff_len": 64},
    "eval_each": {
        "dataset": "alpaca_jsonl",
        "eval_dataset": "sharegpt_jsonl,sharegpt_roles",
        "eval_on_each_dataset": True,
        "cutoff_len": 32,
    },
    "sampled": {"dataset": "alpaca_sampled,alpaca_sampled_2", "max_samples": 4, "val_size": 2, "cutoff_len": 64},
    "interleaved": {"dataset": "alpaca_json,sharegpt_json", "mix_strategy": "interleave_under", "cutoff_len": 64},
}
NAMES = [
    "alpaca_json",
    "alpaca_jsonl",
    "alpaca_parquet",
    "alpaca_csv",
    "alpaca_folder",
    "pretrain_txt",
    "sharegpt_json",
    "sharegpt_jsonl",
    "sharegpt_parquet",
    "openai_json",
    "openai_jsonl",
    "openai_parquet",
    "sharegpt_roles",
    "alpaca_sampled",
    "alpaca_sampled_2",
]
COLUMNS = ("_prompt", "_response", "_system", "_tools")


def main() -> None:
    import datasets
    import llamafactory
    from llamafactory.data.loader import _load_single_dataset
    from llamafactory.data.parser import get_dataset_list
    from llamafactory.hparams import DataArguments

    datasets.disable_progress_bars()
    cache = tempfile.mkdtemp()
    data_args = DataArguments(dataset_dir=DATA)
    model_args = SimpleNamespace(cache_dir=cache, hf_hub_token=None)
    training_args = SimpleNamespace(local_process_index=0, dataloader_num_workers=0)
    rows = {}
    for name in NAMES:
        attr = get_dataset_list([name], DATA)[0]
        np.random.seed(42)
        try:
            dataset = _load_single_dataset(attr, model_args, data_args, training_args)
            rows[name] = [{column: row[column] for column in COLUMNS} for row in dataset]
        except Exception as error:  # recorded: the test then knows LLaMA-Factory cannot read it
            rows[name] = {"error": f"{type(error).__name__}: {error}"}
    golden = {"llamafactory": llamafactory.__version__, "datasets": datasets.__version__, "seed": 42, "rows": rows}
    with open(OUTPUT, "w", encoding="utf-8") as handle:
        json.dump(golden, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
    print(f"wrote {OUTPUT}", file=sys.stderr)
    dump_pipeline(cache)


def dump_pipeline(cache: str) -> None:
    import datasets
    import llamafactory
    from llamafactory.data.loader import get_dataset
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer, Seq2SeqTrainingArguments

    results = {}
    for name, values in PIPELINE_CASES.items():
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
        data_args = DataArguments(dataset_dir=DATA, template="qwen", packing=False, **values)
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        training_args = Seq2SeqTrainingArguments(output_dir=os.path.join(cache, name), seed=42, report_to=[])
        model_args = SimpleNamespace(cache_dir=cache, hf_hub_token=None)
        np.random.seed(42)
        module = get_dataset(template, model_args, data_args, training_args, "sft", tokenizer)
        splits = {"train": module.get("train_dataset")}
        evaluation = module.get("eval_dataset")
        splits.update(
            {f"eval_{key}": value for key, value in evaluation.items()}
            if isinstance(evaluation, dict)
            else {"eval": evaluation}
        )
        results[name] = {
            split: {key: [row[key] for row in dataset] for key in ("input_ids", "labels")}
            for split, dataset in splits.items()
            if dataset is not None
        }
    golden = {
        "llamafactory": llamafactory.__version__,
        "datasets": datasets.__version__,
        "template": "qwen",
        "tokenizer": "tokenizers/bpe",
        "seed": 42,
        "cases": PIPELINE_CASES,
        "results": results,
    }
    with open(PIPELINE_OUTPUT, "w", encoding="utf-8") as handle:
        json.dump(golden, handle)
        handle.write("\n")
    print(f"wrote {PIPELINE_OUTPUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
