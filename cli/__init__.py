"""entmtp.cli: the `entmtp` command line (Typer): option parsing, one library call, printing.

Layer 7 of 7. Depends on core, treesearch, model, runtime, evaluation, calibrate.
"""
