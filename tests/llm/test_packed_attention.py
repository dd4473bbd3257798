"""Per-example sdpa for packed rows (lathe/llm/model/packed_attention.py) computes what the
block-diagonal mask computes: same logits, loss and gradients; padded batches and generation are
untouched; models it cannot serve keep the mask."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lathe.llm.data.collator import SFTDataCollator  # noqa: E402
from lathe.llm.model.packed_attention import NAME, unsupported_reason, use_packed_attention  # noqa: E402


class Tokenizer:
    pad_token_id = 0
    padding_side = "right"


def tiny_llama(**overrides):
    config = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )
    config.update(overrides)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))


def packed_rows(rows=3, examples=4, seed=1):
    generator = torch.Generator().manual_seed(seed)
    features = []
    for _ in range(rows):
        input_ids, position_ids, labels = [], [], []
        for length in torch.randint(2, 30, (examples,), generator=generator).tolist():
            tokens = torch.randint(1, 97, (length,), generator=generator).tolist()
            input_ids += tokens
            position_ids += range(length)
            labels += [-100] + tokens[1:]
        features.append(
            {
                "input_ids": input_ids,
                "attention_mask": [1] * len(input_ids),
                "position_ids": position_ids,
                "labels": labels,
            }
        )
    return features


def run(model, batch):
    model.zero_grad()
    output = model(**batch)
    output.loss.backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters()}


def test_per_example_attention_equals_the_block_mask_in_logits_loss_and_gradients():
    features = packed_rows()
    model = tiny_llama()
    masked = SFTDataCollator(Tokenizer(), model=model)(features)
    assert masked["attention_mask"].dim() == 4  # the dense block-diagonal mask
    masked_output, masked_grads = run(model, masked)

    assert use_packed_attention(model) and model.config._attn_implementation == NAME
    flat = SFTDataCollator(Tokenizer(), model=model)(features)
    assert "attention_mask" not in flat and flat["input_ids"].shape[0] == 1
    lengths = [len(feature["input_ids"]) for feature in features]
    examples = sum(feature["position_ids"].count(0) for feature in features)
    assert len(flat["cu_seq_lens_q"]) == examples + 1 and flat["cu_seq_lens_q"][-1].item() == sum(lengths)
    flat_output, flat_grads = run(model, flat)

    assert flat_output.loss.item() == pytest.approx(masked_output.loss.item(), abs=1e-6)
    rows = torch.cat([masked_output.logits[index, :length] for index, length in enumerate(lengths)])
    torch.testing.assert_close(flat_output.logits[0, : sum(lengths)], rows, atol=2e-6, rtol=1e-5)
    for name, grad in masked_grads.items():
        torch.testing.assert_close(flat_grads[name], grad, atol=2e-6, rtol=1e-4, msg=name)


def test_each_example_sees_only_itself():
    """An example's logits are those of the example run alone (no leak from its neighbours)."""
    features = packed_rows(rows=1, examples=3, seed=5)
    model = tiny_llama().eval()
    use_packed_attention(model)
    flat = SFTDataCollator(Tokenizer(), model=model)(features)
    with torch.no_grad():
        logits = model(**{k: v for k, v in flat.items() if k != "labels"}).logits[0]
        bounds = flat["cu_seq_lens_q"].tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            alone = model(input_ids=flat["input_ids"][:, start:end]).logits[0]
            torch.testing.assert_close(logits[start:end], alone, atol=2e-6, rtol=1e-5)


def test_padded_batches_and_generation_are_unchanged():
    model, reference = tiny_llama().eval(), tiny_llama().eval()
    use_packed_attention(model)
    input_ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=input_ids, attention_mask=attention_mask).logits,
            reference(input_ids=input_ids, attention_mask=attention_mask).logits,
        )
    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(
        generated,
        reference.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, do_sample=False),
    )


def test_models_it_cannot_serve_keep_the_block_mask():
    assert "eager" in unsupported_reason(tiny_llama(attn_implementation="eager"))
    mistral = transformers.MistralForCausalLM(
        transformers.MistralConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=16,
            attn_implementation="sdpa",
        )
    )
    assert not use_packed_attention(mistral)
    assert mistral.config._attn_implementation == "sdpa"
    assert SFTDataCollator(Tokenizer(), model=mistral)(packed_rows(rows=1))["attention_mask"].dim() == 4
