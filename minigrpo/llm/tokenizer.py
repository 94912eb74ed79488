"""A character-level tokenizer built with `tokenizers`, wrapped as a `PreTrainedTokenizerFast`.

Every character of the alphabet is one token; ``<pad>``, ``<bos>``, ``<eos>`` and ``<unk>`` are
special. It saves and loads like any Hugging Face tokenizer (``save_pretrained`` /
``from_pretrained``), so the rest of the code treats it exactly as it would a real model's.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Split
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
