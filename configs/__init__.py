"""Frozen dataclass presets: models, meshes, experiments."""
