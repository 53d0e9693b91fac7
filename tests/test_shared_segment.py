"""``system.shared_segment``: a named segment under /dev/shm, created, attached, unlinked."""

import os

import numpy as np
import pytest

from system import shared_segment
from system.shared_segment import SharedSegment

pytestmark = pytest.mark.skipif(not shared_segment.available(), reason="no /dev/shm")


def test_an_attached_segment_reads_what_the_creator_wrote_and_outlives_the_name():
    created = SharedSegment(f"aisrl-test-{os.getpid()}", 1000, create=True)
    created.array[:] = np.arange(1000) % 251
    attached = SharedSegment(created.name, None, create=False)  # None: the whole segment, 1000 bytes
    assert attached.size == 1000 and not attached.array.flags.writeable
    created.unlink()
    assert not created.path.exists()
    created.array[3] = 7  # after the unlink, the mappings are still one memory
    assert attached.array[3] == 7 and np.array_equal(attached.array[4:], np.arange(4, 1000) % 251)
    attached.close()
    created.close()
    with pytest.raises(FileNotFoundError):
        SharedSegment(created.name, None, create=False)


def test_an_announced_size_larger_than_the_segment_and_bad_names_are_refused():
    created = SharedSegment(f"aisrl-test-{os.getpid()}", 64, create=True)
    try:
        with pytest.raises(ValueError, match="holds 64 bytes, 65 were announced"):
            SharedSegment(created.name, 65, create=False)
        with pytest.raises(FileExistsError):
            SharedSegment(created.name, 64, create=True)  # never two creators of one name
    finally:
        created.close()
    with pytest.raises(ValueError, match="one path component"):
        SharedSegment("../etc/x", 64, create=True)


def test_the_probe_is_seen_with_its_token_only():
    probe, announced = shared_segment.create_probe(f"aisrl-test-{os.getpid()}")
    try:
        assert shared_segment.probe_token(announced)
        assert not shared_segment.probe_token(announced[:-1] + ("0" if announced[-1] != "0" else "1"))
        assert not shared_segment.probe_token("aisrl-test-missing:abc")
    finally:
        probe.close()
    assert not shared_segment.probe_token(announced)  # gone with its creator's close
