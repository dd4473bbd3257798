"""Write the list of TRL 1.16's GRPOConfig and RLOOConfig keys (those beyond transformers' TrainingArguments, with
their defaults) that tests/llm/test_trl_config_keys.py walks: each is implemented by lathe or refused by name. The
test reads the committed file and needs no TRL.

    python bench/trl_config_fields.py [--python bench/.cache/trl-venv/bin/python]

Re-runs itself in TRL's environment (`--worker`); writes tests/llm/golden/trl_config_fields.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "tests" / "llm" / "golden" / "trl_config_fields.json"


def jsonable(value):
    """A default as JSON: numbers, strings, booleans and None as they are, anything else by its repr."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def worker() -> None:
    from dataclasses import MISSING, fields

    import transformers
    import trl
    from transformers import TrainingArguments
    from trl import GRPOConfig, RLOOConfig

    base = {f.name for f in fields(TrainingArguments)}
    tables = {}
    for config in (GRPOConfig, RLOOConfig):
        table = {}
        for f in fields(config):
            if f.name in base or not f.init:
                continue
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            table[f.name] = jsonable(default)
        tables[config.__name__] = table
    versions = {"trl": trl.__version__, "transformers": transformers.__version__}
    print("FIELDS-JSON " + json.dumps({"versions": versions, **tables}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / "bench" / ".cache" / "trl-venv" / "bin" / "python"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker()
        return
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [options.python, __file__, "--worker"], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir()
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("FIELDS-JSON ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"the TRL worker failed ({done.returncode}):\n{done.stderr[-4000:]}")
    OUTPUT.write_text(json.dumps(json.loads(line[len("FIELDS-JSON ") :]), indent=1) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
