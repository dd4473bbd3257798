"""Tiny models, tokenizers and data sets for transformers' example scripts, generated here (no hub, reproducible).

    python bench/example_assets.py OUT_DIR      # writes OUT_DIR/{data,models}/... (bench/example_scripts.py calls it)

Everything comes from fixed seeds: the words are made of syllables drawn by random.Random(0); each tokenizer is
a `tokenizers` WordPiece model whose vocabulary is the special tokens, every word of the data, every character
and every "##"+character (built directly, not trained, so it is the same run to run); each model is built from a
config with torch.manual_seed(0) and saved with save_pretrained. Task heads the scripts add on loading
(classification, token classification, multiple choice) are initialised by the script itself after its set_seed.
"""

import json
import os
import random
import sys

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "gu", "ba", "fe", "zo", "wi", "ho", "ly"]
N_WORDS = 48
MODEL_MAX_LENGTH = 64
SIZES = {"train": 64, "validation": 24, "test": 16}


def make_words(rng):
    words = []
    while len(words) < N_WORDS:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        if word not in words:
            words.append(word)
    return words


def sentence(rng, words, low=4, high=10):
    return " ".join(rng.choice(words) for _ in range(rng.randint(low, high)))


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")


def write_lines(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


# --- data -------------------------------------------------------------------------------------------------


def pair_rows(rng, words, n):
    """Sentence pairs labelled "same" when both start with the same word (a signal a tiny BERT can pick up)."""
    rows = []
    for _ in range(n):
        first, second = sentence(rng, words), sentence(rng, words)
        if rng.random() < 0.5:
            second = first.split()[0] + " " + second
        label = "same" if first.split()[0] == second.split()[0] else "different"
        rows.append({"sentence1": first, "sentence2": second, "label": label})
    return rows


def ner_rows(rng, words, n):
    """Word sequences tagged B-/I- by the word's first letter (PER: k..p, LOC: r..z), O otherwise."""
    rows = []
    for _ in range(n):
        tokens = sentence(rng, words, 3, 9).split()
        tags, previous = [], None
        for token in tokens:
            kind = "PER" if token[0] in "klmnp" else "LOC" if token[0] in "rstuwz" else None
            tags.append("O" if kind is None else ("I-" if kind == previous else "B-") + kind)
            previous = kind
        rows.append({"tokens": tokens, "ner_tags": tags})
    return rows


def swag_rows(rng, words, n):
    """Four endings, the right one repeats the context's last word."""
    rows = []
    for _ in range(n):
        sent1, sent2 = sentence(rng, words, 3, 6), sentence(rng, words, 1, 2)
        endings = [sentence(rng, words, 2, 4) for _ in range(4)]
        label = rng.randrange(4)
        endings[label] = sent1.split()[-1] + " " + endings[label]
        row = {"sent1": sent1, "sent2": sent2, "label": label, "video-id": "v", "fold-ind": "0", "startphrase": ""}
        row.update({f"ending{i}": e for i, e in enumerate(endings)})
        rows.append(row)
    return rows


def summary_rows(rng, words, n):
    rows = []
    for _ in range(n):
        text = sentence(rng, words, 8, 16)
        rows.append({"text": text, "summary": " ".join(text.split()[::3])})
    return rows


def translation_rows(rng, words, n):
    """ "ro" is the "en" sentence reversed, word by word."""
    rows = []
    for _ in range(n):
        en = sentence(rng, words, 3, 8)
        rows.append({"translation": {"en": en, "ro": " ".join(reversed(en.split()))}})
    return rows


def qa_rows(rng, words, n):
    """SQuAD-shaped rows: the answer is the word after the question's word in the context."""
    rows = []
    for index in range(n):
        context = sentence(rng, words, 6, 12).split()
        at = rng.randrange(len(context) - 1)
        answer = context[at + 1]
        start = len(" ".join(context[: at + 1])) + 1
        rows.append(
            {
                "id": f"q{index}",
                "title": "t",
                "context": " ".join(context),
                "question": f"after {context[at]}",
                "answers": {"text": [answer], "answer_start": [start]},
            }
        )
    return rows


def write_data(out, words):
    data = os.path.join(out, "data")
    makers = {
        "glue": pair_rows,
        "ner": ner_rows,
        "swag": swag_rows,
        "summarization": summary_rows,
        "translation": translation_rows,
    }
    for task, maker in makers.items():
        rng = random.Random(task)
        for split, n in SIZES.items():
            write_jsonl(os.path.join(data, task, f"{split}.json"), maker(rng, words, n))
    rng = random.Random("qa")
    for split, n in SIZES.items():  # run_seq2seq_qa reads json files with field="data"
        os.makedirs(os.path.join(data, "qa"), exist_ok=True)
        with open(os.path.join(data, "qa", f"{split}.json"), "w", encoding="utf-8") as handle:
            json.dump({"data": qa_rows(rng, words, n)}, handle, sort_keys=True)
    rng = random.Random("text")
    for split, n in SIZES.items():
        write_lines(os.path.join(data, "text", f"{split}.txt"), [sentence(rng, words, 6, 14) for _ in range(n * 2)])
    write_images(os.path.join(data, "images"))


def write_images(folder):
    """Two classes of 16x16 RGB images (PIL): a bright square top-left vs bottom-right on noise, as imagefolder."""
    from PIL import Image

    rng = random.Random("images")
    for split, n in (("train", 48), ("validation", 16)):
        for index in range(n):
            label = index % 2
            pixels = [
                tuple(rng.randrange(0, 90) for _ in range(3)) if not _in_square(x, y, label) else (230, 200, 40)
                for y in range(16)
                for x in range(16)
            ]
            image = Image.new("RGB", (16, 16))
            image.putdata(pixels)
            path = os.path.join(folder, split, f"class{label}", f"{index:03d}.png")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            image.save(path)


def _in_square(x, y, label):
    return (x < 7 and y < 7) if label == 0 else (x > 8 and y > 8)


# --- tokenizers and models ---------------------------------------------------------------------------------


def wordpiece(words, specials, single=None, pair=None):
    """A WordPiece tokenizer over the data's words and characters; `single`/`pair` are TemplateProcessing specs."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    chars = sorted(set("".join(words)))
    tokens = specials + sorted(words) + chars + ["##" + c for c in chars]
    vocab = {token: index for index, token in enumerate(dict.fromkeys(tokens))}
    unk = next(t for t in specials if "unk" in t.lower())
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    if single:
        ids = [(t, vocab[t]) for t in specials if t in single or (pair and t in pair)]
        tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)
    return tokenizer, vocab


def save_tokenizer(tokenizer, folder, input_names, **special):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=MODEL_MAX_LENGTH, model_input_names=input_names, **special
    )
    fast.save_pretrained(folder)


def write_models(out, words):
    import torch
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        BertConfig,
        BertForMaskedLM,
        GPT2Config,
        GPT2LMHeadModel,
        T5Config,
        T5ForConditionalGeneration,
        ViTConfig,
        ViTForImageClassification,
        ViTImageProcessor,
        XLNetConfig,
        XLNetLMHeadModel,
    )

    models = os.path.join(out, "models")
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}

    folder = os.path.join(models, "bert")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok, vocab = wordpiece(words, specials, "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1")
    save_tokenizer(
        tok,
        folder,
        ["input_ids", "token_type_ids", "attention_mask"],
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    BertForMaskedLM(
        BertConfig(vocab_size=len(vocab), max_position_embeddings=MODEL_MAX_LENGTH, **small)
    ).save_pretrained(folder)

    folder = os.path.join(models, "xlnet")  # run_plm: the BERT-style tokenizer above, an XLNet LM
    save_tokenizer(
        tok,
        folder,
        ["input_ids", "token_type_ids", "attention_mask"],
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=len(vocab), d_model=32, n_layer=2, n_head=2, d_inner=64, pad_token_id=0)
    XLNetLMHeadModel(config).save_pretrained(folder)

    folder = os.path.join(models, "gpt2")
    tok, vocab = wordpiece(words, ["<|endoftext|>", "<unk>"])
    save_tokenizer(
        tok,
        folder,
        ["input_ids", "attention_mask"],
        unk_token="<unk>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
    )
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(vocab),
        n_positions=MODEL_MAX_LENGTH,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)

    folder = os.path.join(models, "bart")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok, vocab = wordpiece(words, specials, "<s> $A </s>", "<s> $A </s> </s> $B </s>")
    save_tokenizer(
        tok,
        folder,
        ["input_ids", "attention_mask"],
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=MODEL_MAX_LENGTH,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )
    BartForConditionalGeneration(config).save_pretrained(folder)

    folder = os.path.join(models, "t5")
    tok, vocab = wordpiece(words, ["<pad>", "</s>", "<unk>"], "$A </s>", "$A </s> $B </s>")
    save_tokenizer(tok, folder, ["input_ids", "attention_mask"], pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(vocab),
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    T5ForConditionalGeneration(config).save_pretrained(folder)

    folder = os.path.join(models, "vit")
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, **small)
    ViTForImageClassification(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)


def main(out):
    words = make_words(random.Random(0))
    write_data(out, words)
    write_models(out, words)
    with open(os.path.join(out, "words.json"), "w") as handle:
        json.dump(words, handle)


if __name__ == "__main__":
    main(sys.argv[1])
