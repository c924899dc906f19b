"""Example models that shapeshift builds itself (no downloads)."""
