"""The correction service names dumped tokens from ``tokenizer.json`` alone (``hf_files.token_names``,
without transformers' import): the names must be the tokenizer's own ``convert_ids_to_tokens``."""

import numpy as np

from system.models.hf_files import token_names
from system.report.dump import token_text_grid


def test_token_names_from_tokenizer_json_are_the_tokenizers_own(tmp_path, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    name = token_names(str(tmp_path))
    ids = list(range(len(tiny_tokenizer)))  # every id, the special tokens included
    assert [name(i) for i in ids] == tiny_tokenizer.convert_ids_to_tokens(ids)
    assert len(set(tiny_tokenizer.convert_ids_to_tokens(ids))) == len(ids)  # a mix-up of two ids would show
    # the dump's grid: names where the mask is set, empty elsewhere
    response_ids = np.array([[1, 2, 3], [4, 0, 0]])
    mask = np.array([[1, 1, 1], [1, 0, 0]], dtype=bool)
    grid = token_text_grid(name, response_ids, mask)
    expected = [tiny_tokenizer.convert_ids_to_tokens(r) for r in ([1, 2, 3], [4])]
    assert grid.tolist() == [expected[0], [expected[1][0], "", ""]]
