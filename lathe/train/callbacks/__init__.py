"""The event vocabulary and what listens to it: TrainerCallback and CallbackHandler (events.py), the
default flow, printer, progress and early-stopping callbacks (flow.py), the debug hooks (debug.py), the
just-in-time checkpoint callback (jit_checkpoint.py) and the reporters report_to names (reporters/).
May import lathe.train.state; the Trainer imports this package, never the other way round."""
