"""Which causal-LM loss path a Trainer runs (chunked cross-entropy, Liger-Kernel, or the model's own loss),
and how a transformers causal LM runs without its full-vocabulary logits: the final hidden states are
taken at the LM head's input and the head is asked for no position."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from lathe.train.loss.chunked import chunked_causal_lm_loss, default_chunk_size

logger = logging.getLogger(__name__)

# Causal LMs whose forward applies nothing after `lm_head` but an optional final_logit_softcapping (read
# in transformers 5.23's modeling files). Others (Granite's logits_scaling, Cohere's logit_scale, ...)
# would train a different loss: they run the standard path ("auto") or are refused ("yes").
SUPPORTED_MODEL_TYPES = (
    "gemma",
    "gemma2",
    "gemma3_text",
    "llama",
    "mistral",
    "mixtral",
    "olmo2",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "smollm3",
    "starcoder2",
)
CHUNKED_SETTINGS = ("no", "auto", "yes")


def unwrap(model):
    """The transformers model inside DDP, torch.compile, DeepSpeed and PEFT wrappers."""
    for attribute in ("module", "_orig_mod"):
        while hasattr(model, attribute) and not hasattr(model, "get_output_embeddings"):
            model = getattr(model, attribute)
    return getattr(model, "get_base_model", lambda: model)()


def unsupported_reason(model) -> str | None:
    """Why the chunked loss cannot stand in for this model's loss, or None when it can."""
    inner = unwrap(model)
    config = getattr(inner, "config", None)
    if not type(inner).__name__.endswith("ForCausalLM") or config is None:
        return f"{type(inner).__name__} is not a transformers causal LM (…ForCausalLM)"
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if head is None:
        return f"{type(inner).__name__} has no output embeddings (LM head)"
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (
            f"model type {model_type!r} is not one whose logits are the LM head's output (softcapped at most); "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if getattr(config, "output_router_logits", False):
        return (
            "output_router_logits adds the MoE auxiliary loss inside the model's forward, which needs its logits path"
        )
    return None


def final_logit_softcap(model) -> float | None:
    config = unwrap(model).config
    return getattr(config, "final_logit_softcapping", None)


class HeadIntercept:
    """One forward pre-hook on the LM head and the model's loss_function, installed once. While a request
    is pending, the head's input (the final hidden states, inside the model's forward, so FSDP2 has the
    head's weight gathered) goes to the request, and the head then computes logits for no position; the
    model's loss_function returns the request's loss, so the loss is the forward's output as usual (DDP and
    FSDP2 hook their backward passes onto it). With no request pending both behave as before (generation,
    a full-logits evaluation, the chunks a checkpointed loss recomputes)."""

    def __init__(self, model):
        self.request = self.result = None
        self.original_loss = model.loss_function
        model.get_output_embeddings().register_forward_pre_hook(self._hook)
        model.loss_function = self._loss_function

    @classmethod
    def on(cls, model) -> HeadIntercept:
        """The model's intercept, installed on first use (a second Trainer on the same model shares it)."""
        if not isinstance(getattr(model, "_lathe_head_intercept", None), cls):
            model._lathe_head_intercept = cls(model)
        return model._lathe_head_intercept

    def _hook(self, module, args):
        request, self.request = self.request, None
        if request is None:
            return None
        hidden = args[0]
        self.result = request(hidden, module)
        return (hidden[..., :0, :],)

    def _loss_function(self, *args, **kwargs):
        if self.result is None:
            return self.original_loss(*args, **kwargs)
        result, self.result = self.result, None
        return result

    def run(self, model, inputs: Mapping, request):
        """(request's result, model outputs) of model(**inputs): with labels among the inputs the result
        is the outputs' loss; without, it is returned as computed."""
        self.request, self.result = request, None
        try:
            outputs = model(**inputs)
            if self.request is not None:
                raise RuntimeError(
                    f"{type(unwrap(model)).__name__}'s forward never called its LM head, so the chunked loss got "
                    "no hidden states; set chunked_cross_entropy='no'."
                )
            result = outputs["loss"] if "labels" in inputs else self.result
        finally:
            self.request = self.result = None
        return result, outputs


class ChunkedLMLoss:
    """The chunked loss of a causal LM as the Trainer's compute_loss needs it."""

    def __init__(self, model, chunk_size: int | None, label_smoothing: float):
        inner = unwrap(model)
        self.intercept = HeadIntercept.on(inner)
        self.softcap = final_logit_softcap(model)
        self.chunk_size = chunk_size or default_chunk_size(inner.config.vocab_size)
        self.label_smoothing = label_smoothing

    def compute_loss(self, model, inputs: Mapping, num_items_in_batch):
        """(loss, outputs); outputs carry the loss and logits for no position."""
        labels, shift_labels = inputs["labels"], inputs.get("shift_labels")

        def request(hidden, head):
            return chunked_causal_lm_loss(
                hidden,
                head,
                labels,
                num_items_in_batch=num_items_in_batch,
                label_smoothing=self.label_smoothing,
                softcap=self.softcap,
                chunk_size=self.chunk_size,
                shift_labels=shift_labels,
            )

        return self.intercept.run(model, inputs, request)

    def describe(self) -> str:
        return (
            f"chunked cross-entropy (LM head and loss over {self.chunk_size}-token chunks; "
            "full-vocabulary logits are never built)"
        )


def choose_loss_path(model, args, compute_loss_func) -> ChunkedLMLoss | None:
    """The chunked loss when args ask for it and the model allows it (None: the model's own loss, or
    Liger's after patching the model); logs which path runs and why."""
    setting = getattr(args, "chunked_cross_entropy", "no")
    if getattr(args, "use_liger_kernel", False):
        reason = _apply_liger(model, args)
        if reason is None:
            logger.info("Causal-LM loss: Liger-Kernel (use_liger_kernel).")
            return None
        logger.info("use_liger_kernel: %s; using lathe's chunked cross-entropy instead.", reason)
        setting = "yes" if setting == "yes" else "auto"
    if setting == "no":
        return None
    reason = unsupported_reason(model)
    if reason is None and compute_loss_func is not None:
        reason = "compute_loss_func computes the loss from the model's logits"
    if reason is None and getattr(args, "torch_compile", False):
        reason = "torch_compile compiles the model's own forward (the LM head hook would break the graph)"
    if reason is not None:
        if setting == "yes":
            raise ValueError(f"chunked_cross_entropy='yes' cannot be used: {reason}. Set it to 'auto' or 'no'.")
        logger.info("Causal-LM loss: the model's own (full logits), because %s.", reason)
        return None
    path = ChunkedLMLoss(model, args.chunked_cross_entropy_size, args.label_smoothing_factor)
    logger.info("Causal-LM loss: %s.", path.describe())
    return path


def active_path(trainer) -> ChunkedLMLoss | None:
    """The Trainer's chunked loss, or None. A compute_loss_func set after __init__ (as the LLM loss variants
    do) reads the model's logits: the chunked loss then steps aside, once, and says so. Code that computes
    its own loss from the head (the preference log-probs) asks here too."""
    if trainer._lm_loss is not None and trainer.compute_loss_func is not None:
        logger.info("Causal-LM loss: the model's own (full logits), because compute_loss_func reads the logits.")
        trainer._lm_loss = None
    return trainer._lm_loss


def trainer_path(trainer, inputs=None) -> ChunkedLMLoss | None:
    """The Trainer's chunked loss for these inputs (labels given, logits not wanted), else None."""
    path = active_path(trainer)
    if path is None or trainer._logits_wanted or not isinstance(inputs, Mapping):
        return None
    return path if inputs.get("labels") is not None else None


def _apply_liger(model, args) -> str | None:
    """Patch the model with Liger-Kernel as transformers does; the reason when it cannot run here."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError:
        return "liger-kernel is not installed (pip install liger-kernel; it needs Triton and a GPU)"
    import torch

    if not torch.cuda.is_available() or args.device.type != "cuda":
        return "Liger-Kernel's Triton kernels need a CUDA device"
    _apply_liger_kernel_to_instance(model=unwrap(model), **(args.liger_kernel_config or {}))
    return None
