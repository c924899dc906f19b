"""The tuner's optional dependencies (the ``tune`` extra), checked before any work.

Tuning trains scikit-learn models (the cost model's gradient boosting, the dispatch tree),
but only after measuring: without this check a run measured for minutes and then died on a
ModuleNotFoundError. ``--plot`` needs matplotlib, once everything is tuned.
"""

from __future__ import annotations

import importlib

from ..errors import ShapeshiftError

INSTALL = "pip install 'shapeshift[tune]'"


class MissingDependencyError(ShapeshiftError):
    """An optional package a command needs is not installed (or does not import)."""


def require(modules: tuple[str, ...], package: str, purpose: str) -> None:
    """Import ``modules``, or raise a MissingDependencyError naming ``package``, what it is
    for and how to install it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # ModuleNotFoundError, or an installed package that does not import
            raise MissingDependencyError(f"{purpose} needs {package}, which cannot be imported ({exc}): "
                                         f"{INSTALL}") from None


def require_tuning_dependencies() -> None:
    """scikit-learn: the cost model (sklearn.ensemble) and the dispatch tree (sklearn.tree)."""
    require(("sklearn.ensemble", "sklearn.tree"), "scikit-learn", "tuning (its cost model and dispatch tree)")


def require_plotting() -> None:
    require(("matplotlib",), "matplotlib", "--plot")
