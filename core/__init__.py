"""Shared types and math below every other layer: checked config fields, ..."""
