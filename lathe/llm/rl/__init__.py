"""Online reinforcement learning (GRPO and RLOO, as TRL's GRPOTrainer and RLOOTrainer): sample completions, score them with reward
functions, and train on group-normalised advantages.

- config.py: GRPOConfig, TRL's GRPO settings (names and defaults) on lathe's TrainingArguments.
- sampler.py: the repeated-prompt sampler (each prompt num_generations times, reused over iterations).
- rewards.py: reward functions (callables, `module:function` names, reward-model folders) and their calls.
- losses.py: advantages, the clipped per-token objective, the KL term and the loss aggregation per loss_type.
- generation.py: prompt rendering, sampling through the model's `generate` and completion masks.
- reward_models.py: `stage: rm` output folders (a causal LM and its value head) as reward functions.
- scoring.py: one generation batch: sample, score, log-probs, advantages.
- tools.py: TRL's tools: prompts rendered with the tools, the tool-calling loop, results appended (masked).
- tool_parsing.py: tool schemas, tool calls parsed from generated text (typed by the schemas) and run.
- environments.py: TRL's environment_factory: per-rollout instances, reset(**row), their tools and rewards.
- resume.py: what a checkpoint carries for an exact resume (the buffered generation, the step counter).
- trainer.py: GRPOTrainer on lathe.train.Trainer, with TRL's logged metrics.
- rollouts.py: the opt-in rollout engine (rollout_engine "lathe"): batched KV-cache sampling that drops ended rows.
- rloo.py: RLOOConfig and RLOOTrainer (TRL's RLOO: leave-one-out baseline, KL in the reward, sequence ratio).

`stage: grpo` (and `stage: rloo`) in `lathe train` is lathe.llm.workflows.grpo (its keys: lathe.llm.config.grpo; its prompts:
lathe.llm.data.prompts; its memory plan: lathe.llm.memory.grpo).

Sampling reproduces TRL's `model.generate` call (same GenerationConfig, same global-RNG draw order), so a
fixed seed samples the same tokens as TRL on the CPU.
"""

from lathe.llm.rl.config import GRPOConfig
from lathe.llm.rl.rloo import RLOOConfig, RLOOTrainer
from lathe.llm.rl.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer", "RLOOConfig", "RLOOTrainer"]
