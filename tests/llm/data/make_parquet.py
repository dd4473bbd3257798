"""Rebuilds the .parquet test files from their .json twins: python tests/llm/data/make_parquet.py"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))

for name in ("alpaca", "sharegpt", "openai"):
    with open(os.path.join(HERE, f"{name}.json"), encoding="utf-8") as handle:
        rows = json.load(handle)
    columns = list(dict.fromkeys(key for row in rows for key in row))  # every row gets every column
    rows = [{key: row.get(key) for key in columns} for row in rows]
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(HERE, f"{name}.parquet"))
