"""LLaMA Pro: `lathe expand` adds identity-initialised copies of blocks in LLaMA-Factory's layout
(scripts/llama_pro.py: a copy after the last block of each group, o_proj and down_proj zeroed), and
use_llama_pro trains only the copies. The step losses against LLaMA-Factory are in test_methods.py."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lathe.llm.config.train import parse_train_config  # noqa: E402
from lathe.llm.model.llama_pro import expand_blocks, expanded_layer_ids  # noqa: E402
from lathe.llm.model.loader import load_model, load_tokenizer  # noqa: E402


def test_expanded_layer_ids_are_the_last_of_each_group():
    assert list(expanded_layer_ids(6, 2)) == [2, 5]  # 4 layers + 2 copies: [0, 1, copy of 1, 2, 3, copy of 3]
    assert list(expanded_layer_ids(40, 8)) == [4, 9, 14, 19, 24, 29, 34, 39]
    with pytest.raises(ValueError, match="6 layers must be divisible by freeze_trainable_layers .* got 4"):
        expanded_layer_ids(6, 4)


@pytest.fixture(scope="module")
def expanded(tiny_model_dir, tmp_path_factory):
    """The 3-layer tiny Llama expanded by 3 (a copy after every block), through the command line."""
    from lathe.cli import main

    folder, printed = tmp_path_factory.mktemp("expanded") / "model", io.StringIO()
    with contextlib.redirect_stdout(printed):  # the command line's own main, in this process
        assert main(["expand", tiny_model_dir, str(folder), "--num_expand", "3"]) == 0
    assert "from 3 to 6 layers" in printed.getvalue() and "use_llama_pro: true" in printed.getvalue()
    return str(folder)


def test_copies_follow_llamafactory_layout_and_start_as_the_identity(tiny_model_dir, expanded):
    source = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(expanded)
    assert model.config.num_hidden_layers == 6
    for new_index, (old_index, is_copy) in enumerate(
        [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True)]
    ):
        new, old = model.model.layers[new_index].state_dict(), source.model.layers[old_index].state_dict()
        for name, value in old.items():
            zeroed = is_copy and ("o_proj" in name or "down_proj" in name)
            assert torch.equal(new[name], torch.zeros_like(value) if zeroed else value), (new_index, name)
    ids = torch.tensor([[1, 9, 40, 77, 3, 2]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, source(input_ids=ids).logits)
        # generation through the KV cache: each copy has its own cache slot (layer_idx)
        assert torch.equal(
            model.generate(ids, max_new_tokens=5, do_sample=False),
            source.generate(ids, max_new_tokens=5, do_sample=False),
        )


@pytest.mark.slow
def test_use_llama_pro_trains_only_the_copies(expanded):
    def trainable(**values):
        config = parse_train_config(
            {
                "model_name_or_path": expanded,
                "dataset": "d",
                "output_dir": "unused",
                "use_llama_pro": True,
                "freeze_trainable_layers": 3,
                **values,
            }
        )
        model = load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=True)
        return {name for name, param in model.named_parameters() if param.requires_grad}

    names = trainable(finetuning_type="freeze")
    assert {name.split(".")[2] for name in names} == {"1", "3", "5"} and all(".layers." in name for name in names)
    adapted = trainable(finetuning_type="lora", lora_target="q_proj,down_proj")
    layers = {(name.split(".")[4], name.split(".lora_")[0].split(".")[-1]) for name in adapted}
    assert layers == {(index, module) for index in ("1", "3", "5") for module in ("q_proj", "down_proj")}
    with pytest.raises(
        ValueError, match="use_llama_pro trains the expanded blocks with finetuning_type freeze or lora"
    ):
        parse_train_config(
            {"model_name_or_path": expanded, "dataset": "d", "use_llama_pro": True, "finetuning_type": "full"}
        )


def test_expand_refuses_what_it_cannot_do(tiny_model_dir, expanded, tmp_path):
    with pytest.raises(ValueError, match="3 layers must be divisible by it, got 2"):
        expand_blocks(tiny_model_dir, str(tmp_path / "x"), 2)
    with pytest.raises(ValueError, match="is not empty"):
        expand_blocks(tiny_model_dir, expanded, 3)
