"""A character-level tokenizer trained with ``tokenizers`` on the task's text, in byte-level form.

Every distinct character of the training text becomes one token per UTF-8 byte (one token for
ASCII), after the special tokens ``<pad>`` (id 0), ``<eos>`` (id 1) and ``<unk>`` (id 2); the
ids follow the characters' order in a ``WordLevel`` training over single characters (so a
text of ASCII characters gets the ids a plain character tokenizer would give it). With
``all_bytes`` every byte has a token, so any text encodes without loss.

Why byte-level: the model directory says ``model_type: qwen2``, and transformers (>= 5, so vLLM
too) loads any tokenizer beside such a config as ``Qwen2Tokenizer``, which rebuilds it as a
byte-level BPE from its vocabulary and merges (NFC, byte-level pre-tokenizer and decoder, no
unknown token) whatever ``tokenizer.json`` says. A plain character vocabulary then lost every
space, newline and non-ASCII character of a prompt on reload (they have no byte-level token), so
vLLM sampled from prompts the warm start never saw. Built in that form here (no merges), the
tokenizer encodes the same ids in memory and after any reload: ``decode(encode(s)) == s`` for
NFC text whose bytes all have tokens; a byte without a token is dropped, as on reload (which has
no unknown token), so tasks whose text may hold unseen characters use ``all_bytes``.
"""

import unicodedata
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)

_BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
"""Each UTF-8 byte of a text to its printable stand-in (the byte-level alphabet), nothing split off."""


def _byte_tokens(text: str) -> list[str]:
    """The byte-level symbols of ``text``'s UTF-8 bytes (one per byte), as the pre-tokenizer maps them."""
    return [symbol for piece, _ in _BYTE_LEVEL.pre_tokenize_str(text) for symbol in piece]


def _character_order(texts: Iterable[str]) -> list[str]:
    """The distinct characters of ``texts`` in the order a ``WordLevel`` trainer numbers them."""
    counter = Tokenizer(models.WordLevel(unk_token=UNK))
    counter.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1,
                                        vocab_size=1 << 16, show_progress=False)
    counter.train_from_iterator((unicodedata.normalize("NFC", t) for t in texts), trainer=trainer)
    vocab = counter.get_vocab()
    return [c for c, _ in sorted(vocab.items(), key=lambda item: item[1]) if c not in SPECIAL_TOKENS]


def train_char_tokenizer(texts: Iterable[str], model_max_length: int,
                         all_bytes: bool = False) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per byte of each character seen in ``texts`` (every byte with
    ``all_bytes``) plus the special tokens."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    characters = _character_order(texts)
    if not characters:
        raise ValueError("tokenizer training text is empty: the task produced no prompts")
    symbols = [symbol for c in characters for symbol in _byte_tokens(c)]
    for symbol in symbols + (sorted(pre_tokenizers.ByteLevel.alphabet()) if all_bytes else []):
        vocab.setdefault(symbol, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _BYTE_LEVEL
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
