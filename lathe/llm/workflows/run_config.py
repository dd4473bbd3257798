"""output_dir/lathe_train_config.yaml: the keys a run was given, and for a resumed run, every invocation.

Its body is the flat config of the last invocation (`lathe train` reads it as it is, and the next resume
compares against it). A resumed run's header also records each invocation, the original and every resume, as
one `# invocation N: {json}` line each (the keys it was given and the checkpoint it resumed from), followed
by the commands that re-run the whole story in order into a new output_dir. A later resume reads those lines
back, so the story grows with each resume.
"""

from __future__ import annotations

import json
import os

__all__ = ["RUN_CONFIG_NAME", "read_invocations", "write_run_config"]

RUN_CONFIG_NAME = "lathe_train_config.yaml"
RECORD = "# invocation "
NOT_REPLAYED = ("output_dir", "resume_from_checkpoint", "overwrite_output_dir")


def read_invocations(path: str) -> list[dict]:
    """The invocations a run config records: [{"keys": {...}, "resumed_from": name or None}, ...]; one for a
    file written by a run that was never resumed (its body), [] when there is no readable file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        body = yaml.safe_load(text)
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(body, dict) or isinstance(body.get("model"), dict):
        return []  # an older lathe saved every resolved value per section, not the keys given
    records = []
    for line in text.splitlines():
        if line.startswith(RECORD):
            try:
                records.append(json.loads(line.split(": ", 1)[1]))
            except (IndexError, ValueError):
                return [{"keys": body, "resumed_from": None}]  # edited by hand: start the story from the body
    return records or [{"keys": body, "resumed_from": None}]


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _replay(invocation: dict, last: dict, path: str) -> str:
    """The command re-running one invocation: the file (the last keys) with this invocation's differences."""
    keys = invocation["keys"]
    overrides = [f"{key}={_value(keys[key])}" for key in keys if key not in NOT_REPLAYED and keys[key] != last.get(key)]
    missing = [key for key in last if key not in keys and key not in NOT_REPLAYED]
    command = " ".join(["lathe train", path, "output_dir=NEW_DIR", *overrides])
    return command + (f"  (without {', '.join(missing)})" if missing else "")


def write_run_config(config, resume_from: str | None = None) -> str | None:
    """Write output_dir/lathe_train_config.yaml (on the saving process): the keys this invocation was given,
    and with `resume_from` (a resumed run) the invocations before it, read back from the file it replaces."""
    if not config.training.should_save:
        return None
    import yaml

    os.makedirs(config.training.output_dir, exist_ok=True)
    path = os.path.join(config.training.output_dir, RUN_CONFIG_NAME)
    origin = f" from {config.source}" if config.source else ""
    invocations = read_invocations(path) if resume_from else []
    lines = [
        f"# The keys this run was given{origin} (command-line overrides included). `lathe train {path}` "
        f"reproduces it,\n# run from the same folder (relative paths) and with another output_dir "
        f"(output_dir=... on the command line).\n"
    ]
    if invocations:
        invocations.append({"keys": config.given, "resumed_from": os.path.basename(os.path.normpath(resume_from))})
        lines.append(
            f"# It was resumed {len(invocations) - 1} time(s): the keys below are the last invocation's. Each "
            "invocation, as given:\n"
        )
        lines += [f"{RECORD}{i}: {json.dumps(record)}\n" for i, record in enumerate(invocations, 1)]
        lines.append("# The whole story again, in order (each resume continues the run's last checkpoint):\n")
        lines += [f"#   {_replay(record, config.given, path)}\n" for record in invocations]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
        yaml.safe_dump(config.given, f, sort_keys=False)
    return path
