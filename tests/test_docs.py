"""docs/diagrams.py renders the architecture picture that docs/architecture.md embeds."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_diagram_renders(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "architecture.png"
    subprocess.run([sys.executable, str(ROOT / "docs" / "diagrams.py"), "--out", str(out)], check=True, timeout=60)
    data = out.read_bytes()
    width, height = png_size(data)
    assert width >= 1200 and height >= 800
    assert len(data) > 50_000  # boxes, arrows and text, not a blank canvas


def test_committed_picture_is_embedded() -> None:
    data = (ROOT / "docs" / "architecture.png").read_bytes()
    assert png_size(data)[0] >= 1200
    assert "](architecture.png)" in (ROOT / "docs" / "architecture.md").read_text()
