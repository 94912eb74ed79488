"""Tokenizers built with `tokenizers`, wrapped as `PreTrainedTokenizerFast`, made here (no download).

- :func:`build_char_tokenizer`: every character of the alphabet is one token; ``<pad>``, ``<bos>``,
  ``<eos>`` and ``<unk>`` are special (the toy lessons' tokenizer).
- :func:`build_bpe_tokenizer`: a byte-level BPE trained on a corpus, shaped like Qwen2.5-Instruct's
  (no BOS, pad ≠ EOS, ``<|im_start|>`` / ``<|im_end|>``, a chat template): the hub-shaped tokenizer the
  tests and the capstone lesson use where no hub is reachable.

Both save and load like any Hugging Face tokenizer (``save_pretrained`` / ``from_pretrained``), so the rest
of the code treats them exactly as it would a real model's.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE, WordLevel
from tokenizers.pre_tokenizers import Split
from tokenizers.trainers import BpeTrainer
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
#: digits, arithmetic, separators: enough for the course's tasks
DEFAULT_ALPHABET = "0123456789+-*/=()<>,:; ?abcdefghijklmnopqrstuvwxyz"


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A tokenizer whose tokens are the specials (ids 0–3) followed by the characters of ``alphabet``."""
    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet has repeated characters")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = Split(Regex("."), behavior="isolated")  # one piece per character
    core.decoder = decoders.Fuse()  # join the characters back without spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


# --------------------------------------------------------------------------- a hub-shaped (Qwen2.5-like) tokenizer

#: Qwen2.5's special tokens: ``<|endoftext|>`` (the pad, and the base model's end of text) and the chat-turn
#: markers ``<|im_start|>`` / ``<|im_end|>`` (the instruct model's end of turn). There is no BOS.
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: A ChatML template in Qwen's shape (written here, not Qwen's own: no default system message, no tools):
#: ``<|im_start|>{role}\n{content}<|im_end|>\n`` per message, then ``<|im_start|>assistant\n`` to generate.
QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Pre-tokenization in the spirit of Qwen's: every digit alone, words with their leading space, runs of
#: punctuation, whitespace. Then bytes are mapped to printable characters (byte-level BPE: no unknown token).
_PRETOKENIZE = r"\p{N}| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def build_bpe_tokenizer(corpus: Iterable[str], vocab_size: int = 512, min_frequency: int = 2,
                        chat_template: str | None = QWEN_CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus``, shaped like Qwen2.5-Instruct's: the special tokens of
    :data:`QWEN_SPECIAL_TOKENS` (ids 0, 1, 2), **no BOS**, EOS ``<|im_end|>`` ≠ pad ``<|endoftext|>``, a chat
    template. Trains in well under a second on a few thousand lines."""
    core = Tokenizer(BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        Split(Regex(_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                         special_tokens=list(QWEN_SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"], padding_side="left")
    tok.chat_template = chat_template
    return tok


def sample_corpus(num_lines: int = 3000, seed: int = 0) -> list[str]:
    """Generated English-and-arithmetic text to train :func:`build_bpe_tokenizer` on (no download): sums written
    as equations and as short word problems with their worked answers."""
    rng = random.Random(seed)
    names = ["Ann", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana"]
    things = ["apples", "books", "coins", "marbles", "pens", "stamps"]
    lines = []
    for _ in range(num_lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        name, thing = rng.choice(names), rng.choice(things)
        lines.append(rng.choice([
            f"{a}+{b}={a + b}",
            f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
            f"{name} had {a} {thing}, then {b} more: {a} + {b} = {a + b}. The answer is {a + b}.",
            f"What is {a} plus {b}? The answer is {a + b}.",
            f"system\nYou are a helpful assistant.\nuser\n{a}+{b}=\nassistant\n{a + b}",
        ]))
    return lines
