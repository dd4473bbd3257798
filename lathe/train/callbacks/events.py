"""TrainerCallback (the event vocabulary), DefaultFlowCallback (when to log, evaluate, save and stop) and
CallbackHandler (ordered dispatch and flag resets, with a warning when no DefaultFlowCallback is listed)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)


class TrainerCallback:
    """Observe the loop and steer it through `control`'s flags; every event receives
    `(args, state, control, **kwargs)` with kwargs model, processing_class, optimizer, lr_scheduler,
    train_dataloader, eval_dataloader (plus metrics / logs for the events that have them).
    Return `control` (or None when unchanged)."""

    def on_init_end(self, args, state, control, **kwargs):
        """After the Trainer's __init__."""

    def on_train_begin(self, args, state, control, **kwargs):
        """At the start of train()."""

    def on_train_end(self, args, state, control, **kwargs):
        """At the end of train()."""

    def on_epoch_begin(self, args, state, control, **kwargs):
        """At the start of an epoch."""

    def on_epoch_end(self, args, state, control, **kwargs):
        """At the end of an epoch."""

    def on_step_begin(self, args, state, control, **kwargs):
        """At the start of an update step (before its first micro-batch)."""

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """After clipping, before optimizer.step()."""

    def on_optimizer_step(self, args, state, control, **kwargs):
        """After optimizer.step(), before zero_grad (gradients are still there)."""

    def on_substep_end(self, args, state, control, **kwargs):
        """After each micro-batch that is not the last of its accumulation window."""

    def on_step_end(self, args, state, control, **kwargs):
        """After an update step (global_step already incremented)."""

    def on_evaluate(self, args, state, control, **kwargs):
        """After an evaluation; kwargs has `metrics`."""

    def on_predict(self, args, state, control, metrics, **kwargs):
        """After predict()."""

    def on_save(self, args, state, control, **kwargs):
        """After a checkpoint is saved."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        """After logging; kwargs has `logs`."""

    def on_prediction_step(self, args, state, control, **kwargs):
        """After each evaluation/prediction batch."""

    def on_push_begin(self, args, state, control, **kwargs):
        """Kept for API compatibility: lathe never pushes to a hub."""


class DefaultFlowCallback(TrainerCallback):
    """Sets should_log / should_evaluate / should_save / should_training_stop from the strategies.

    transformers' rules exactly: the final step logs only on the logging grid (the run's loss is in the
    final `train_loss`), and evaluates and saves under "steps" strategies whether on their grids or not.
    """

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if args.logging_strategy == "steps" and step % state.logging_steps == 0:
            control.should_log = True
        if args.eval_strategy == "steps" and step % state.eval_steps == 0 and args.eval_delay <= step:
            control.should_evaluate = True
        if args.save_strategy == "steps" and state.save_steps > 0 and step % state.save_steps == 0:
            control.should_save = True

        if step >= state.max_steps:
            control.should_training_stop = True
            if args.eval_strategy == "steps" and step % state.eval_steps != 0 and args.eval_delay <= step:
                control.should_evaluate = True  # not twice when the last step is on the evaluation grid
            if args.save_strategy == "steps":
                control.should_save = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if args.logging_strategy == "epoch":
            control.should_log = True
        if args.eval_strategy == "epoch" and args.eval_delay <= state.epoch:
            control.should_evaluate = True
        if args.save_strategy == "epoch":
            control.should_save = True
        return control


class CallbackHandler(TrainerCallback):
    """Calls the callbacks in insertion order (no priorities) and resets the control flags that
    each event owns, exactly as transformers does."""

    def __init__(self, callbacks, model, processing_class, optimizer, lr_scheduler):
        self.callbacks = []
        self._listeners: dict[str, list] = {}
        for callback in callbacks:
            self.add_callback(callback)
        if not any(isinstance(callback, DefaultFlowCallback) for callback in self.callbacks):
            logger.warning(
                "The Trainer will not log, evaluate, save or stop at max_steps without a DefaultFlowCallback; add one "
                f"with trainer.add_callback(DefaultFlowCallback). Current callbacks:\n{self.callback_list}"
            )
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None

    def add_callback(self, callback):
        instance = callback() if isinstance(callback, type) else callback
        callback_class = callback if isinstance(callback, type) else callback.__class__
        if callback_class in [c.__class__ for c in self.callbacks]:
            # Formatted here, as transformers does: code that patches logger.warning reads the message itself.
            logger.warning(
                f"Adding a {callback_class.__name__} to the callbacks of this Trainer, but there is already one. "
                f"Current callbacks:\n{self.callback_list}"
            )
        self.callbacks.append(instance)
        self._listeners.clear()

    def pop_callback(self, callback):
        for existing in self.callbacks:
            if (isinstance(callback, type) and isinstance(existing, callback)) or existing == callback:
                self.callbacks.remove(existing)
                self._listeners.clear()
                return existing
        return None

    def remove_callback(self, callback):
        if isinstance(callback, type):
            for existing in self.callbacks:
                if isinstance(existing, callback):
                    self.callbacks.remove(existing)
                    break
        else:
            self.callbacks.remove(callback)
        self._listeners.clear()

    @property
    def callback_list(self) -> str:
        return "\n".join(cb.__class__.__name__ for cb in self.callbacks)

    def on_init_end(self, args, state, control):
        return self.call_event("on_init_end", args, state, control)

    def on_train_begin(self, args, state, control):
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control)

    def on_train_end(self, args, state, control):
        return self.call_event("on_train_end", args, state, control)

    def on_epoch_begin(self, args, state, control):
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control)

    def on_epoch_end(self, args, state, control):
        return self.call_event("on_epoch_end", args, state, control)

    def on_step_begin(self, args, state, control):
        control.should_log = False
        control.should_evaluate = False
        control.should_save = False
        return self.call_event("on_step_begin", args, state, control)

    def on_pre_optimizer_step(self, args, state, control):
        return self.call_event("on_pre_optimizer_step", args, state, control)

    def on_optimizer_step(self, args, state, control):
        return self.call_event("on_optimizer_step", args, state, control)

    def on_substep_end(self, args, state, control):
        return self.call_event("on_substep_end", args, state, control)

    def on_step_end(self, args, state, control):
        return self.call_event("on_step_end", args, state, control)

    def on_evaluate(self, args, state, control, metrics):
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics)

    def on_predict(self, args, state, control, metrics):
        return self.call_event("on_predict", args, state, control, metrics=metrics)

    def on_save(self, args, state, control):
        control.should_save = False
        return self.call_event("on_save", args, state, control)

    def on_log(self, args, state, control, logs):
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs)

    def on_prediction_step(self, args, state, control):
        return self.call_event("on_prediction_step", args, state, control)

    def on_push_begin(self, args, state, control, **kwargs):
        return self.call_event("on_push_begin", args, state, control, **kwargs)

    def has_listeners(self, event: str) -> bool:
        """Whether any callback overrides `event` (the Trainer skips work only listeners need)."""
        return bool(self._listeners_of(event))

    def _listeners_of(self, event: str) -> list:
        # Only callbacks that override an event are called for it: calling the inherited no-op
        # would return None and change nothing, so skipping it is equivalent and saves the
        # per-step cost of building kwargs for every callback.
        listeners = self._listeners.get(event)
        if listeners is None:
            base = getattr(TrainerCallback, event)
            listeners = [cb for cb in self.callbacks if getattr(type(cb), event, base) is not base or event in vars(cb)]
            self._listeners[event] = listeners
        return listeners

    def call_event(self, event, args, state, control, **kwargs):
        for callback in self._listeners_of(event):
            result = getattr(callback, event)(
                args,
                state,
                control,
                model=self.model,
                processing_class=self.processing_class,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **kwargs,
            )
            if result is not None:  # a callback may return None when it changed nothing
                control = result
        return control
