"""TrainerState (everything that crosses steps, JSON round-trip) and TrainerControl (the five flags)."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any


class ExportableState:
    """Mixin for callbacks whose state must survive a checkpoint.

    `state()` returns {"args": <constructor kwargs>, "attributes": <mutable attributes>}; on resume
    with `restore_callback_states_from_checkpoint`, the Trainer rebuilds the callback from "args" and
    sets "attributes" back (the same contract as transformers).
    """

    def state(self) -> dict:
        raise NotImplementedError("You must implement a `state` function to utilize this class.")

    @classmethod
    def from_state(cls, state: dict):
        instance = cls(**state["args"])
        for name, value in state["attributes"].items():
            setattr(instance, name, value)
        return instance


@dataclass
class TrainerState:
    """The state of a run, saved as `trainer_state.json` in every checkpoint (same keys as transformers)."""

    epoch: float = 0  # transformers 5: 0 before any step (an evaluate() before train() logs epoch 0)
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, float]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, Any] | None = None
    stateful_callbacks: dict[str, Any] | None = None

    def __post_init__(self):
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif isinstance(self.stateful_callbacks, dict):
            # Already a mapping of name -> state(s) (loaded from JSON); keep it as is.
            pass
        else:
            # A list of callbacks: record each one's exportable state, grouped by class name.
            callbacks = self.stateful_callbacks
            self.stateful_callbacks = {}
            for callback in callbacks:
                if not isinstance(callback, ExportableState):
                    raise TypeError(
                        f"All callbacks passed to be saved must inherit `ExportableState`, but received {type(callback)}"
                    )
                name = callback.__class__.__name__
                if name in self.stateful_callbacks:
                    if not isinstance(self.stateful_callbacks[name], list):
                        self.stateful_callbacks[name] = [self.stateful_callbacks[name]]
                    self.stateful_callbacks[name].append(callback.state())
                else:
                    self.stateful_callbacks[name] = callback.state()

    def to_json_string(self) -> str:
        """Sorted, indented JSON (byte-compatible layout with transformers)."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    def save_to_json(self, json_path: str) -> None:
        text = self.to_json_string()
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(text)

    @classmethod
    def load_from_json(cls, json_path: str) -> "TrainerState":
        """The state saved in `json_path`; a file that is not JSON, or holds a value of the wrong
        type, is a CheckpointFileError naming it (rather than a failure steps later)."""
        from lathe.train.checkpoints.layout import CheckpointFileError

        try:
            with open(json_path, encoding="utf-8") as f:
                data = json.load(f)
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise CheckpointFileError(
                f"{json_path!r} is not valid JSON ({error}); the checkpoint is corrupt. "
                "Resume from an earlier checkpoint."
            ) from None
        known = {f.name for f in dataclasses.fields(cls)}
        problem = _json_type_problem(data, cls)
        if problem is not None:
            raise CheckpointFileError(
                f"{json_path!r} is not a trainer state: {problem}. Resume from an earlier checkpoint."
            )
        # Files written by newer or older transformers may carry extra keys; keep what we know.
        return cls(**{k: v for k, v in data.items() if k in known})

    def compute_steps(self, args, max_steps: int) -> None:
        """Resolve logging/eval/save steps given as a ratio (< 1) of the total steps into step counts."""
        for step_kind in ("logging", "eval", "save"):
            num_steps = getattr(args, f"{step_kind}_steps")
            if num_steps is not None:
                if num_steps < 1:
                    num_steps = math.ceil(max_steps * num_steps)
                setattr(self, f"{step_kind}_steps", int(num_steps))

    def init_training_references(self, trainer, max_steps, num_train_epochs, trial=None) -> None:
        """transformers' method: the run's length and the process flags. The trial's name and parameters
        (trial_name, trial_params) are looked up by lathe.train.features.hp_search, set in loop.new_state."""
        self.max_steps = max_steps
        self.num_train_epochs = num_train_epochs
        self.is_local_process_zero = trainer.is_local_process_zero()
        self.is_world_process_zero = trainer.is_world_process_zero()


def _json_type_problem(data, cls) -> str | None:
    """What in `data` (read from JSON) does not fit the field types of `cls`, or None."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        allowed = _json_types(hints.get(name, Any))
        if allowed is None:
            continue
        wrong_bool = isinstance(value, bool) and bool not in allowed
        if wrong_bool or not isinstance(value, allowed):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
            return f"{name} is {shown}, expected {' or '.join(t.__name__ for t in allowed)}"
    if any(not isinstance(entry, dict) for entry in data.get("log_history") or []):
        return "log_history holds an entry that is not an object"
    return None


def _json_types(hint) -> tuple | None:
    """The JSON value types a field annotated `hint` accepts; None for any."""
    if hint is Any:
        return None
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    allowed = []
    for member in members:
        origin = typing.get_origin(member) or member
        allowed += {float: [int, float], type(None): [type(None)]}.get(origin, [origin])
    return tuple(allowed) if all(isinstance(t, type) for t in allowed) else None


@dataclass
class TrainerControl(ExportableState):
    """The flags callbacks set to steer the loop; the Trainer acts on them in one place."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self):
        self.should_training_stop = False

    def _new_epoch(self):
        self.should_epoch_stop = False

    def _new_step(self):
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict:
        return {
            "args": {
                "should_training_stop": self.should_training_stop,
                "should_epoch_stop": self.should_epoch_stop,
                "should_save": self.should_save,
                "should_evaluate": self.should_evaluate,
                "should_log": self.should_log,
            },
            "attributes": {},
        }
