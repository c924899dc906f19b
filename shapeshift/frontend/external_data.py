"""Writing a model with its tensors in an external data file, streaming what is already
in one.

A model over protobuf's 2 GiB limit is read with its external data left in its file
(``read_model_sized(path, load_external=False)``), so the tensors simplify leaves
alone are references to the input's data file, never bytes in memory.  Writing the
result copies each such tensor from that file into the output's data file, file to
file (``os.copy_file_range``: nothing passes through this process's memory), and
moves each tensor held in memory (those simplify made) into it too, one at a time.
``onnx.save(..., save_as_external_data=True)`` could do neither: it needs every
tensor's bytes in the proto.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
from onnx import external_data_helper

#: Tensors held in memory with at least this many bytes go to the data file (onnx.save's default).
SIZE_THRESHOLD = 1024
#: Each tensor starts at a multiple of this in the data file (what onnx's writer aligns to).
ALIGNMENT = 4096
_CHUNK = 64 << 20


def all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The initializers and tensor attributes of ``graph`` and of its bodies."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for body in attr.graphs:
                    yield from all_tensors(body)


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def nbytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a tensor's contents, from its type and dims (reading ``raw_data`` would
    copy it out of the proto); 0 for a type without a fixed width (strings)."""
    if is_external(tensor):
        length = external_data_helper.ExternalDataInfo(tensor).length
        if length:
            return int(length)
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    return int(np.prod(tensor.dims[:], dtype=np.int64)) * itemsize


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(is_external(t) for t in all_tensors(model.graph))


def _set_location(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _copy_range(source: Path, offset: int, length: int, out) -> None:
    with open(source, "rb") as src:
        if src.seek(0, os.SEEK_END) < offset + length:
            raise ValueError(f"{source}: {length} bytes at offset {offset} run past the end of the file")
        done = 0
        copy_range = getattr(os, "copy_file_range", None)
        while copy_range is not None and done < length:
            try:
                copied = copy_range(src.fileno(), out.fileno(), length - done, offset + done, out.tell())
            except OSError:  # another file system, or not supported: copy through a buffer
                break
            if copied <= 0:
                break
            done += copied
            out.seek(copied, os.SEEK_CUR)
        src.seek(offset + done)
        while done < length:
            chunk = src.read(min(_CHUNK, length - done))
            if not chunk:
                raise ValueError(f"{source}: ends inside a tensor's data")
            out.write(chunk)
            done += len(chunk)


def save_with_external_data(model: onnx.ModelProto, path: Path, data_name: str, source_dir: Path) -> None:
    """Write ``model`` to ``path`` with its large tensors in ``path.parent / data_name``:
    tensors that refer to external data under ``source_dir`` are copied from there file
    to file; tensors held in memory of SIZE_THRESHOLD bytes or more are moved there.
    ``model`` is changed in place (its tensors then refer to the new file)."""
    with open(path.parent / data_name, "wb") as out:
        for tensor in all_tensors(model.graph):
            if is_external(tensor):
                info = external_data_helper.ExternalDataInfo(tensor)
                length = nbytes(tensor)
                source = source_dir / info.location
            elif tensor.HasField("raw_data") and nbytes(tensor) >= SIZE_THRESHOLD:
                source, length = None, 0
            else:
                continue
            offset = -(-out.tell() // ALIGNMENT) * ALIGNMENT
            out.seek(offset)
            if source is not None:
                _copy_range(source, int(info.offset or 0), length, out)
            else:
                length = out.write(tensor.raw_data)
                tensor.ClearField("raw_data")
            _set_location(tensor, data_name, offset, length)
    onnx.save(model, str(path))  # every large tensor is a reference now: a small file
