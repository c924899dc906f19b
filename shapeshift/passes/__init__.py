"""Passes over the graph IR."""
