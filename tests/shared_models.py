"""Valid feeds for the models in ../shared/models (see its MANIFEST.md).

``feeds(name, size)`` gives the feed for the model's size index 0, 1 or 2: each
dynamic dimension takes a different value at each index, so three feeds cover
three values of every dynamic dim.
"""

from __future__ import annotations

import numpy as np

BATCH = (1, 2, 3)


def _tokens(rng, batch: int, seq: int) -> np.ndarray:
    return rng.integers(0, 1000, (batch, seq)).astype(np.int64)


def _bert(rng, i):
    batch, seq = BATCH[i], (3, 8, 17)[i]
    return {"input_ids": _tokens(rng, batch, seq), "attention_mask": np.ones((batch, seq), np.int64),
            "token_type_ids": np.zeros((batch, seq), np.int64)}


def _distilbert(rng, i):
    batch, seq = BATCH[i], (3, 8, 17)[i]
    return {"input_ids": _tokens(rng, batch, seq), "attention_mask": np.ones((batch, seq), np.int64)}


def _gpt2(rng, i):
    batch, seq, past = BATCH[i], (1, 4, 7)[i], (1, 5, 9)[i]
    feed = {"input_ids": _tokens(rng, batch, seq), "attention_mask": np.ones((batch, past + seq), np.int64)}
    for layer in range(12):
        for kind in ("key", "value"):
            feed[f"past_key_values.{layer}.{kind}"] = rng.standard_normal((batch, 2, past, 32)).astype(np.float32)
    return feed


def _image(rng, shape):
    return rng.random(shape).astype(np.float32)


def _ppocr(rng, i):
    return {"x": _image(rng, (BATCH[i], 3, (32, 64, 96)[i], (64, 96, 32)[i]))}


def _silero(rng, i):
    batch = BATCH[i]
    return {"input": rng.standard_normal((batch, 576)).astype(np.float32) * 0.1,
            "state": np.zeros((2, batch, 128), np.float32), "sr": np.array(16000, np.int64)}


def _ssdlite(rng, i):
    return {"images": _image(rng, (3, (96, 128, 160)[i], (128, 96, 112)[i]))}


def _vit(rng, i):
    return {"pixel_values": _image(rng, (BATCH[i], 3, (32, 48, 64)[i], (48, 64, 32)[i]))}


def _whisper(rng, i):
    return {"input_features": rng.standard_normal((BATCH[i], 80, 3000)).astype(np.float32)}


def _yolo(rng, i):
    return {"images": _image(rng, (BATCH[i], 3, (64, 96, 128)[i], (96, 64, 128)[i]))}


FEEDS = {
    "bert.ts.onnx": _bert,
    "distilbert.dynamo.onnx": _distilbert,
    "gpt2_past.ts.onnx": _gpt2,
    "ppocr_det.det_infer.onnx": _ppocr,
    "silero_vad.onnx": _silero,
    "ssdlite320_mobilenet_v3_large.ts.onnx": _ssdlite,
    "vit_interp.ts.onnx": _vit,
    "whisper_encoder.dynamo.onnx": _whisper,
    "yolov8n_nudenet.320n.onnx": _yolo,
}

#: The symbolic input shapes each model declares, as `shapeshift info` must show them.
DECLARED_INPUTS = {
    "bert.ts.onnx": {"input_ids": "int64[batch, seq]", "attention_mask": "int64[batch, seq]"},
    "distilbert.dynamo.onnx": {"input_ids": "int64[batch, seq]"},
    "gpt2_past.ts.onnx": {"attention_mask": "int64[batch, past_seq+seq]",
                          "past_key_values.0.key": "float[batch, 2, past_seq, 32]"},
    "ppocr_det.det_infer.onnx": {"x": "float[p2o.DynamicDimension.0, 3, p2o.DynamicDimension.1, p2o.DynamicDimension.2]"},
    "silero_vad.onnx": {"input": "float[?, ?]", "sr": "int64[]"},
    "ssdlite320_mobilenet_v3_large.ts.onnx": {"images": "float[3, height, width]"},
    "vit_interp.ts.onnx": {"pixel_values": "float[batch, 3, height, width]"},
    "whisper_encoder.dynamo.onnx": {"input_features": "float[batch, 80, 3000]"},
    "yolov8n_nudenet.320n.onnx": {"images": "float[batch, 3, height, width]"},
}


def feeds(name: str, index: int, seed: int = 0) -> dict[str, np.ndarray]:
    return FEEDS[name](np.random.default_rng(seed + index), index)


def assert_same_outputs(original, candidate, name: str, shapes: int = 3) -> None:
    """Two onnxruntime sessions of one model (the original and a rewrite of it) give the
    same outputs at the model's first ``shapes`` feeds: floats within 1e-4 relative (and
    1e-5 of the output's largest magnitude), everything else exactly."""
    for index in range(shapes):
        feed = feeds(name, index)
        for want, got in zip(original.run(None, feed), candidate.run(None, feed)):
            assert want.shape == got.shape and want.dtype == got.dtype
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max(initial=0))))
            else:
                np.testing.assert_array_equal(got, want)
