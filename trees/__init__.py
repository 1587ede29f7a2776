"""Shipped bundles and reference trees (JSON data only)."""
