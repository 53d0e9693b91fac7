"""Finding checkpoints: only complete, published ``step_*`` directories count (no process group needed).

The save/load round trip itself runs on 2 gloo ranks in ``test_learner_fsdp``.
"""

import pytest

from system.learner.checkpoint import (
    checkpoint_path,
    is_complete,
    latest_checkpoint,
    load_checkpoint,
)


def _fake_checkpoint(path, metadata=True, trainer=True):
    path.mkdir(parents=True)
    if metadata:
        (path / ".metadata").write_bytes(b"")
    if trainer:
        (path / "trainer.json").write_text("{}")


def test_latest_checkpoint_skips_partial_and_incomplete_directories(tmp_path):
    assert latest_checkpoint(str(tmp_path / "missing")) is None
    assert latest_checkpoint(str(tmp_path)) is None
    _fake_checkpoint(tmp_path / "step_00000002")
    _fake_checkpoint(tmp_path / "step_00000010")
    _fake_checkpoint(tmp_path / "step_00000030.partial")  # killed before the rename
    _fake_checkpoint(tmp_path / "step_00000020", trainer=False)  # killed before trainer.json
    _fake_checkpoint(tmp_path / "step_00000040", metadata=False)  # DCP never finished
    _fake_checkpoint(tmp_path / "notes")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "step_00000010")
    assert checkpoint_path(str(tmp_path), 10) == str(tmp_path / "step_00000010")
    assert not is_complete(str(tmp_path / "step_00000020"))


def test_loading_an_incomplete_checkpoint_is_an_error(tmp_path):
    _fake_checkpoint(tmp_path / "step_00000001", metadata=False)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        load_checkpoint(str(tmp_path / "step_00000001"), model=None, optimizer=None, scheduler=None)
