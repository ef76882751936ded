"""``babel daemon``: run submitted and scheduled jobs (wiring only)."""

from __future__ import annotations

COMMANDS: list = []
