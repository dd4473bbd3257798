"""The `stage: grpo` (and `stage: rloo`) keys of `lathe train`: TRL 1.16 GRPOConfig's names and defaults
(FinetuningArguments inherits them, as LLaMA-Factory keeps its ppo_* / pref_* keys there), their checks, and the
GRPOConfig (RLOOConfig) a run trains with (the training section plus these keys). Stage rloo reads TRL's
RLOOConfig keys: GRPO's sampling and batching keys with RLOO's defaults (num_generations 2, beta 0.05), plus
normalize_advantages and reward_clip_range; the GRPO-only keys (loss_type, delta, ...) are errors there.

Four names are also LLaMA-Factory generating keys: temperature, top_p, top_k and repetition_penalty. Under
`stage: grpo` they are GRPO's sampling settings with TRL's defaults (1.0, 1.0, 0, 1.0), not LLaMA-Factory's
(0.95, 0.7, 50, 1.0); the generating keys GRPO does not read (max_new_tokens: use max_completion_length;
do_sample, num_beams, ...) are errors there, never silently dropped."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field, fields

from lathe.llm.config.values import split_commas

__all__ = ["GRPOArguments", "check_grpo_options", "grpo_config"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
SHARED_WITH_GENERATING = ("temperature", "top_p", "top_k", "repetition_penalty")
# LLaMA-Factory generating keys (with their defaults) that GRPO's sampling does not read.
GENERATING_NOT_READ = {
    "do_sample": True,
    "num_beams": 1,
    "max_length": 1024,
    "max_new_tokens": 1024,
    "length_penalty": 1.0,
    "skip_special_tokens": True,
}
# Keys of only one of the two stages (TRL's RLOOConfig lacks the first, GRPOConfig the second).
GRPO_ONLY = (  # TRL's RLOOTrainer / RLOOConfig have none of these
    "rollout_func",
    "tools",
    "environment_factory",
    "max_tool_calling_iterations",
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
RLOO_ONLY = ("normalize_advantages", "reward_clip_range")
STAGE_DEFAULTS = {"grpo": {"num_generations": 8, "beta": 0.0}, "rloo": {"num_generations": 2, "beta": 0.05}}


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class GRPOArguments:
    """GRPO's keys (stage grpo); checked by check_grpo_keys from FinetuningArguments.__post_init__."""

    reward_funcs: str | list[str] | None = field(
        default=None,
        metadata=_help(
            "grpo: reward functions, comma separated: 'module:function' (imported from the config file's folder, "
            "then the working directory, then sys.path) or a reward-model folder (e.g. from stage rm)."
        ),
    )
    rollout_func: str | None = field(
        default=None,
        metadata=_help(
            "grpo: 'module:function' (TRL's rollout_func(prompts, trainer) -> prompt_ids, completion_ids, logprobs, "
            "[env_mask], columns for the rewards) instead of sampling; imported as reward functions are."
        ),
    )
    tools: str | list[str] | None = field(
        default=None,
        metadata=_help(
            "grpo: tool functions the model may call, comma separated 'module:function' (imported as reward functions "
            "are); their JSON schemas come from their signatures and docstrings (TRL's tools)."
        ),
    )
    environment_factory: str | dict | None = field(
        default=None,
        metadata=_help(
            "grpo: 'module:Class' of an environment (reset(**row), tool methods, optional get_reward()), or a mapping "
            "{name: 'module:Class'} picked per row by its `environment` column (TRL's environment_factory)."
        ),
    )
    max_tool_calling_iterations: int | None = field(
        default=None, metadata=_help("grpo: most rounds of tool calls per completion (None: no limit).")
    )
    reward_weights: str | list[float] | None = field(
        default=None, metadata=_help("grpo: one weight per reward function (default: all 1.0).")
    )
    num_generations: int | None = field(
        default=None, metadata=_help("grpo/rloo: completions sampled per prompt (a group; default grpo 8, rloo 2).")
    )
    max_prompt_length: int | None = field(
        default=None, metadata=_help("grpo: keep the last this many prompt tokens (None: the whole prompt).")
    )
    max_completion_length: int = field(default=512, metadata=_help("grpo: most tokens sampled per completion."))
    shuffle_dataset: bool = field(default=True, metadata=_help("grpo: shuffle the prompts (TRL's sampler order)."))
    generation_batch_size: int | None = field(
        default=None, metadata=_help("grpo: completions per generation (default: global batch x accumulation).")
    )
    steps_per_generation: int | None = field(
        default=None, metadata=_help("grpo: micro-steps served by one generation (default: gradient accumulation).")
    )
    temperature: float = field(default=1.0, metadata=_help("grpo: sampling temperature (TRL's default, 1.0)."))
    top_p: float = field(default=1.0, metadata=_help("grpo: nucleus sampling mass (TRL's default, 1.0)."))
    top_k: int = field(default=0, metadata=_help("grpo: sample among the k most likely tokens (0: all)."))
    repetition_penalty: float = field(default=1.0, metadata=_help("grpo: repetition penalty (1.0: none)."))
    beta: float | None = field(
        default=None,
        metadata=_help("grpo/rloo: KL weight (default grpo 0.0, rloo 0.05); 0 loads and runs no reference model."),
    )
    normalize_advantages: bool = field(
        default=False, metadata=_help("rloo: the batch's advantages to mean 0 and std 1.")
    )
    reward_clip_range: str | list[float] | None = field(
        default=None, metadata=_help("rloo: 'low,high': the summed reward clamped before the KL penalty.")
    )
    epsilon: float = field(default=0.2, metadata=_help("grpo: lower clipping bound of the ratio (1 - epsilon)."))
    epsilon_high: float | None = field(
        default=None, metadata=_help("grpo: upper clipping bound (1 + epsilon_high; default epsilon).")
    )
    delta: float | None = field(
        default=None, metadata=_help("grpo: two-sided clipping, the unclipped ratio capped at delta (INTELLECT-2).")
    )
    importance_sampling_level: str = field(
        default="token",
        metadata=_help("grpo: the ratio per token, or per sequence (GSPO: its tokens' mean log-ratio)."),
    )
    top_entropy_quantile: float = field(
        default=1.0, metadata=_help("grpo: only the top this share of completion tokens by entropy add policy loss.")
    )
    sapo_temperature_neg: float = field(default=1.05, metadata=_help("grpo, sapo: the gate's temperature, A <= 0."))
    sapo_temperature_pos: float = field(default=1.0, metadata=_help("grpo, sapo: the gate's temperature, A > 0."))
    vespo_k_pos: float = field(default=2.0, metadata=_help("grpo, vespo: the gamma weight's k, A >= 0."))
    vespo_lambda_pos: float = field(default=3.0, metadata=_help("grpo, vespo: the gamma weight's lambda, A >= 0."))
    vespo_k_neg: float = field(default=3.0, metadata=_help("grpo, vespo: the gamma weight's k, A < 0."))
    vespo_lambda_neg: float = field(default=2.0, metadata=_help("grpo, vespo: the gamma weight's lambda, A < 0."))
    use_bias_correction_kl: bool = field(
        default=True, metadata=_help("grpo: weight the per-token KL by the importance ratio.")
    )
    min_p: float | None = field(default=None, metadata=_help("grpo: min-p sampling (None: off)."))
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata=_help("grpo/rloo, DeepSpeed ZeRO-3: gather the weights whole for sampling (false: layer by layer)."),
    )
    rollout_engine: str = field(
        default="generate",
        metadata=_help(
            "grpo/rloo: 'generate' (transformers' generate, TRL's draws) or 'lathe' (lathe's batched decoding loop "
            "that drops finished rows: faster, the same distribution, not the same tokens; docs/GRPO.md)."
        ),
    )
    generation_kwargs: dict | None = field(
        default=None, metadata=_help("grpo: more GenerationConfig settings for sampling; they win over the others.")
    )
    disable_dropout: bool = field(
        default=False, metadata=_help("grpo/rloo: dropout off in the policy (and the reference), as TRL's key.")
    )
    num_iterations: int = field(default=1, metadata=_help("grpo: updates per generation batch (mu)."))
    loss_type: str = field(
        default="dapo", metadata=_help("grpo: grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo or vespo (TRL's).")
    )
    scale_rewards: str = field(
        default="group", metadata=_help("grpo: divide advantages by the group's std, the batch's, or none.")
    )
    multi_objective_aggregation: str = field(
        default="sum_then_normalize",
        metadata=_help("grpo: weighted sum then group normalisation, or each reward normalised then summed (GDPO)."),
    )
    mask_truncated_completions: bool = field(
        default=False, metadata=_help("grpo: completions cut at max_completion_length add no loss.")
    )

    def check_grpo_keys(self) -> None:
        if self.stage not in ("grpo", "rloo"):
            for f in fields(GRPOArguments):
                if f.name not in SHARED_WITH_GENERATING and getattr(self, f.name) != f.default:
                    raise ValueError(
                        f"{f.name} only applies to stages grpo and rloo (this config's stage is {self.stage})."
                    )
            return
        only, other = (RLOO_ONLY, GRPO_ONLY) if self.stage == "grpo" else (GRPO_ONLY, RLOO_ONLY)
        defaults = {f.name: f.default for f in fields(GRPOArguments)}
        for key in only:
            if getattr(self, key) != defaults[key] and not (key == "scale_rewards" and getattr(self, key) is True):
                raise ValueError(
                    f"{key} is a key of stage {'rloo' if self.stage == 'grpo' else 'grpo'}; stage {self.stage} "
                    f"(TRL's {'GRPOConfig' if self.stage == 'grpo' else 'RLOOConfig'}) does not read it."
                )
        stage_defaults = STAGE_DEFAULTS[self.stage]
        self.num_generations = (
            stage_defaults["num_generations"] if self.num_generations is None else self.num_generations
        )
        self.beta = stage_defaults["beta"] if self.beta is None else self.beta
        self._check_rewards()
        self._check_grpo_values()
        if self.stage == "rloo" and self.reward_clip_range is not None:
            values = split_commas(self.reward_clip_range)
            try:
                low, high = (float(v) for v in values)
            except (TypeError, ValueError):
                raise ValueError(f"reward_clip_range must be two numbers 'low,high'; got {values!r}.") from None
            if low > high:
                raise ValueError(f"reward_clip_range must be 'low,high' with low <= high; got {values!r}.")
            self.reward_clip_range = [low, high]

    def _check_rewards(self) -> None:
        self.reward_funcs = split_commas(self.reward_funcs) or []
        self.tools = split_commas(self.tools) or []
        if isinstance(self.environment_factory, str) and self.environment_factory.lstrip().startswith("{"):
            try:  # a mapping given on the command line
                self.environment_factory = json.loads(self.environment_factory)
            except json.JSONDecodeError as error:
                raise ValueError(f"environment_factory: not a JSON mapping ({error.msg}).") from None
        if isinstance(self.environment_factory, dict) and not self.environment_factory:
            raise ValueError("environment_factory: an empty mapping names no environment.")
        factories = self.environment_factory
        names = list(factories.values()) if isinstance(factories, dict) else [factories] if factories else []
        for key, values in (("tools", self.tools), ("environment_factory", names)):
            for value in values:
                if not isinstance(value, str) or ":" not in value:
                    raise ValueError(f"{key}: {value!r} is not 'module:name' (e.g. 'calculator:add').")
        if not self.reward_funcs and not factories:
            raise ValueError(
                f"reward_funcs is required for stage {self.stage}: 'module:function' names or model folders (or an "
                "environment_factory whose environment has get_reward())."
            )
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 0:
            raise ValueError(f"max_tool_calling_iterations must be >= 0; got {self.max_tool_calling_iterations}.")
        if self.reward_weights is not None:
            weights = split_commas(self.reward_weights)
            try:
                self.reward_weights = [float(w) for w in weights]
            except (TypeError, ValueError):
                raise ValueError(f"reward_weights must be numbers, got {weights!r}") from None
            if len(self.reward_weights) != len(self.reward_funcs):
                raise ValueError(
                    f"reward_weights has {len(self.reward_weights)} values for {len(self.reward_funcs)} reward_funcs."
                )

    def _check_grpo_values(self) -> None:
        self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        for key, choices in (
            ("loss_type", LOSS_TYPES),
            ("scale_rewards", SCALE_REWARDS),
            ("importance_sampling_level", ("token", "sequence")),
            ("multi_objective_aggregation", ("sum_then_normalize", "normalize_then_sum")),
        ):
            if getattr(self, key) not in choices:
                raise ValueError(f"{key} must be one of {', '.join(choices)}; got {getattr(self, key)!r}.")
        for key, low in (("num_generations", 2), ("max_completion_length", 1), ("num_iterations", 1)):
            if getattr(self, key) < low:
                raise ValueError(f"{key} must be at least {low}; got {getattr(self, key)}.")
        for key in ("max_prompt_length", "generation_batch_size", "steps_per_generation"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"{key} must be a positive integer; got {getattr(self, key)}.")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.repetition_penalty <= 0:
            raise ValueError(
                f"stage {self.stage} samples: temperature and repetition_penalty must be > 0, top_p in (0, 1], top_k >= 0 "
                f"(got {self.temperature}, {self.repetition_penalty}, {self.top_p}, {self.top_k})."
            )
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0) or self.beta < 0:
            raise ValueError("epsilon, epsilon_high and beta must be >= 0.")


def check_grpo_options(data, training, finetuning, generating, where: str) -> None:
    """What stage grpo does not read, refused; the GRPOConfig built once, so its rules (divisibility of the
    batches by num_generations, ...) stop the run here, naming the keys."""
    if finetuning.stage not in ("grpo", "rloo"):
        return
    for key, default in GENERATING_NOT_READ.items():
        if generating is not None and getattr(generating, key) != default:
            hint = " (use max_completion_length)" if key in ("max_new_tokens", "max_length") else ""
            raise ValueError(f"{key}{where} is a generating key that stage {finetuning.stage} does not read{hint}.")
    if data.cutoff_len != 2048:
        raise ValueError(
            f"cutoff_len{where} is not read by stage {finetuning.stage}: use max_prompt_length and max_completion_length."
        )
    if training.use_liger_kernel:  # GRPO's log-probs are its own, not the causal-LM loss Liger fuses
        raise ValueError(f"enable_liger_kernel{where} is not read by stage {finetuning.stage}.")
    if data.eval_dataset or data.val_size > 1e-6 or training.do_eval or training.do_predict:
        raise ValueError(
            f"stage {finetuning.stage}{where} trains only: evaluation (eval_dataset, val_size, do_eval) is not supported yet."
        )
    try:
        grpo_config(training, finetuning)
    except ValueError as error:
        raise ValueError(f"{error}{where}") from None


def grpo_config(training, finetuning):
    """lathe.llm.rl.GRPOConfig (stage rloo: RLOOConfig): the training section's values (LLaMA-Factory's training
    defaults, e.g. learning_rate 5e-5, not TRL's 1e-6) and the stage's keys."""
    from lathe.llm.rl.config import GRPOConfig, RLOOConfig
    from lathe.train.args.training_args import TrainingArguments

    rloo = finetuning.stage == "rloo"
    left_out = ("reward_funcs", "rollout_func", "tools", "environment_factory", *(GRPO_ONLY if rloo else RLOO_ONLY))

    values = {
        f.name: getattr(training, f.name) for f in fields(TrainingArguments) if f.init and hasattr(training, f.name)
    }
    values.update(
        {
            f.name: getattr(finetuning, f.name)
            for f in fields(GRPOArguments)
            if f.name
            not in left_out  # reward_funcs, rollout_func, tools, environment_factory: the trainer's arguments, as in TRL
        }
    )
    values.pop("overwrite_output_dir", None)  # read by the recipe (resume or not), not by transformers 5's arguments
    # GRPO's loss is its own (log-probs of sampled tokens), not the causal-LM loss the chunked path serves.
    values.update(remove_unused_columns=False, chunked_cross_entropy="no")
    with warnings.catch_warnings():  # gradient_checkpointing* are copied with their new names' values: no news
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing", category=FutureWarning)
        return (RLOOConfig if rloo else GRPOConfig)(**values, reward_funcs=list(finetuning.reward_funcs))
