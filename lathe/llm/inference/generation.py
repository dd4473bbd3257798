"""Decoding a batch of requests together, each with its own settings: the loop behind `lathe chat`
and `lathe api`.

One forward pass per generated token for the whole batch (prompts left-padded, a KV cache), and per
row: OpenAI's presence/frequency penalties, transformers' repetition_penalty, temperature, top-k,
top-p, its own random generator (seed), its own stop conditions (the template's stop tokens, stop
strings, max_new_tokens). Text is streamed as it becomes final: never half a UTF-8 character, never
the start of what may turn out to be a stop string. Rows with images (a vision-language model) pass their
images' tensors with the first forward, and a model with 3-D rotary positions (Qwen2-VL: mrope) gets them
from its own get_rope_index, as in training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0  # 0 (or do_sample False): greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    do_sample: bool = True
    repetition_penalty: float = 1.0  # transformers' meaning: divides positive logits of seen tokens
    presence_penalty: float = 0.0  # OpenAI's meaning: subtracted once from tokens already generated
    frequency_penalty: float = 0.0  # OpenAI's meaning: subtracted per earlier occurrence in the output
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0


@dataclass
class Sequence:
    """One row of a batch: a prompt, its settings, and what has been generated so far."""

    prompt_ids: list[int]
    params: SamplingParams
    on_text: Callable[[str], None] | None = None  # called with each new piece of final text
    generated: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of `text` already passed to on_text
    finish_reason: str | None = None  # stop (a stop token or string) or length (max_new_tokens)
    completion_tokens: int = 0  # tokens the model produced, a final stop token included
    media: dict | None = None  # the media's tensors (pixel_values, image_grid_thw, ...) for the prompt's media tokens

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


# image and video tensors that join across rows in row order (the model matches them to its vision tokens in order)
JOINABLE = frozenset({"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"})


class BatchGenerator:
    def __init__(self, model, tokenizer, stop_token_ids: list[int], skip_special_tokens: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.stop_token_ids = set(stop_token_ids)
        self.skip_special_tokens = skip_special_tokens
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(stop_token_ids))

    def generate(self, sequences: list[Sequence]) -> list[Sequence]:
        """Run every sequence to its end; each one's on_text streams its text as it is produced. Rows whose
        image tensors follow their own tokens or tiles (token_type_ids, cross_attention_mask, image_sizes: the
        families beside Qwen2-VL) are decoded alone, the others together."""
        # by flag, not `in`: Sequence's dataclass == would compare the media tensors of two equal requests
        apart = [bool(seq.media) and not JOINABLE.issuperset(seq.media) for seq in sequences]
        together = [seq for seq, alone in zip(sequences, apart) if not alone]
        for group in ([together] if together else []) + [[seq] for seq, alone in zip(sequences, apart) if alone]:
            self._generate(group)
        return sequences

    def _generate(self, sequences: list[Sequence]) -> list[Sequence]:
        import torch

        device = next(self.model.parameters()).device
        generators = [self._random(seq.params.seed, device) for seq in sequences]
        input_ids, attention_mask = self._left_pad([seq.prompt_ids for seq in sequences], device)
        media = self._media(sequences, device, next(self.model.parameters()).dtype)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        if media:
            from lathe.llm.multimodal.mrope import rope_index_function, rope_positions

            if rope_index_function(self.model) is not None:
                # 3-D (mrope) positions, as training gives them; then each new token one further on every axis
                grids = (media.get(key) for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts"))
                position_ids, _ = rope_positions(self.model, input_ids, attention_mask, *grids)
        cache, steps = None, max(seq.params.max_new_tokens for seq in sequences)
        with torch.inference_mode():
            for _ in range(steps):
                output = self.model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    past_key_values=cache,
                    use_cache=True,
                    **media,
                )
                # the vision tower reads the images once, with the prompt; Llama 3.2 Vision's new tokens see the
                # images the last prompt token saw (the model's own generate repeats that position's mask)
                cross = media.get("cross_attention_mask")
                media = {} if cross is None else {"cross_attention_mask": cross[:, -1:]}
                cache = output.past_key_values
                logits = output.logits[:, -1, :].float()
                next_ids = []
                for row, seq in enumerate(sequences):
                    if seq.done:
                        next_ids.append(self.pad_id)
                        continue
                    token = self._choose(logits[row], seq, generators[row])
                    next_ids.append(token)
                    self._append(seq, token)
                if all(seq.done for seq in sequences):
                    break
                input_ids = torch.tensor(next_ids, device=device)[:, None]
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(sequences), 1))], dim=-1)
                position_ids = position_ids[..., -1:] + 1
        return sequences

    # ---- per row ----------------------------------------------------------------------------------
    def _choose(self, logits, seq: Sequence, generator) -> int:
        import torch

        params = seq.params
        if params.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.prompt_ids + seq.generated)), device=logits.device)
            values = logits[seen]
            logits[seen] = torch.where(
                values > 0, values / params.repetition_penalty, values * params.repetition_penalty
            )
        if seq.generated and (params.presence_penalty or params.frequency_penalty):
            ids, counts = torch.tensor(seq.generated, device=logits.device).unique(return_counts=True)
            logits[ids] -= params.presence_penalty + params.frequency_penalty * counts.to(logits.dtype)
        if params.greedy:
            return int(logits.argmax())
        scaled = logits / params.temperature
        if not torch.isfinite(scaled.max()):  # a temperature so small (1e-310) that dividing overflows: its limit
            return int(logits.argmax())
        logits = scaled
        if 0 < params.top_k < logits.numel():
            threshold = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < threshold, float("-inf"))
        probabilities = torch.softmax(logits, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probabilities.sort(descending=True)
            # keep the smallest set whose mass reaches top_p (the most likely token always stays)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
            probabilities = probabilities.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
        return int(torch.multinomial(probabilities, 1, generator=generator))

    def _append(self, seq: Sequence, token: int) -> None:
        seq.completion_tokens += 1
        if token in self.stop_token_ids:  # it ends the text; it is not part of it
            seq.finish_reason = "stop"
        else:
            seq.generated.append(token)
            seq.text = self.tokenizer.decode(seq.generated, skip_special_tokens=self.skip_special_tokens)
            cut = _first_stop(seq.text, seq.params.stop, seq.sent)
            if cut is not None:
                seq.text, seq.finish_reason = seq.text[:cut], "stop"
        if seq.finish_reason is None and seq.completion_tokens >= seq.params.max_new_tokens:
            seq.finish_reason = "length"
        self._emit(seq)

    def _emit(self, seq: Sequence) -> None:
        """Pass on the text that can no longer change."""
        final = len(seq.text)
        if not seq.done:
            if seq.text.endswith("\ufffd"):
                final = len(seq.text.rstrip("\ufffd"))  # half a multi-byte character so far
            final = min(final, _stop_prefix_start(seq.text, seq.params.stop, seq.sent))
        if final > seq.sent and seq.on_text is not None:
            try:
                seq.on_text(seq.text[seq.sent : final])
            except Exception:  # a listener that went away must not stop the other rows of the batch
                seq.on_text = None
        seq.sent = max(seq.sent, final)

    # ---- batch helpers ----------------------------------------------------------------------------
    @staticmethod
    def _media(sequences: list[Sequence], device, dtype) -> dict:
        """The rows' image tensors joined in row order (the model matches them to its vision tokens in order),
        pixel values in the model's dtype."""
        import torch

        rows = [seq.media for seq in sequences if seq.media]
        keys = dict.fromkeys(key for row in rows for key in row)  # an image row and a video row carry other keys
        joined = {key: torch.cat([row[key] for row in rows if key in row]).to(device) for key in keys}
        return {key: value.to(dtype) if value.is_floating_point() else value for key, value in joined.items()}

    def _left_pad(self, rows: list[list[int]], device):
        import torch

        length = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, length - len(row) :] = torch.tensor(row, dtype=torch.long)
            attention_mask[index, length - len(row) :] = 1
        return input_ids.to(device), attention_mask.to(device)

    @staticmethod
    def _random(seed: int | None, device):
        import torch

        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        return generator


def _first_stop(text: str, stops: list[str], start: int) -> int | None:
    """Where the first stop string begins, looking at text not yet sent (and a stop's length before it)."""
    found = [index for stop in stops if stop and (index := text.find(stop, max(0, start - len(stop) + 1))) >= 0]
    return min(found) if found else None


def _stop_prefix_start(text: str, stops: list[str], sent: int) -> int:
    """The start of the longest text suffix that is a prefix of a stop string (held back), or len(text)."""
    start = len(text)
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text) - sent), 0, -1):
            if stop.startswith(text[-size:]):
                start = min(start, len(text) - size)
                break
    return start
