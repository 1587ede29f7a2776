"""The entmtp Typer app."""
