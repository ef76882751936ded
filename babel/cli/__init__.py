"""``babel`` command line: one module per command, wiring only."""
