"""`moe_aux_loss_coef` against LLaMA-Factory 0.9.5 (tests/llm/golden/llamafactory_moe.json, made by
make_llamafactory_moe.py): the config attributes a trainable model's loader sets for every MoE family LLaMA-Factory
names (and none for those it does not), and `lathe train` of a tiny Qwen3-MoE with and without the router loss."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.goldens import assert_close_to_golden, load_generator  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"
GEN = load_generator(GOLDEN_DIR / "make_llamafactory_moe.py", "make_moe")
GOLDEN = json.loads((GOLDEN_DIR / "llamafactory_moe.json").read_text())


def test_every_moe_family_is_patched_as_llamafactory_patches_it():
    """For each family of the golden, transformers' own config (a composite with its MoE text model; a bare config
    for remote-code types) gets the attributes LLaMA-Factory's configure_moe set, no more; untouched when not
    training or when the key is unset or 0."""
    from lathe.llm.model.moe import configure_moe

    assert GOLDEN["versions"]["llamafactory"] == "0.9.5"
    assert sorted(GOLDEN["patched"]) == sorted(GEN.CONFIGS)
    coef = GOLDEN["coef"]
    for label, expected in GOLDEN["patched"].items():
        config = GEN.make_config(label)
        for arguments in ((coef, False), (None, True), (0.0, True)):  # these leave the config as it was
            assert GEN.changed_attributes(config, lambda c, given=arguments: configure_moe(c, *given)) == {}, (
                label,
                arguments,
            )
        patched = GEN.changed_attributes(config, lambda c: configure_moe(c, coef, True))
        assert_close_to_golden(patched, expected, f"{label}'s patched attributes")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return GEN.write_folders(tmp_path_factory.mktemp("moe"), GEN.training_rows())


@pytest.mark.parametrize("name", list(GEN.TRAIN_CASES))
def test_lathe_train_of_a_moe_model_equals_llamafactory(name, folders, tmp_path):
    """Three steps of the tiny Qwen3-MoE: with moe_aux_loss_coef the router's loss joins the loss (LLaMA-Factory's
    losses are 0.11 higher than without; its gradient counts only without gradient checkpointing, see the
    generator's TRAIN_CASES), and lathe's losses (1e-5) and grad norms (1e-4 relative) are LLaMA-Factory's."""
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train

    expected = GOLDEN["train"][name]
    assert expected["keys"] == GEN.TRAIN_CASES[name]
    model, data = folders
    run_train(parse_train_config(GEN.train_config(model, data, tmp_path / "out", **GEN.TRAIN_CASES[name])))
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert_close_to_golden(losses, expected["loss"], f"{name} losses", rel=0, abs=1e-5)
    norms = [entry["grad_norm"] for entry in history if "loss" in entry]
    assert_close_to_golden(norms, expected["grad_norm"], f"{name} norms", rel=1e-4)
