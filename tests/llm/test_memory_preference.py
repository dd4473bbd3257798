"""The memory plan of the preference stages (lathe/llm/memory/preference.py): the reference copy against
the model lathe actually loads, the reward model's gradients against what backward fills, the value
head's activations against what autograd saves, the log-prob paths and the no-grad forward against
measured peaks, the printed plan of dpo / kto / rm runs, and auto_find_batch_size's start."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lathe.llm.memory.plan import Settings, activation_bytes, estimate_memory, model_shape
from lathe.llm.memory.preference import log_prob_bytes, no_grad_forward_bytes
from tests.llm.golden.make_llamafactory_preference import BASE, DATA_DIR, build_model
from tests.llm.memory_probe import rss
from tests.llm.test_memory_plan import saved_bytes

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
VOCAB = 2000
LINUX_RSS = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")


def _llama(tie: bool = False):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).train()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory_preference") / "model"
    build_model(folder, seed=0)
    return str(folder)


def _config(model_dir, tmp_path, **values):
    from lathe.llm.config.train import parse_train_config

    keys = {
        **BASE,
        "dataset_dir": str(DATA_DIR),
        "model_name_or_path": model_dir,
        "stage": "dpo",
        "dataset": "pairs_alpaca,pairs_sharegpt",
        "output_dir": str(tmp_path / "out"),
        "max_steps": 1,
        **values,
    }
    return parse_train_config(keys)


@pytest.mark.parametrize(
    "values",
    [{"finetuning_type": "full"}, {"finetuning_type": "freeze"}, {"finetuning_type": "lora", "ref_model": "SELF"}],
)
def test_the_reference_term_is_the_frozen_copy_lathe_loads(model_dir, tmp_path, values):
    from lathe.llm.model.loader import load_model, load_tokenizer
    from lathe.llm.preference.reference import create_reference_model

    values = {key: model_dir if value == "SELF" else value for key, value in values.items()}
    config = _config(model_dir, tmp_path, **values)
    tokenizer = load_tokenizer(config.model)
    policy = load_model(tokenizer, config.model, config.finetuning, is_trainable=True)
    reference = create_reference_model(tokenizer, config.model, config.finetuning)
    held = sum(param.numel() * param.element_size() for param in reference.parameters())
    plan = estimate_memory(policy, Settings(batch=2, seq_len=64, stage="dpo", reference_copy=True))
    assert plan.reference == held
    # In half precision the copy is loaded in the compute dtype: half the bytes of the fp32 policy.
    half = estimate_memory(policy, Settings(batch=2, seq_len=64, stage="dpo", reference_copy=True, half=True))
    assert half.reference == held // 2
    assert estimate_memory(policy, Settings(batch=2, seq_len=64, stage="dpo")).reference == 0


@pytest.mark.parametrize("tie", [False, True])
def test_the_reward_models_gradients_are_what_backward_fills(tie):
    from lathe.llm.model.value_head import ValueHeadModel
    from lathe.llm.preference.reward import RewardTrainer

    model = ValueHeadModel(_llama(tie))
    plan = estimate_memory(model, Settings(batch=2, seq_len=16, stage="rm"))
    ids = torch.randint(0, VOCAB, (4, 16))
    loss = RewardTrainer.compute_loss(None, model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    loss.backward()
    filled = sum(param.grad.numel() * 4 for param in model.parameters() if param.grad is not None)
    trainable = sum(param.numel() * 4 for param in model.parameters() if param.requires_grad)
    assert plan.gradients == filled and plan.optimizer == 2 * filled
    # The untied LM head (VOCAB x 64) gets no gradient: its logits feed no loss. Tied, it is the embeddings.
    assert trainable - filled == (0 if tie else VOCAB * 64 * 4)


def test_lora_is_advised_for_what_the_reference_copy_costs_but_never_to_a_lora_run():
    from lathe.llm.memory.fit import advice

    peft = pytest.importorskip("peft")
    model = _llama()
    settings = Settings(batch=2, seq_len=64, stage="dpo", reference_copy=True)
    full = estimate_memory(model, settings, available=0)
    assert any(
        option.startswith("finetuning_type: lora") and "reference copy" in option
        for option in advice(full, model, settings)
    )
    lora = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    with_ref_model = estimate_memory(lora, settings, available=0)  # ref_model: a copy beside the LoRA policy
    assert with_ref_model.reference > 0
    assert not any(option.startswith("finetuning_type: lora") for option in advice(with_ref_model, lora, settings))


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_reward_models_activations_equal_what_autograd_saves(method):
    from lathe.llm.model.value_head import ValueHeadModel

    base = _llama()
    if method == "lora":
        peft = pytest.importorskip("peft")
        base = peft.get_peft_model(base, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    model = ValueHeadModel(base)
    ids = torch.randint(0, VOCAB, (4, 32))
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    saved, _ = saved_bytes(model, lambda: model(input_ids=ids, attention_mask=mask))
    plan = estimate_memory(model, Settings(batch=2, seq_len=32, stage="rm", masked=True))
    assert plan.activations == pytest.approx(saved, rel=0.07), (plan.activations, saved)
    # dpo and rm carry chosen and rejected rows in one forward: 2 x batch rows.
    plain = activation_bytes(model, model_shape(model), 4, 32, 4, False, True)[0]
    dpo = estimate_memory(model, Settings(batch=2, seq_len=32, stage="dpo", masked=True))
    assert dpo.activations == plain and dpo.logits == log_prob_bytes(model_shape(model), 4, 32, False, None, False)


def test_without_a_reference_no_forward_runs_beside_the_kept_activations():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_llama(), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    settings = Settings(batch=2, seq_len=256, stage="dpo", masked=True, chunk=64)
    sigmoid = estimate_memory(model, settings)
    orpo = estimate_memory(model, dataclasses.replace(settings, reference_forward=False))
    shape = model_shape(model)
    kept = activation_bytes(model, shape, 4, 256, 4, False, True)[0]
    # LoRA: the reference's forward (the policy with its adapter off) sets dpo-sigmoid's peak ...
    no_grad = no_grad_forward_bytes(shape, 4, 256, 4, True, 64)
    assert sigmoid.peak == sigmoid.weights + sigmoid.optimizer + kept + no_grad
    # ... and orpo, without one, peaks in the backward of its log-probs.
    assert orpo.peak == orpo.weights + orpo.optimizer + kept + orpo.logits < sigmoid.peak


ROWS, SEQ_LEN, HIDDEN = 4, 256, 64
CHUNKS = {"standard": None, "one chunk": 4096, "256-token chunks": 256}


def _peak_above_start(run) -> int:
    """The peak RSS during run() above the RSS before it (run() once first to warm it up)."""
    run()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS
    start = rss("VmRSS")
    run()
    return rss("VmHWM") - start


def measure_term_peaks() -> dict:
    """Run by term_peaks in a fresh process: the log-prob paths' forward and backward, and a forward
    without gradients."""
    from lathe.llm.preference.losses import sequence_log_probs
    from lathe.train.loss.chunked import chunked_token_log_probs

    torch.set_num_threads(1)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(ROWS, SEQ_LEN, HIDDEN, requires_grad=True)
    labels = torch.randint(0, VOCAB, (ROWS, SEQ_LEN))
    peaks = {}
    for name, chunk in CHUNKS.items():

        def step(chunk=chunk):
            if chunk is None:  # the model's logits, then the log-probs of the answer tokens
                logps, _ = sequence_log_probs(head(hidden).float(), labels)
            else:
                flat = hidden.reshape(-1, HIDDEN)
                logps = chunked_token_log_probs(flat, head, labels.reshape(-1), chunk_size=chunk)
            logps.sum().backward()
            head.weight.grad = hidden.grad = None

        peaks[name] = _peak_above_start(step)
    model = _llama()
    mask = torch.ones_like(labels)
    mask[0, -20:] = 0

    def forward():
        with torch.no_grad():
            model.model(input_ids=labels, attention_mask=mask)

    peaks["no-grad forward"] = _peak_above_start(forward)
    return peaks


@pytest.fixture(scope="module")
def term_peaks():
    """measure_term_peaks in a fresh process with glibc's mmap threshold fixed at 64 KiB, so that RSS
    follows the allocations (a forked pytest process would reuse heap pages earlier tests freed)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    code = "import json; from tests.llm.test_memory_preference import measure_term_peaks as m; print(json.dumps(m()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@LINUX_RSS
@pytest.mark.parametrize("path", list(CHUNKS))
def test_the_log_prob_paths_peak_as_planned(term_peaks, path):
    planned = log_prob_bytes(model_shape(_llama()), ROWS, SEQ_LEN, False, CHUNKS[path], True)
    assert 0.85 <= planned / term_peaks[path] <= 1.2, (planned, term_peaks[path])


@LINUX_RSS
def test_a_forward_without_gradients_peaks_as_planned(term_peaks):
    # A 1-token chunk: the layers' transients, not the logits, set this pass's peak.
    planned = no_grad_forward_bytes(model_shape(_llama()), ROWS, SEQ_LEN, 4, True, 1)
    assert 0.85 <= planned / term_peaks["no-grad forward"] <= 1.2, (planned, term_peaks["no-grad forward"])


def _longest_pair_row(config) -> int:
    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tokenizer = load_tokenizer(config.model)
    template = get_template_and_fix_tokenizer(tokenizer, config.data)
    rows = get_dataset(template, config.model, config.data, config.training, stage="dpo", tokenizer=tokenizer)
    train = rows["train_dataset"]
    return max(len(ids) for side in ("chosen", "rejected") for ids in train[f"{side}_input_ids"])


def test_the_plan_of_dpo_kto_and_rm_runs_is_printed(model_dir, tmp_path, capsys, monkeypatch):
    from lathe.llm.workflows.stages import run_train

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the tokenization cache
    config = _config(model_dir, tmp_path, finetuning_type="full")
    padded = -(-_longest_pair_row(config) // 8) * 8
    capsys.readouterr()
    run_train(config, dry_run=True)
    out = capsys.readouterr().out
    assert f"MiB peak per device, expected for 2 pairs (4 rows) x {padded} tokens, chunked log-probs: " in out
    assert "    weights 0.1 MiB, reference model 0.1 MiB, gradients " in out and "fits: " in out
    assert "not estimated" not in out

    run_train(_config(model_dir, tmp_path, finetuning_type="lora"), dry_run=True)
    out = capsys.readouterr().out
    assert "expected for 2 pairs (4 rows) x " in out and "reference model" not in out  # the adapter-less policy

    run_train(_config(model_dir, tmp_path, finetuning_type="full", pref_loss="orpo"), dry_run=True)
    assert "reference model" not in capsys.readouterr().out  # orpo compares chosen with rejected only

    run_train(_config(model_dir, tmp_path, stage="kto", dataset="feedback", finetuning_type="full"), dry_run=True)
    out = capsys.readouterr().out
    assert "MiB peak per device, expected for 2 x " in out and "reference model" in out

    run_train(_config(model_dir, tmp_path, stage="rm", finetuning_type="full"), dry_run=True)
    out = capsys.readouterr().out
    assert "expected for 2 pairs (4 rows) x " in out and "value head: the LM's logits for the last position only" in out

    monkeypatch.setattr("lathe.llm.memory.fit.available_memory", lambda device: 1024)
    run_train(_config(model_dir, tmp_path, finetuning_type="full"), dry_run=True)
    out = capsys.readouterr().out
    assert "DOES NOT FIT: 0.0 MiB available RAM; largest batch that fits: 0" in out
    assert "    try: finetuning_type: lora" in out and "    try: cutoff_len: " in out


def test_auto_find_batch_size_starts_from_the_plan_in_dpo_and_rm(model_dir, tmp_path, monkeypatch):
    from lathe.llm.workflows.stages import run_train
    from lathe.train.callbacks.events import TrainerCallback

    batch_sizes = []

    class BatchSize(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            batch_sizes.append(state.train_batch_size)

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr("lathe.llm.memory.plan.largest_fitting_batch", lambda *args, **kwargs: 1)
    for stage in ("dpo", "rm"):
        config = _config(model_dir, tmp_path / stage, stage=stage, auto_find_batch_size=True)
        run_train(config, callbacks=[BatchSize()])
    assert batch_sizes == [1, 1]  # 2 asked for
