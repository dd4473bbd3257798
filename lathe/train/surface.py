"""The rest of transformers' public Trainer API, each method attached from the module that does the work:
questions scripts ask (queries.py), the forward's context managers (runtime.py), hyperparameter search
(hp_search.py), the model card and the Hub (hub.py); and the flags transformers' Trainer carries, with
lathe's answers (no accelerate, no tensor/context/sequence parallelism, no XLA)."""

from __future__ import annotations

from lathe.train import modeling, queries, resume, runtime, saving
from lathe.train.data import loaders
from lathe.train.evaluation import results
from lathe.train.features import hp_search, hub
from lathe.train.optim.optimizers import get_optimizer_cls_and_kwargs


class TrainerSurface:
    """Mixed into Trainer (trainer.py), which holds the override points and the loop's wiring."""

    # Whether compute_loss's loss is already divided for gradient accumulation (transformers 5.23): None decides
    # from model_accepts_loss_kwargs and compute_loss_func; a subclass computing its own loss may set it.
    # Trainer.training_step reads it.
    loss_is_scaled_for_ga: bool | None = None

    get_num_trainable_parameters = queries.get_num_trainable_parameters
    get_learning_rates = queries.get_learning_rates
    get_optimizer_group = queries.get_optimizer_group
    get_optimizer_cls_and_kwargs = staticmethod(get_optimizer_cls_and_kwargs)
    get_total_train_batch_size = queries.get_total_train_batch_size
    get_tp_size = queries.get_tp_size
    get_cp_size = queries.get_cp_size
    get_sp_size = queries.get_sp_size
    set_initial_training_values = queries.set_initial_training_values
    get_batch_samples = queries.get_batch_samples
    compute_loss_context_manager = runtime.compute_loss_context_manager
    autocast_smart_context_manager = runtime.autocast_smart_context_manager
    hyperparameter_search = hp_search.hyperparameter_search
    create_model_card = hub.create_model_card
    push_to_hub = hub.push_to_hub
    init_hf_repo = hub.init_hf_repo
    num_examples = loaders.num_examples
    num_tokens = queries.num_tokens
    floating_point_ops = modeling.floating_point_ops
    save_state = results.save_state
    save_metrics = results.save_metrics
    metrics_format = staticmethod(results.metrics_format)
    log_metrics = results.log_metrics

    # transformers' private hooks that libraries built on the Trainer override or call (issue 38)
    _signature_columns = None
    _set_signature_columns_if_needed = loaders.set_signature_columns_if_needed
    _remove_unused_columns = loaders.remove_unused_columns
    _get_collator_with_removed_columns = loaders.collator_with_removed_columns
    _save = saving.save_files
    _load_best_model = resume.load_best_model
    _load_from_checkpoint = resume.load_from_checkpoint

    def store_flos(self) -> None:
        """Move the FLOPs counted since the last call into state.total_flos (transformers' name)."""
        self.state.total_flos += self.current_flos
        self.current_flos = 0.0

    # transformers' flags. lathe runs DeepSpeed and FSDP2 itself (not through accelerate's plugins), so the
    # two "enabled" flags read the arguments; XLA's FSDP and model parallelism over devices do not exist here.
    is_fsdp_xla_enabled = is_fsdp_xla_v1_enabled = is_fsdp_xla_v2_enabled = False
    is_distributed_loading_by_transformers = False

    @property
    def is_deepspeed_enabled(self) -> bool:
        return bool(self.args.deepspeed)

    @property
    def is_fsdp_enabled(self) -> bool:
        return bool(self.args.fsdp)

    @property
    def is_model_parallel(self) -> bool:
        """A model its loader spread over several devices (device_map): the Trainer does not move it."""
        return len(set((getattr(self.model, "hf_device_map", None) or {}).values())) > 1

    @property
    def place_model_on_device(self) -> bool:
        return getattr(self.model, "hf_device_map", None) is None and not getattr(
            self.model, "is_loaded_in_4bit", False
        )

    @property
    def deepspeed(self):
        """DeepSpeed's engine while it trains the model (transformers' backward-compatible name), else None."""
        return self._zero_engine

    @property
    def accelerator(self):
        """accelerate's Accelerator surface that libraries built on transformers' Trainer call (TRL,
        sentence-transformers, setfit), answered by lathe's own runtime: lathe/train/accelerator.py."""
        accelerator = self.__dict__.get("_accelerator")
        if accelerator is None:
            from lathe.train.accelerator import LatheAccelerator

            accelerator = self.__dict__["_accelerator"] = LatheAccelerator(self)
        return accelerator

    def gather_function(self, tensors, use_gather_object: bool | None = None):
        """accelerate's gather_for_metrics as transformers' Trainer exposes it: `tensors` (a tensor, or lists /
        tuples / dicts of them) from every process, concatenated on the first dimension in rank order; unchanged
        in one process. Unlike accelerate it keeps the samples even sharding repeats at the end of an evaluation
        (lathe's own evaluation loop cuts them by the dataset's size); anything else comes back as the list of
        every rank's value (use_gather_object)."""
        from lathe.train.parallel import distributed

        if not distributed.is_distributed():
            return tensors
        gathered = distributed.gather_objects(_to_cpu(tensors))
        if use_gather_object or self.args.eval_use_gather_object:
            return gathered
        return _concatenated(gathered)

    def create_accelerator_and_postprocess(self) -> None:
        """transformers builds its accelerate.Accelerator here; lathe has none, so there is nothing to create."""

    def end(self) -> None:
        """The end of a script: lathe's reporters close at on_train_end; destroy the process group if one runs."""
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _to_cpu(value):
    import torch

    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _concatenated(per_rank: list):
    import torch

    first = per_rank[0]
    if torch.is_tensor(first):
        return torch.cat([t.reshape(1) if t.dim() == 0 else t for t in per_rank])
    if isinstance(first, (list, tuple)):
        return type(first)(_concatenated([r[i] for r in per_rank]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concatenated([r[k] for r in per_rank]) for k in first}
    return per_rank
