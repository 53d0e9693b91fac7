"""``aisrl report`` on archives that zipfile itself cannot open (a bad-input probe, 2026-12-01)."""

import numpy as np
from test_report import runner, said

from actors.cli import app
from system.report.demo_dump import make_demo_dump


def test_an_archive_zipfile_cannot_open_is_refused_naming_the_file(tmp_path):
    """A probe: an encrypted member (RuntimeError) and a compression method zipfile lacks
    (NotImplementedError) ended in tracebacks. Both are built from a real dump's bytes."""
    import zipfile

    plain = tmp_path / "plain.npz"
    np.savez(plain, **make_demo_dump(6, 5, seed=0))
    raw = bytearray(plain.read_bytes())
    with zipfile.ZipFile(plain) as zf:
        infos = zf.infolist()
    unknown = bytearray(raw)
    for info in infos:  # method 99 in every local header (offset + 8) and central header
        unknown[info.header_offset + 8: info.header_offset + 10] = (99).to_bytes(2, "little")
    central = raw.index(b"PK\x01\x02")
    while central >= 0:
        unknown[central + 10: central + 12] = (99).to_bytes(2, "little")
        central = raw.find(b"PK\x01\x02", central + 4)
    encrypted = bytearray(raw)
    for info in infos:  # the "encrypted" flag (bit 0 of the general-purpose flags)
        encrypted[info.header_offset + 6] |= 1
    central = raw.index(b"PK\x01\x02")
    while central >= 0:
        encrypted[central + 8] |= 1
        central = raw.find(b"PK\x01\x02", central + 4)
    for name, data, cause in (("unknown.npz", unknown, "NotImplementedError"), ("encrypted.npz", encrypted, "RuntimeError")):
        path = tmp_path / name
        path.write_bytes(bytes(data))
        result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "o")])
        assert result.exit_code == 2, (name, result.output)
        assert f"{name}: not a readable .npz batch dump ({cause}" in said(result), said(result)
