"""Evaluation and prediction: the loop over prediction_step with predictions gathered on the CPU (loop.py),
Trainer.predict and its metrics (predicting.py), the best metric and result files (results.py), and the
value types Trainer methods return (outputs.py). May import data, checkpoints, optim, parallel, features,
batching (the loss denominator) and the leaves runtime and seed; never the training loop."""
