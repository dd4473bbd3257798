"""Dump LLaMA-Factory's format conversion of the test datasets, for tests/llm/test_converters.py.

Run from the repository root in LLaMA-Factory's environment (bench/setup_llamafactory.sh):

    PYTHONPATH=bench/lf_stubs HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        bench/.venv-lf/bin/python tests/llm/golden/make_llamafactory_converted.py

It loads each dataset of tests/llm/data/dataset_info.json listed in NAMES with LLaMA-Factory's own
registry parser and loader (`get_dataset_list`, `_load_single_dataset`: files, num_samples,
max_samples, conversion) after `np.random.seed(42)`, as its `set_seed(42)` leaves it, and writes
the canonical columns of every row, dropped ones included (LLaMA-Factory empties their _prompt and
_response), to tests/llm/golden/llamafactory_converted.json.
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
NAMES = ["alpaca_json", "alpaca_jsonl", "alpaca_parquet", "alpaca_csv", "alpaca_folder", "pretrain_txt",
         "sharegpt_json", "sharegpt_jsonl", "sharegpt_parquet", "openai_json", "openai_jsonl", "openai_parquet",
         "sharegpt_roles", "alpaca_sampled", "alpaca_sampled_2"]
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


if __name__ == "__main__":
    main()
