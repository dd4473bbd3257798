"""GRPOTrainer: TRL's GRPOTrainer on lathe.train.Trainer. Each generation batch (num_generations
completions of generation_batch_size / num_generations prompts) is sampled once, scored, turned into
advantages, shuffled, split into steps_per_generation micro-batches and reused num_iterations times.

Override points: get_train_dataloader (the repeated-prompt sampler), _prepare_inputs (sampling and the
buffer), compute_loss (the GRPO objective), training_step (step_time) and log (TRL's metrics)."""

from __future__ import annotations

import copy
import time
from collections import defaultdict

import torch
from torch.utils.data import DataLoader, Dataset

from lathe.llm.rl import generation, losses, rewards
from lathe.llm.rl.config import GRPOConfig
from lathe.llm.rl.sampler import RepeatedPromptSampler
from lathe.llm.rl.tools import setup_tool_calling
from lathe.train.data.sampling import ResumableBatchSampler
from lathe.train.trainer import Trainer


class _IndexedRows(Dataset):
    """The rows with their index, so that a failing reward function can name the row."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return index, self.dataset[index]


def _identity(batch):
    return batch


def _prepare_policy(model, processing_class, args):
    """The policy (loaded when `model` is a folder) and its tokenizer, whose pad token is the EOS token when
    it has none (as TRL's), with the model's pad ids set to it and dropout off when args.disable_dropout."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(model, str):
        model = AutoModelForCausalLM.from_pretrained(model)
    if processing_class is None:
        processing_class = AutoTokenizer.from_pretrained(model.config._name_or_path)
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if args.disable_dropout:
        from lathe.llm.model.frozen import disable_dropout

        disable_dropout(model)
    return model, tokenizer


def _policy_and_reference(model, args, peft_config):
    """The policy (with its LoRA adapter when peft_config) and the reference: none at beta 0; the policy with its
    adapter off under LoRA (no copy, so None here); else a frozen copy."""
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    reference = None
    if args.beta != 0.0 and not hasattr(model, "disable_adapter"):
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    return model, reference


class GRPOTrainer(Trainer):
    """GRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=..., processing_class=...,
    peft_config=None, rollout_func=None, tools=None, environment_factory=None). `model`: a model or a folder;
    `reward_funcs`: callables, `module:function` names or reward-model folders (one or a list); the dataset has a
    `prompt` column (text or a conversation). `tools` (callables or `module:function` names) and
    `environment_factory` (a class, `module:Class`, or a dict of them) are TRL's (lathe.llm.rl.tools,
    environments); lathe's own: `tool_format` (how tool calls are read back when the chat template renders) and
    `template` (a lathe Template that renders prompts and tool results instead of the chat template)."""

    loss_is_scaled_for_ga = True  # each loss_type divides for accumulation itself
    always_old_logps = False  # the old policy's log-probs only when a generation serves several updates

    def __init__(
        self,
        model,
        reward_funcs=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        reward_search_dirs=(),
        rollout_func=None,
        tools=None,
        environment_factory=None,
        tool_format=None,
        template=None,
    ):
        from lathe.train.seed import set_seed

        args = args if args is not None else GRPOConfig(output_dir="grpo_output")
        set_seed(args.seed)  # before the model: a LoRA adapter's initial weights are drawn from it
        model, tokenizer = _prepare_policy(model, processing_class, args)
        processing_class = processing_class if processing_class is not None else tokenizer
        model, self.ref_model = _policy_and_reference(model, args, peft_config)
        # An environment_factory may be the only reward source (its get_reward, added with the tools below).
        owns_reward = environment_factory is not None
        self._set_reward_functions(reward_funcs, args, reward_processing_classes, reward_search_dirs, owns_reward)
        super().__init__(
            model=model,
            args=args,
            data_collator=_identity,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self.model_accepts_loss_kwargs = False
        # One seed per process, so that processes sampling the same prompt draw different completions.
        set_seed(args.seed + args.process_index)
        if self.ref_model is not None:
            self.ref_model.to(self.args.device)
        self._tokenizer = tokenizer
        self.rollout_func = rollout_func
        if isinstance(rollout_func, str):  # `module:function`, as reward functions are named
            self.rollout_func = rewards.resolve_reward_function(rollout_func, reward_search_dirs)
        # TRL's tools / environment_factory (lathe.llm.rl.tools): a lathe `template` or the chat template renders.
        self.tool_calling = setup_tool_calling(
            self, tools, environment_factory, tool_format, template, reward_search_dirs
        )
        self.eos_token_ids = generation.eos_ids_of(model, tokenizer)
        self.generation_config = generation.generation_config(args, tokenizer, self.eos_token_ids)
        self._step = 0
        self._buffered_inputs = None
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._step_time = 0.0

    def _set_reward_functions(
        self, reward_funcs, args, reward_processing_classes, reward_search_dirs, owns_reward=False
    ) -> None:
        """The reward functions (callables, `module:function` names, reward-model folders), their names,
        tokenizers and weights."""
        reward_funcs = args.reward_funcs if reward_funcs is None else reward_funcs
        if reward_funcs is None and not owns_reward:
            raise ValueError("GRPOTrainer needs reward_funcs (callables, 'module:function' names or model folders).")
        reward_funcs = [] if reward_funcs is None else reward_funcs
        reward_funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.reward_funcs = [rewards.resolve_reward_function(f, reward_search_dirs) for f in reward_funcs]
        self.reward_func_names = [rewards.reward_function_name(f) for f in self.reward_funcs]
        self.reward_processing_classes = self._reward_tokenizers(reward_processing_classes)
        weights = args.reward_weights if args.reward_weights is not None else [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(weights)} values for {len(self.reward_funcs)} reward functions.")
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        for function in self.reward_funcs:
            if isinstance(function, torch.nn.Module):
                function.to(args.device)

    def _reward_tokenizers(self, given):
        from transformers import AutoTokenizer

        given = given if isinstance(given, (list, tuple)) else [given] * len(self.reward_funcs)
        tokenizers = []
        for function, tokenizer in zip(self.reward_funcs, given):
            if (
                isinstance(function, torch.nn.Module)
                and tokenizer is None
                and not hasattr(function, "scores_token_ids")
            ):
                tokenizer = AutoTokenizer.from_pretrained(function.config._name_or_path)
                if tokenizer.pad_token_id is None:
                    tokenizer.pad_token = tokenizer.eos_token
                function.config.pad_token_id = tokenizer.pad_token_id
            tokenizers.append(tokenizer)
        return tokenizers

    # ----- exact resume: the buffered generation and the step counter travel with each checkpoint -----

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        from lathe.llm.rl.resume import load_generation_state
        from lathe.train.resume import resolve_resume_path

        path = resolve_resume_path(self.args, resume_from_checkpoint)
        if path is not None:
            load_generation_state(self, path)
        return super().train(path, trial, ignore_keys_for_eval, **kwargs)

    def _save_checkpoint(self, model, trial=None):
        from lathe.llm.rl.resume import save_generation_state

        super()._save_checkpoint(model, trial)
        save_generation_state(self)

    # ----- data: the generation batch -----

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("GRPOTrainer.train() needs a train_dataset with a 'prompt' column.")
        args = self.args
        # The whole generation batch's prompts, in TRL's order; under N processes process r takes the r-th of
        # each N consecutive batches of per_device_train_batch_size x steps_per_generation rows (accelerate's
        # BatchSamplerShard), so a group of num_generations completions may span processes.
        sampler = RepeatedPromptSampler(
            len(self.train_dataset),
            args.num_generations,
            args.generation_batch_size // args.num_generations,
            args.num_iterations * args.steps_per_generation,
            args.shuffle_dataset,
            args.seed,
        )
        batches = ResumableBatchSampler(
            sampler,
            self._train_batch_size * args.steps_per_generation,
            args.dataloader_drop_last,
            num_shards=args.world_size,
            shard_index=args.process_index,
        )
        return DataLoader(
            _IndexedRows(self.train_dataset),
            batch_sampler=batches,
            collate_fn=_identity,
            num_workers=args.dataloader_num_workers,
        )

    def floating_point_ops(self, inputs) -> int:
        return 0  # as transformers counts a batch of rows without input_ids

    def training_step(self, model, inputs, num_items_in_batch=None):
        started = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._step += 1
        self._step_time += time.perf_counter() - started
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._step_time)
            self._step_time = 0.0
        return loss

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return self._generate_and_score(generation_batch, "eval")
        generate_every = self.args.steps_per_generation * self.args.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score(generation_batch, "train")
            # One global-RNG permutation of the generation batch before it is split, as TRL draws it.
            size = batch["prompt_ids"].size(0)
            order = torch.randperm(size)
            batch = {k: (v[order] if isinstance(v, torch.Tensor) and v.ndim > 0 else v) for k, v in batch.items()}
            chunk = size // self.args.steps_per_generation
            self._buffered_inputs = [
                {
                    k: (v[i * chunk : (i + 1) * chunk] if isinstance(v, torch.Tensor) and v.ndim > 0 else v)
                    for k, v in batch.items()
                }
                for i in range(self.args.steps_per_generation)
            ]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    # ----- sampling and scoring -----

    def _generate_and_score(self, rows, mode):
        from lathe.llm.rl.scoring import generate_and_score

        return generate_and_score(self, rows, mode)

    def compute_advantages(self, rewards_per_func, old_logps, ref_logps, mask, mode):
        """(the whole generation batch's advantages, is_std_zero per group) from every process's rewards: GRPO's
        group normalisation (RLOOTrainer: the leave-one-out baseline)."""
        args = self.args
        advantages, _, is_std_zero = losses.advantages_of(
            rewards_per_func,
            self.reward_weights,
            args.num_generations,
            args.scale_rewards,
            args.multi_objective_aggregation,
        )
        return advantages, is_std_zero

    # ----- the loss -----

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("GRPOTrainer.compute_loss does not return outputs.")
        args, mode = self.args, "train" if self.model.training else "eval"
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep, mask = inputs["completion_ids"].size(1), inputs["completion_mask"]
        if "tool_mask" in inputs:  # the environment's tokens (rollout_func's env_mask) add no loss
            mask = mask * inputs["tool_mask"]
        logps, entropies = generation.per_token_logps(model, input_ids, attention_mask, keep, args.temperature, True)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        entropy_mask = None
        if args.top_entropy_quantile < 1.0:
            entropy_mask = losses.high_entropy_mask(entropies, mask, args.top_entropy_quantile)
        per_token, kl, ratio, extra = losses.per_token_objective(
            logps, old, inputs.get("ref_per_token_logps"), inputs["advantages"], args, mask, entropy_mask
        )
        loss, _ = losses.aggregate(
            per_token,
            mask,
            args,
            self.current_gradient_accumulation_steps,
            inputs["num_items_in_batch"],
            mode == "train",
        )
        metrics = self._metrics[mode]
        if kl is not None:
            metrics["kl"].append(losses.masked_mean(kl.detach(), mask))
        metrics["entropy"].append(losses.masked_mean(entropies, mask))
        for key, value in losses.clip_metrics(ratio.detach(), inputs["advantages"], mask, args, extra).items():
            metrics[key].append(value)
        return loss

    def log(self, logs, start_time=None):
        mode = "train" if self.model.training else "eval"
        for key, values in self._metrics[mode].items():
            kept = [v for v in values if v == v]  # NaN from a reward function that returned only None
            value = sum(kept) / len(kept) if kept else None
            logs[f"eval_{key}" if mode == "eval" else key] = value
        self._metrics[mode].clear()
        super().log(logs, start_time)
