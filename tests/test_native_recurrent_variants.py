"""The recurrent kernels' variants against onnxruntime: LSTM's own attributes (peepholes,
input_forget, clip, activation lists, initial cell state), hidden and batch sizes that are
not multiples of the block width (the packed step's ragged last block and row group),
rows of length 0, and the AVX2-only build (x86-64-v3) next to this machine's.

Models and feeds come from test_native_recurrent.py's builders: constant weights (R
packed at load) unless a case says otherwise, every model fully native.
"""

from __future__ import annotations

import numpy as np
import pytest

import shapeshift
from shapeshift.codegen.kernels import rnn_step

from . import test_native_ops_extra
from .test_native_recurrent import DIRECTIONS, _check, _feeds, _layout0_twin, _recurrent_model, _to_layout0, \
    _from_layout0

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler
ort = pytest.importorskip("onnxruntime")

LSTM_NODES = [("LSTM", direction, {}) for direction in DIRECTIONS]
# Every kernel kind in every direction.
EVERY_KIND = [(op, direction, attrs) for op, attrs in (("RNN", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}),
                                                        ("LSTM", {})) for direction in DIRECTIONS]


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("with_lens", [False, True], ids=["full", "sequence_lens"])
def test_lstm_peepholes_and_states(layout, with_lens):
    """Peepholes read the old cell for i and f and the new one for o; initial h and c."""
    model, params = _recurrent_model(LSTM_NODES, layout, with_state=True, with_lens=with_lens, peepholes=True)
    _check(model, params, layout)


@pytest.mark.parametrize("layout", [0, 1])
def test_lstm_input_forget_and_clip(layout):
    nodes = [("LSTM", "forward", {"input_forget": 1}), ("LSTM", "bidirectional", {"clip": 0.3}),
             ("LSTM", "reverse", {"input_forget": 1, "clip": 0.7})]
    # hidden 21: a full vector block and a tail, on the fast path (no clip) and the general one
    model, params = _recurrent_model(nodes, layout, with_state=True, with_lens=True, peepholes=True, hidden=21)
    _check(model, params, layout)


def test_lstm_activation_lists():
    nodes = [("LSTM", "forward", {"activations": ["HardSigmoid", "Softsign", "Relu"], "activation_alpha": [0.3],
                                  "activation_beta": [0.45]}),
             ("LSTM", "bidirectional", {"activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "ScaledTanh",
                                                        "Affine"],
                                        "activation_alpha": [0.25, 1.5, 0.8], "activation_beta": [0.4, 0.6, 0.1]}),
             ("LSTM", "reverse", {"activations": ["Sigmoid", "LeakyRelu", "Softplus"], "activation_alpha": [0.1]})]
    model, params = _recurrent_model(nodes, with_state=True, with_lens=True, peepholes=True, hidden=21)
    _check(model, params)


def test_lstm_weights_as_graph_inputs():
    """R not constant: the kernel packs it at each call."""
    model, params = _recurrent_model(LSTM_NODES, with_lens=True, with_state=True, weights_as_inputs=True,
                                     peepholes=True)
    _check(model, params)


@pytest.mark.parametrize("hidden", [1, 5, 17, 64, 100])
def test_ragged_hidden_and_batch(hidden):
    """Hidden sizes around the block width (8 or 16) and batches around the row tile; with
    sequence_lens, initial states and every kind and direction."""
    model, params = _recurrent_model(EVERY_KIND, with_state=True, with_lens=True, hidden=hidden, input_size=7,
                                     peepholes=True, seed=hidden)
    tol = 1e-4 if hidden < 64 else 3e-4  # longer dot products, same float32 rounding per term
    _check(model, params, rtol=tol, atol=tol, bindings=((1, 1), (4, 3), (6, 5), (3, 11)))


@pytest.mark.parametrize("layout", [0, 1])
def test_rows_of_length_zero(layout):
    """A row of length 0: zero Y and Y_h / Y_c (onnxruntime's answer), the others unharmed."""
    model, params = _recurrent_model(EVERY_KIND, layout, with_state=True, with_lens=True, peepholes=True)
    _check(model, params, layout, bindings=((4, 3), (5, 6)), zero_length=True)


@pytest.mark.parametrize("threads", [1, 2])
def test_bidirectional_on_two_threads(threads):
    """The two directions of a bidirectional node on their own threads give the same: at
    the larger binding each direction has the work that sends it to a thread of its own
    (rnn_step.DIR_PAR_MIN), at the smaller one not."""
    hidden, input_size, big = 65, 9, (64, 8)
    nodes = [(op, "bidirectional", attrs) for op, attrs in (("GRU", {}), ("GRU", {"linear_before_reset": 1}),
                                                             ("LSTM", {}), ("RNN", {}))]
    # The RNN node (1 gate) is the smallest; every node crosses the threshold at the larger binding.
    assert big[0] * big[1] * hidden * (input_size + hidden) >= rnn_step.DIR_PAR_MIN
    assert 2 * 3 * 4 * hidden * (input_size + hidden) < rnn_step.DIR_PAR_MIN
    model, params = _recurrent_model(nodes, with_state=True, with_lens=True, hidden=hidden, input_size=input_size,
                                     weight_scale=0.25)
    session = shapeshift.InferenceSession(model, backend="native", num_threads=threads)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in _feeds(model, params, 0, bindings=(big, (2, 3))):
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_steps_on_two_threads(threads):
    """Steps whose product is split between threads (rnn_step.STEP_PAR_MIN and SEQ_PAR_MIN:
    hidden 256 at batch 1 and 16 steps crosses both for each gate count; 3 steps do not)
    give the same: run by a team over each projection chunk, a barrier after each step's
    tiles (two a step for GRU without linear_before_reset). 45 steps at batch 2 take more
    than one chunk on every L2 up to 2 MB (a chunk is a quarter of L2 in floats over batch
    x gates), some of them of odd length, after which the team's state buffers swap."""
    hidden = 256
    assert 3 * hidden * hidden >= rnn_step.STEP_PAR_MIN and 16 * 3 * hidden * hidden >= rnn_step.SEQ_PAR_MIN
    assert 3 * 4 * hidden * hidden < rnn_step.SEQ_PAR_MIN
    nodes = [("LSTM", "forward", {}), ("GRU", "reverse", {"linear_before_reset": 1}), ("GRU", "forward", {})]
    model, params = _recurrent_model(nodes, with_state=True, with_lens=True, hidden=hidden, input_size=5,
                                     weight_scale=0.0625)
    session = shapeshift.InferenceSession(model, backend="native", num_threads=threads)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in _feeds(model, params, 0, bindings=((16, 1), (17, 2), (3, 1), (45, 2))):
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_single_steps_back_to_back(threads):
    """A decoding loop's one-step calls: each below SEQ_PAR_MIN, so a call after an idle
    spell runs on one thread, and one right after another (``warm``: the last call's team
    still spinning) on the team, a step's worth of work (STEP_PAR_MIN) at hidden 256. Every
    call of the loop, on either path, matches onnxruntime and the loop's first call."""
    hidden = 256
    assert 3 * hidden * hidden >= rnn_step.STEP_PAR_MIN and 4 * hidden * hidden < rnn_step.SEQ_PAR_MIN
    nodes = [("LSTM", "forward", {}), ("GRU", "forward", {"linear_before_reset": 1}), ("GRU", "reverse", {})]
    model, params = _recurrent_model(nodes, with_state=True, hidden=hidden, input_size=7, weight_scale=0.0625)
    session = shapeshift.InferenceSession(model, backend="native", num_threads=threads)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in _feeds(model, params, 0, bindings=((1, 1), (1, 3))):
        want = reference.run(None, feed)
        first = session.run(None, feed)
        for got in [first] + [session.run(None, feed) for _ in range(4)]:
            for g, f, w in zip(got, first, want):
                np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)
                np.testing.assert_array_equal(g, f)


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("threads", [1, 2])
def test_batch_rows_on_two_threads(threads, layout):
    """Small hidden sizes (R within half of L2) over many steps: at 2 threads each thread
    runs every step for its own batch rows (SS_RECUR_ROWS), no barrier between steps. Odd
    batches (rows split 1 + 2, 4 + 5), rows whose sequence ends early, every kind and
    direction (a bidirectional node's directions run on a thread each instead), odd-length
    projection chunks (201 steps of batch 3, 71 of batch 9; several chunks each on a 512 KiB
    L2), a ragged hidden size, peepholes and initial states."""
    hidden, input_size = 44, 5
    # Every kind's sequence crosses SEQ_PAR_MIN at both bindings (RNN, 1 gate, the least work).
    assert min(201 * 3, 71 * 9) * hidden * hidden >= rnn_step.SEQ_PAR_MIN
    model, params = _recurrent_model(EVERY_KIND, layout, with_state=True, with_lens=True, hidden=hidden,
                                     input_size=input_size, peepholes=True, weight_scale=0.25)
    session = shapeshift.InferenceSession(model, backend="native", num_threads=threads)
    reference = ort.InferenceSession((_layout0_twin(model) if layout else model).SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for feed in _feeds(model, params, layout, bindings=((201, 3), (71, 9))):
        want = reference.run(None, _to_layout0(feed) if layout else feed)
        if layout:
            want = [_from_layout0(n, w) for n, w in zip(names, want)]
        for name, got, expected in zip(names, session.run(None, feed), want):
            np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("layout", [0, 1])
def test_avx2_only_build(layout, tmp_path):
    """The x86-64-v3 artifact (ymm blocks, 16-register row tiles) against onnxruntime, every
    kind and direction at ragged sizes, R packed at load."""
    model, params = _recurrent_model(EVERY_KIND, layout, with_state=True, with_lens=True, hidden=19, input_size=5,
                                     peepholes=True)
    artifact = shapeshift.compile(model, tmp_path / "v3.ssa", target="x86-64-v3")
    assert "-march=x86-64-v3" in artifact.header["flags"]
    session = shapeshift.InferenceSession(str(artifact.path))
    reference = ort.InferenceSession((_layout0_twin(model) if layout else model).SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for feed in _feeds(model, params, layout, bindings=((1, 1), (6, 5), (3, 9))):
        want = reference.run(None, _to_layout0(feed) if layout else feed)
        if layout:
            want = [_from_layout0(n, w) for n, w in zip(names, want)]
        for name, got, expected in zip(names, session.run(None, feed), want):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("layout", [0, 1])
def test_projection_in_chunks(layout):
    """A sequence whose input projection outgrows the chunk computed ahead (a quarter of
    L2): several chunks per direction, forward and reverse, on W packed at load."""
    nodes = [("LSTM", "bidirectional", {}), ("GRU", "bidirectional", {"linear_before_reset": 1}),
             ("GRU", "reverse", {})]
    model, params = _recurrent_model(nodes, layout, with_state=True, with_lens=True, hidden=64, input_size=8,
                                     weight_scale=0.125)
    _check(model, params, layout, bindings=((300, 9), (5, 2)))
