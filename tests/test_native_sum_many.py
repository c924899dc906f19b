"""Sum, Max, Min and Mean over 2..16 inputs on the native backend, against onnxruntime at
several values of the dynamic dims, some inputs broadcast. A fused loop names its inputs
in1, in2, ..., in10, ...: placeholders filled one name at a time as plain text rewrote
in10 through in1 (a Sum of 12 inputs did not compile)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from onnx import helper

from .test_native_backend import _input, _output
from .test_native_ops_extra import _model, _rand, _run_both

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")


@pytest.mark.parametrize("count", [2, 3, 9, 10, 11, 12, 16])
@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
def test_variadic_ops_over_many_inputs(op, count):
    names = [f"x{i}" for i in range(count)]
    # Every third input is a row broadcast along the first dim, the others full [n, m].
    inputs = [_input(name, [1, "m"] if i % 3 == 2 else ["n", "m"]) for i, name in enumerate(names)]
    model = _model([helper.make_node(op, names, ["y"])], inputs, [_output("y")])
    rng = np.random.default_rng(count)
    feeds = []
    for n, m in ((1, 1), (3, 7), (5, 33)):
        feeds.append({name: _rand(rng, (1, m) if i % 3 == 2 else (n, m)) for i, name in enumerate(names)})
    _run_both(model, feeds, rtol=1e-5, atol=1e-5)
