"""GRPOConfig: TRL's GRPO settings (names and defaults of trl 1.16's GRPOConfig) on lathe's TrainingArguments; and
RLOOConfig, TRL's RLOOConfig (GRPO's sampling and batching settings, RLOO's defaults and its two keys)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from lathe.train.args.training_args import TrainingArguments

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
ROLLOUT_ENGINES = ("generate", "lathe")


@dataclass
class GRPOConfig(TrainingArguments):
    """TrainingArguments plus the GRPO settings. Defaults are TRL's (learning_rate 1e-6, loss_type "dapo",
    beta 0.0, num_generations 8, max_completion_length 512, remove_unused_columns False, ...)."""

    learning_rate: float = 1e-6
    logging_steps: float = 10
    gradient_checkpointing: bool = True
    bf16: bool | None = None  # None: True unless fp16, as TRL's configs
    remove_unused_columns: bool = False
    disable_dropout: bool = False
    # data and generation
    num_generations: int = 8
    max_prompt_length: int | None = None
    max_completion_length: int = 512
    shuffle_dataset: bool = True
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generation_kwargs: dict | None = None
    ds3_gather_for_generation: bool = True
    rollout_engine: str = "generate"  # lathe's own: "lathe" (rollouts.py, opt-in); TRL's draws: "generate"
    chat_template_kwargs: dict | None = None
    # the objective
    beta: float = 0.0
    num_iterations: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    top_entropy_quantile: float = 1.0
    sapo_temperature_neg: float = 1.05
    sapo_temperature_pos: float = 1.0
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    reward_weights: list[float] | None = None
    scale_rewards: str = "group"
    multi_objective_aggregation: str = "sum_then_normalize"
    loss_type: str = "dapo"
    mask_truncated_completions: bool = False
    use_bias_correction_kl: bool = True
    log_completions: bool = False
    max_tool_calling_iterations: int | None = None  # None: sample again while the model calls tools
    # the reward functions, by name (`module:function` or a reward-model folder); GRPOTrainer's reward_funcs wins
    reward_funcs: list[str] | None = field(default=None)

    def __post_init__(self):
        self.bf16 = not self.fp16 if self.bf16 is None else self.bf16
        super().__post_init__()
        # TRL's CLI accepts booleans for scale_rewards: True is "group", False "none".
        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        self._check_choices()
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0, 1]; got {self.top_entropy_quantile}.")
        if self.rollout_engine == "lathe":
            from lathe.llm.rl.rollouts import check_generation_kwargs

            check_generation_kwargs(self.generation_kwargs)
        if self.auto_find_batch_size:
            raise ValueError(
                "auto_find_batch_size is not supported by GRPO: a smaller batch would split the groups of "
                "num_generations completions. Lower per_device_train_batch_size instead."
            )
        global_batch = self.per_device_train_batch_size * self.world_size
        if self.generation_batch_size is None and self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
            self.generation_batch_size = global_batch * self.steps_per_generation
        elif self.generation_batch_size is not None and self.steps_per_generation is None:
            if self.generation_batch_size % global_batch != 0:
                raise ValueError(
                    f"generation_batch_size ({self.generation_batch_size}) must be divisible by the global batch "
                    f"size ({global_batch})."
                )
            self.steps_per_generation = self.generation_batch_size // global_batch
        elif self.generation_batch_size is None:
            self.generation_batch_size = global_batch * self.steps_per_generation
        else:
            raise ValueError("Set generation_batch_size or steps_per_generation, not both.")
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations must be at least 2 (the advantages compare completions of one prompt); got "
                f"{self.num_generations}."
            )
        if self.generation_batch_size % self.num_generations != 0:
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size}) must be divisible by num_generations "
                f"({self.num_generations})."
            )
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations must be at least 1; got {self.num_iterations}.")
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 0:
            raise ValueError(f"max_tool_calling_iterations must be >= 0; got {self.max_tool_calling_iterations}.")

    def _check_choices(self) -> None:
        """Each key with a fixed set of values holds one of them."""
        for key, choices in (
            ("scale_rewards", SCALE_REWARDS),
            ("loss_type", LOSS_TYPES),
            ("multi_objective_aggregation", AGGREGATIONS),
            ("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS),
            ("rollout_engine", ROLLOUT_ENGINES),
        ):
            if getattr(self, key) not in choices:
                raise ValueError(f"{key} must be one of {', '.join(choices)}; got {getattr(self, key)!r}.")

    @property
    def epsilon_low(self) -> float:
        return self.epsilon


# GRPOConfig keys TRL's RLOOConfig does not have: RLOO does not read them, so a value other than the default is
# refused (naming the key) rather than dropped.
GRPO_ONLY_KEYS = (
    "delta",
    "importance_sampling_level",
    "top_entropy_quantile",
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "scale_rewards",
    "multi_objective_aggregation",
    "loss_type",
    "use_bias_correction_kl",
)


@dataclass
class RLOOConfig(GRPOConfig):
    """GRPOConfig's sampling and batching settings with TRL's RLOOConfig defaults (num_generations 2, beta 0.05)
    plus normalize_advantages (the batch's advantages to mean 0, std 1) and reward_clip_range ((low, high) clamp
    of the summed reward before the KL penalty)."""

    num_generations: int = 2
    beta: float = 0.05
    normalize_advantages: bool = False
    reward_clip_range: tuple[float, float] | None = None

    def __post_init__(self):
        defaults = {f.name: f.default for f in fields(GRPOConfig)}
        for key in GRPO_ONLY_KEYS:
            value = getattr(self, key)
            if value != defaults[key] and not (key == "scale_rewards" and value is True):
                raise ValueError(f"{key} is a GRPO setting that RLOO (TRL's RLOOConfig) does not have; got {value!r}.")
        if self.reward_clip_range is not None:
            low_high = list(self.reward_clip_range)
            if len(low_high) != 2 or low_high[0] > low_high[1]:
                raise ValueError(
                    f"reward_clip_range must be (low, high) with low <= high; got {self.reward_clip_range}."
                )
            self.reward_clip_range = (float(low_high[0]), float(low_high[1]))
        super().__post_init__()
