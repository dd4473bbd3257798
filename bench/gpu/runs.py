"""One timed training run for bench/gpu/run.py: a Qwen2-shaped model with random weights built from a config on the
device, sft full or LoRA on packed rows, through lathe.Trainer or transformers.Trainer; tokens/s over the timed
steps (after warm-up, CUDA-synchronised), MFU, peak allocated memory beside lathe's memory plan, and the checks
that the loss fell and the gradient norms were non-zero."""

from __future__ import annotations

import gc
import math
import time

import torch

# Qwen2.5's published config values (hidden, layers, heads, vocab, rope, norm eps, tied embeddings).
QWEN2 = dict(
    vocab_size=151936,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_dropout=0.0,
)
SHAPES = {
    "qwen2.5-0.5b": dict(QWEN2, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "qwen2.5-1.5b": dict(QWEN2, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    # --cpu: the same code path at a size a CPU trains in seconds.
    "tiny": dict(
        QWEN2,
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
    ),
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Dense bf16 peak of the tensor cores (no sparsity), by the name torch.cuda.get_device_name reports.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0}
MFU_FORMULA = (
    "MFU = 6 * N * tokens_per_second / peak_bf16_flops; N = all parameters of the base model (LoRA counted the same)"
)


def peak_flops(device_name: str | None) -> float | None:
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if device_name and key in device_name:
            return tflops * 1e12
    return None


def packed_rows(count: int, seq_len: int, vocab: int, seed: int) -> list[dict]:
    """Rows of exactly seq_len tokens packed from documents of 64-512 tokens that count up from a random start
    within a range of at most 1,000 tokens: a pattern a random model learns in a few steps (its loss falls)."""
    generator = torch.Generator().manual_seed(seed)
    span = min(1000, vocab // 8)
    rows = []
    for _ in range(count):
        pieces, filled = [], 0
        while filled < seq_len:
            length = min(int(torch.randint(64, 513, (1,), generator=generator)), seq_len - filled)
            start = int(torch.randint(0, span, (1,), generator=generator))
            pieces.append((start + torch.arange(length)) % span + 1)
            filled += length
        ids = torch.cat(pieces)
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


def build_model(shape: str, method: str, device: torch.device, seed: int):
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen2Config(**SHAPES[shape], attn_implementation="sdpa")
    with torch.device(device):  # weights made where they train: no host copy of a 1.5B model
        model = transformers.Qwen2ForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    if method == "lora":
        import peft

        config = peft.LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
        )
        model = peft.get_peft_model(model, config)
    return model, parameters


def memory_plan(model, spec: dict, chunk: int | None) -> int | None:
    """lathe's memory plan (lathe.llm.memory) of the run, in bytes: its expected peak."""
    from lathe.llm.memory.plan import Settings, estimate_memory

    settings = Settings(
        batch=spec["batch"],
        seq_len=spec["seq_len"],
        optim="adamw_torch",
        half=spec["half"],
        chunk=chunk,
        device=spec["device"],
    )
    plan = estimate_memory(model, settings)
    return plan.peak if plan is not None else None


def timer_callback(base, warmup: int, last: int, device: torch.device):
    """A TrainerCallback of the library under test timing updates warmup+1 .. last, synchronised at both ends."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == warmup:
            sync()
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == last:
            sync()
            self.seconds = time.perf_counter() - self.start

    return type("StepTimer", (base,), {"on_step_begin": on_step_begin, "on_step_end": on_step_end})()


def training_arguments(library, spec: dict, options: dict, output_dir: str):
    extra = {}
    if options.get("compile"):
        extra.update(torch_compile=True, torch_compile_backend="eager" if spec["device"] == "cpu" else "inductor")
    if options.get("liger"):
        extra["use_liger_kernel"] = True
    if spec["runner"] == "lathe":
        extra["chunked_cross_entropy"] = "yes" if options.get("chunked") else "no"
    return library.TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=spec["batch"],
        max_steps=spec["warmup"] + spec["steps"],
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        logging_steps=spec["log_every"],
        bf16=spec["half"],
        use_cpu=spec["device"] == "cpu",
        dataloader_pin_memory=spec["device"] != "cpu",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=spec["seed"],
        **extra,
    )


def run(spec: dict, output_dir: str) -> dict:
    """One run; the result always has 'ok' and, when it trained, the numbers and the two checks."""
    import importlib

    library = importlib.import_module("lathe" if spec["runner"] == "lathe" else "transformers")
    device = torch.device(spec["device"])
    options = spec["options"]
    result = {key: spec[key] for key in ("name", "shape", "method", "runner", "batch", "seq_len", "steps", "warmup")}
    result["options"] = options
    trainer = model = None
    try:
        model, parameters = build_model(spec["shape"], spec["method"], device, spec["seed"])
        chunk = None
        if options.get("chunked"):
            from lathe.train.loss.chunked import default_chunk_size

            chunk = default_chunk_size(SHAPES[spec["shape"]]["vocab_size"])
        result["plan_peak_bytes"] = memory_plan(model, spec, chunk)
        rows = packed_rows(
            spec["batch"] * (spec["warmup"] + spec["steps"]),
            spec["seq_len"],
            SHAPES[spec["shape"]]["vocab_size"],
            spec["seed"],
        )
        last = spec["warmup"] + spec["steps"]
        timer = timer_callback(library.TrainerCallback, spec["warmup"], last, device)
        args = training_arguments(library, spec, options, output_dir)
        trainer = library.Trainer(model=model, args=args, train_dataset=rows, callbacks=[timer])
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        trainer.train()
        result["train_seconds"] = time.perf_counter() - began
        if device.type == "cuda":
            result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        history = [entry for entry in trainer.state.log_history if "loss" in entry and "train_loss" not in entry]
        result["losses"] = [entry["loss"] for entry in history]
        result["grad_norms"] = [entry.get("grad_norm") for entry in history]
        tokens = spec["batch"] * spec["seq_len"] * spec["steps"]
        result["tokens_per_second"] = tokens / timer.seconds
        result["parameters"] = parameters
        peak = peak_flops(spec.get("device_name"))
        result["mfu"] = 6 * parameters * result["tokens_per_second"] / peak if peak else None
        result["checks"] = {
            "loss_falls": len(result["losses"]) >= 2 and result["losses"][-1] < result["losses"][0],
            "grad_norms_nonzero": bool(result["grad_norms"])
            and all(norm is not None and math.isfinite(norm) and norm > 0 for norm in result["grad_norms"]),
        }
        result["ok"] = all(result["checks"].values())
    except Exception as error:  # one failed configuration (an OOM, a missing kernel) must not lose the others
        result["ok"] = False
        result["error"] = f"{type(error).__name__}: {str(error)[:600]}"
    finally:
        del trainer, model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if options.get("compile"):
            importlib.import_module("torch._dynamo").reset()  # its graphs and guards stay out of the next run
    return result
