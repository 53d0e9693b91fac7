"""A character-level tokenizer trained with ``tokenizers`` on the task's text.

Every distinct character of the training text becomes one token (a ``WordLevel`` model over
single-character pre-tokens), after the special tokens ``<pad>`` (id 0), ``<eos>`` (id 1)
and ``<unk>`` (id 2). Decoding concatenates tokens (``Fuse``), so ``decode(encode(s)) == s``
for any text made of seen characters. It is saved as ``tokenizer.json`` +
``tokenizer_config.json``, which ``PreTrainedTokenizerFast`` and vLLM both load.
"""

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)


def train_char_tokenizer(texts: Iterable[str], model_max_length: int) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character seen in ``texts`` plus the special tokens."""
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1,
                                        vocab_size=1 << 16, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError("tokenizer training text is empty: the task produced no prompts")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
