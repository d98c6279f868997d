"""Loading: each load opens the library under a name the dynamic loader has not seen."""

from __future__ import annotations

import os

from opmagic.native.loader import _fresh_name


def test_a_reused_descriptor_gets_a_new_name_for_the_same_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    fd = os.open(path, os.O_RDONLY)
    try:
        names = [_fresh_name(fd) for _ in range(200)]
        assert len(set(names)) == 200
        assert max(len(name) for name in names) < 40  # grows with the cube root of the uses
        assert {os.stat(name).st_ino for name in names} == {os.fstat(fd).st_ino}
    finally:
        os.close(fd)
