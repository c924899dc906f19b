"""The error hierarchy every user-facing failure goes through.

Each error carries a message that names the thing at fault (file, node, input,
symbol) so the CLI can print one line and exit without a traceback.
"""


class ShapeshiftError(Exception):
    """Base class of every error shapeshift raises on purpose."""


class ModelLoadError(ShapeshiftError):
    """The model file or bytes could not be read or parsed as ONNX."""


class InvalidModelError(ModelLoadError):
    """The model parses but breaks the ONNX spec (frontend/validate.py): a node with the wrong
    number of inputs, an attribute of the wrong type, negative pads, ...; the message names
    the node and the attribute or input at fault."""


class UnsupportedModelError(ShapeshiftError):
    """The model uses ops, domains or opsets shapeshift does not handle."""


class InvalidGraphError(ShapeshiftError):
    """The graph breaks an invariant (def-use, topological order, types)."""


class ShapeInferenceError(ShapeshiftError):
    """A node's inputs contradict its type rule (e.g. incompatible broadcast)."""


class ExecutionError(ShapeshiftError):
    """A node failed while being evaluated."""


class RunStoppedError(ExecutionError):
    """A run stopped by its RunOptions: past its deadline, or terminated from another thread."""


class InputError(ShapeshiftError):
    """A feed given to InferenceSession.run is wrong; subclasses say how."""


class MissingInputError(InputError):
    """A required graph input was not fed."""


class UnknownInputError(InputError):
    """A feed names no graph input."""


class InputDtypeError(InputError):
    """A feed has the wrong element type."""


class InputRankError(InputError):
    """A feed has the wrong number of dimensions."""


class InputShapeError(InputError):
    """A feed's static dimension does not match the model."""


class SymbolConflictError(InputError):
    """One symbolic dimension received two different values across the feeds."""


class SymbolRangeError(InputError):
    """A symbolic dimension's value lies outside its declared range."""


class UnknownOutputError(ShapeshiftError):
    """An output name asked of run() is not a graph output."""


class ExpressionError(ShapeshiftError):
    """A symbolic expression could not be parsed or evaluated."""


# Building generated C code (shapeshift/codegen/build.py).


class CompilerNotFoundError(ShapeshiftError):
    """No C compiler could be found (names what was tried: $SHAPESHIFT_CC, cc, gcc)."""


class CompileError(ShapeshiftError):
    """The C compiler rejected generated code; the message names the kept source file."""


# Compiled artifacts (shapeshift/runtime/artifact.py).


class ArtifactError(ShapeshiftError):
    """A compiled artifact cannot be written or used here (corrupt, another shapeshift version,
    a CPU feature this machine lacks, ...); the message names the file."""
