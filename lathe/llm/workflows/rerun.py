"""A `lathe train` into an output_dir an earlier run wrote: a finished run is left as it is (not resumed into
nothing, its results not overwritten with train_loss 0.0), and a resume names the keys that changed."""

from __future__ import annotations

import json
import logging
import os

from lathe.llm.workflows.run_config import RUN_CONFIG_NAME

__all__ = ["finished_run_message", "changed_keys", "warn_about_changed_keys", "check_same_model"]

logger = logging.getLogger(__name__)

# A file only the end of a training run writes (finish_training), and the state each checkpoint holds.
FINISHED_MARKER = "train_results.json"
FINAL_STATE = "trainer_state.json"
# Keys that say how to start, not what to train: a resume that differs in them is the same run.
NOT_COMPARED = ("resume_from_checkpoint", "overwrite_output_dir", "allow_model_change")


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def finished_run_message(config) -> str | None:
    """One line when `lathe train` would resume a finished run into nothing (LLaMA-Factory resumes from its
    last checkpoint, trains no step and rewrites train_results.json / all_results.json with train_loss 0.0);
    None when there is something to train. Raising max_steps (or num_train_epochs) continues the run."""
    training = config.training
    if (
        not training.do_train
        or training.overwrite_output_dir
        or training.resume_from_checkpoint not in (None, False, "")
    ):
        return None
    output_dir = training.output_dir
    if not os.path.isfile(os.path.join(output_dir, FINISHED_MARKER)):
        return None  # a run stopped before its end: resuming finishes it
    from lathe.train.checkpoints.layout import get_last_checkpoint

    last = get_last_checkpoint(output_dir)
    state = _read_json(os.path.join(last, FINAL_STATE)) if last is not None else None
    if state is None:
        return None  # no checkpoint: resolve_resume_checkpoint's own error (a trained model is here)
    step = int(state.get("global_step") or 0)
    if training.max_steps is not None and training.max_steps > 0:
        if training.max_steps > step:
            return None
    elif float(state.get("epoch") or 0) < training.num_train_epochs - 1e-6:
        return None  # by epochs: the checkpoint has not seen them all (more epochs, or max_steps stopped it)
    message = (
        f"run in {output_dir} already finished at step {step}; nothing to do "
        f"(use a new output_dir or overwrite_output_dir: true; raise max_steps to train on)"
    )
    changed = changed_keys(config)
    if changed:
        message += f". The config differs from that run's {RUN_CONFIG_NAME}: " + "; ".join(changed)
    return message


def changed_keys(config) -> list[str]:
    """ "key: now (from the config) != before (from lathe_train_config.yaml)" for each key that differs
    from the run config saved in output_dir; [] when there is none (or it is the older nested form)."""
    path = os.path.join(config.training.output_dir, RUN_CONFIG_NAME)
    if not os.path.isfile(path):
        return []
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            before = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(before, dict) or isinstance(before.get("model"), dict):
        return []  # an older lathe saved every resolved value per section, not the keys given
    now = config.given
    lines = []
    for key in dict.fromkeys([*now, *before]):
        if key in NOT_COMPARED or now.get(key) == before.get(key):
            continue
        new = now[key] if key in now else "(not set)"
        old = before[key] if key in before else "(not set)"
        lines.append(f"{key}: {new} (from the config) != {old} (from {RUN_CONFIG_NAME})")
    return lines


def warn_about_changed_keys(config, checkpoint: str) -> None:
    """transformers' warning when a resume's arguments differ from the checkpoint's trainer_state.json, for
    the keys of the lathe config: resuming with other values does not give the uninterrupted run."""
    changed = changed_keys(config)
    if changed:
        logger.warning(
            "Warning: The following keys do not match the ones of the run being resumed from %s: %s",
            checkpoint,
            "".join(f"\n\t{line}" for line in changed),
        )


def _same_model(now, before) -> bool:
    if now == before:
        return True
    if isinstance(now, str) and isinstance(before, str) and os.path.isdir(now) and os.path.isdir(before):
        return os.path.realpath(now) == os.path.realpath(before)
    return False


def check_same_model(config, checkpoint: str) -> None:
    """A resume trains the model the run started from: another model_name_or_path than the one in
    output_dir/lathe_train_config.yaml is refused (the checkpoint's weights or adapter belong to that one),
    unless allow_model_change: true."""
    path = os.path.join(config.training.output_dir, RUN_CONFIG_NAME)
    if config.model.allow_model_change or not os.path.isfile(path):
        return
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            before = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return
    if not isinstance(before, dict) or "model_name_or_path" not in before:
        return
    now, then = config.given.get("model_name_or_path"), before["model_name_or_path"]
    if not _same_model(now, then):
        raise ValueError(
            f"resuming {checkpoint} with model_name_or_path {now!r}, but that run was trained from {then!r} "
            f"(its {RUN_CONFIG_NAME}): use another output_dir, or set allow_model_change: true to resume anyway."
        )
