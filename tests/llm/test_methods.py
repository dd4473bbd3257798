"""The fine-tuning methods of `lathe train` against LLaMA-Factory 0.9.5: each case's step losses equal
the ones LLaMA-Factory computed on the same model, data and config (tests/llm/golden/llamafactory_methods.json,
made by make_llamafactory_methods.py), plus what each method leaves behind: quantized layers of the
asked kind, peft adapter files, LoRA+'s parameter groups, PiSSA's converted adapter, OFT's blocks."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from lathe.llm.commands import run_train  # noqa: E402
from lathe.llm.config.train import parse_train_config  # noqa: E402
from tests.goldens import assert_close_to_golden  # noqa: E402
from tests.llm.golden.make_llamafactory_methods import CASES, GOLDEN, build_assets, case_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
GOLDEN_CASES = json.loads(GOLDEN.read_text())["cases"]
# The golden was written on one CPU with one thread; another CPU's kernels or thread count round the last bits
# differently: losses are held to the golden tolerance (tests/goldens.py, docs/GOLDENS.md).


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets(tmp_path_factory.mktemp("methods"))


def train(config: dict, monkeypatch) -> tuple[list[float], object]:
    """Run `lathe train` in this process; (the loss of every training micro-batch, the trained model)."""
    from lathe.train.trainer import Trainer

    losses, seen = [], {}
    compute_loss = Trainer.compute_loss

    def recording(self, model, inputs, return_outputs=False, **kwargs):
        result = compute_loss(self, model, inputs, return_outputs=return_outputs, **kwargs)
        if model.training:
            losses.append((result[0] if return_outputs else result).item())
            seen["model"] = model
        return result

    monkeypatch.setattr(Trainer, "compute_loss", recording)
    run_train(parse_train_config(config))
    return losses, seen.get("model")


def test_every_case_has_a_golden():
    assert set(GOLDEN_CASES) == set(CASES)
    assert all(len(case["losses"]) == 4 for case in GOLDEN_CASES.values())


# lathe trains with chunked cross-entropy by default (lathe.train.loss.chunked): its gradients equal the
# full-logits path's to ~1e-6 relative, not bit for bit. LoRA+ at 16x on lora_B (lr 0.16) with Adam is the one
# case that magnifies that: Adam's first update of an element is lr * g / (|g| + 1e-8), whose slope at g ~ 0 is
# lr / 1e-8 = 1.6e7, so lora_B elements whose gradient is ~1e-9 (absolute differences of ~1e-9 between the two
# summation orders) move by up to ~1e-2 differently, and the next losses differ by up to 2e-3. Another CPU's
# last-bit differences are magnified the same way: with the model's own loss (chunked_cross_entropy: no, bit for
# bit on the CPU that recorded the golden) this repository's AVX2 CPU differs by 1.9e-3 at step 4. Its step-1
# loss, before any update, is held to the golden tolerance.
ILL_CONDITIONED = {"loraplus": dict(rel=1e-3, abs=1e-3)}
# The chunked loss (~1e-6 from the full logits' sums) on another CPU (up to 7.4e-7 more, docs/GOLDENS.md): 5e-6.
CHUNKED = dict(rel=5e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_step_losses_equal_llamafactory(name, assets, tmp_path, monkeypatch):
    losses, _ = train(case_config(name, assets, str(tmp_path / "out")), monkeypatch)
    expected = GOLDEN_CASES[name]["losses"]
    assert_close_to_golden(losses[0], expected[0], f"{name} step-1 loss", **CHUNKED)
    assert_close_to_golden(losses, expected, f"{name} losses", **ILL_CONDITIONED.get(name, CHUNKED))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ILL_CONDITIONED))
def test_step_losses_with_the_models_own_loss_equal_llamafactory(name, assets, tmp_path, monkeypatch):
    config = {**case_config(name, assets, str(tmp_path / "out")), "chunked_cross_entropy": "no"}
    losses, _ = train(config, monkeypatch)
    expected = GOLDEN_CASES[name]["losses"]
    assert_close_to_golden(losses[0], expected[0], f"{name} full-logits step-1 loss")
    assert_close_to_golden(losses, expected, f"{name} full-logits losses", **ILL_CONDITIONED[name])


def _linear_types(model) -> set[str]:
    return {type(module).__name__ for name, module in model.named_modules() if name.endswith("q_proj.base_layer")}


@pytest.mark.parametrize(("bits", "kind", "double"), [(4, "nf4", True), (4, "fp4", False), (8, None, None)])
def test_qlora_base_is_quantized_as_asked_and_saves_a_peft_adapter(bits, kind, double, assets, tmp_path, monkeypatch):
    out = tmp_path / "out"
    config = case_config("qlora_nf4", assets, str(out))
    config.update(
        quantization_bit=bits,
        max_steps=1,
        **({"quantization_type": kind, "double_quantization": double} if kind else {}),
    )
    _, model = train(config, monkeypatch)
    layer = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    if bits == 4:
        assert type(layer).__name__ == "Linear4bit" and layer.weight.quant_type == kind
        assert (layer.weight.quant_state.nested is True) == double
        assert layer.weight.quant_state.dtype == torch.float32  # the compute dtype: float32 on the CPU
    else:
        assert type(layer).__name__ == "Linear8bitLt" and layer.weight.dtype == torch.int8
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert {path.name for path in out.iterdir()} >= {"adapter_model.safetensors", "adapter_config.json"}
    assert not (out / "model.safetensors").exists()  # the quantized base is not saved, only the adapter
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == assets["model"]


def test_loraplus_parameter_groups(assets):
    from lathe.llm.methods.loraplus import loraplus_parameter_groups
    from lathe.llm.model.loader import load_model, load_tokenizer

    config = parse_train_config(case_config("dora", assets, "unused"))
    model = load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=True)
    groups = loraplus_parameter_groups(model, learning_rate=1e-3, weight_decay=0.1, lr_ratio=16.0, embedding_lr=1e-6)
    names = {id(param): name for name, param in model.named_parameters()}
    members = [{names[id(param)] for param in group["params"]} for group in groups]
    assert [(group["lr"], group["weight_decay"]) for group in groups] == [
        (1e-3, 0.1),
        (1.6e-2, 0.1),
        (1.6e-2, 0.0),
        (1e-6, 0.1),
    ]
    assert members[0] and all("lora_A" in name for name in members[0])
    # B matrices and DoRA's magnitude vectors (1-D) learn at the LoRA+ rate
    assert {"lora_B" in name or "magnitude" in name for name in members[1]} == {True}
    assert any("magnitude" in name for name in members[1]) and not members[2] and not members[3]
    assert set().union(*members) == {name for name, param in model.named_parameters() if param.requires_grad}

    config = parse_train_config(case_config("loraplus_embedding", assets, "unused"))
    model = load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=True)
    groups = loraplus_parameter_groups(model, learning_rate=1e-3, weight_decay=0.0, lr_ratio=4.0, embedding_lr=1e-6)
    names = {id(param): name for name, param in model.named_parameters()}
    embedding = [names[id(param)] for param in groups[3]["params"]]
    assert len(embedding) == 1 and "embed_tokens.lora_embedding_B" in embedding[0]
    assert any("embed_tokens.lora_embedding_A" in names[id(param)] for param in groups[0]["params"])


def test_loraplus_in_pretraining_builds_the_same_groups(assets, tmp_path):
    from lathe.train.callbacks.events import TrainerCallback

    seen = {}

    class Capture(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            seen["groups"] = [
                (group["lr"], group["weight_decay"], len(group["params"])) for group in optimizer.param_groups
            ]

    config = {
        **case_config("loraplus", assets, str(tmp_path / "out")),
        "stage": "pt",
        "max_steps": 1,
        "weight_decay": 0.1,
    }
    run_train(parse_train_config(config), callbacks=[Capture()])
    assert [group[:2] for group in seen["groups"]] == [(0.01, 0.1), (0.16, 0.1), (0.16, 0.0), (1e-6, 0.1)]
    assert seen["groups"][0][2] == seen["groups"][1][2] > 0  # one A and one B per adapted layer


def test_pissa_convert_gives_a_lora_of_the_original_base(assets, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    _, trained = train({**case_config("pissa", assets, str(out)), "max_steps": 2}, monkeypatch)
    for folder in ("pissa_init", "pissa_backup", "pissa_converted"):
        assert (out / folder / "adapter_model.safetensors").is_file()
    converted = json.loads((out / "pissa_converted" / "adapter_config.json").read_text())
    assert converted["r"] == 16 and converted["init_lora_weights"] is True  # rank 2r, a plain LoRA
    ids = torch.tensor([[1, 7, 30, 41, 5]])
    trained.eval()
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        plain = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(assets["model"]), str(out / "pissa_converted")
        )
        assert torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-4)


def test_oft_adapts_the_targets_in_blocks(assets):
    from lathe.llm.model.loader import load_model, load_tokenizer

    config = parse_train_config({**case_config("oft", assets, "unused"), "oft_target": "q_proj,v_proj"})
    model = load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=True)
    peft_config = model.peft_config["default"]
    assert type(peft_config).__name__ == "OFTConfig" and set(peft_config.target_modules) == {"q_proj", "v_proj"}
    assert peft_config.oft_block_size == 32 and peft_config.r == 0
    adapted = {name.rsplit(".oft_", 1)[0] for name, param in model.named_parameters() if param.requires_grad}
    assert adapted and all(name.endswith(("q_proj", "v_proj")) for name in adapted)
    with pytest.raises(ValueError, match="set exactly one of oft_rank and oft_block_size"):
        parse_train_config({**case_config("oft", assets, "unused"), "oft_rank": 4})


def test_regex_lora_target_matches_whole_paths(assets):
    from lathe.llm.model.loader import load_model, load_tokenizer

    def adapted(**values):
        config = parse_train_config({**case_config("lora", assets, "unused"), **values})
        model = load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=True)
        return {name.split(".lora_")[0] for name, param in model.named_parameters() if param.requires_grad}

    by_regex = adapted(lora_target=r".*\.layers\.[13]\.self_attn\.(q_proj|v_proj)")
    assert by_regex == {
        f"base_model.model.model.layers.{i}.self_attn.{m}" for i in (1, 3) for m in ("q_proj", "v_proj")
    }
    assert adapted(lora_target=r".*\.(q_proj|v_proj)") == adapted(lora_target="q_proj,v_proj")
    with pytest.raises(ValueError, match="matches no module path"):
        adapted(lora_target=r".*\.qkv_proj")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        parse_train_config({**case_config("lora", assets, "unused"), "lora_target": "q_proj("})


def test_dora_on_a_4bit_base_starts_where_qlora_does(assets, tmp_path, monkeypatch):
    """LLaMA-Factory 0.9.5 refuses DoRA on bitsandbytes bases (it compares transformers' "bitsandbytes" with its
    own "bnb"); peft supports it, so lathe trains it. DoRA starts as the identity (magnitude = |W|, B = 0):
    the first step's loss is plain QLoRA's, and training then takes its own path."""
    config = {**case_config("qlora_nf4", assets, str(tmp_path / "out")), "use_dora": True, "max_steps": 2}
    losses, model = train(config, monkeypatch)
    assert losses[0] == pytest.approx(GOLDEN_CASES["qlora_nf4"]["losses"][0], rel=1e-5)
    assert losses[1] != pytest.approx(GOLDEN_CASES["qlora_nf4"]["losses"][1], rel=1e-5)
    q_proj = model.get_base_model().model.layers[0].self_attn.q_proj
    assert type(q_proj.base_layer).__name__ == "Linear4bit" and "default" in q_proj.lora_magnitude_vector


def test_every_recipe_trainer_builds_the_loraplus_optimizer():
    """LLaMA-Factory's pt, sft, rm, dpo and kto trainers all take loraplus_lr_ratio (its create_custom_optimizer)."""
    from lathe.llm.methods.optimizers import MethodOptimizerMixin
    from lathe.llm.preference.dpo import DPOTrainer
    from lathe.llm.preference.kto import KTOTrainer
    from lathe.llm.preference.reward import RewardTrainer
    from lathe.llm.workflows.pt import PretrainTrainer
    from lathe.llm.workflows.sft import SFTTrainer

    for trainer in (PretrainTrainer, SFTTrainer, RewardTrainer, DPOTrainer, KTOTrainer):
        assert issubclass(trainer, MethodOptimizerMixin), trainer
