"""The ``shapeshift`` command line: info, run, simplify, compile, tune.

Every failure the user can cause (a bad model, a bad input file, a wrong
feed) is a ShapeshiftError: it is printed as one line on stderr and the
command exits with status 2, never with a traceback.

Ctrl-C (SIGINT) prints one line and exits with 130 (128 + SIGINT, as a shell reports it),
whenever it comes: so this module imports nothing heavy at its top (nor does the package's
``__init__``), and everything else, numpy, onnx and the compiler's modules included, is
imported inside ``main``, where the interrupt is caught. Before, a Ctrl-C during the
second the imports take printed a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from ..errors import ShapeshiftError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class UsageError(ShapeshiftError):
    """A command-line argument could not be understood."""


def parse_range(text: str) -> tuple[str, tuple[int, int]]:
    """``seq=1:512`` -> ("seq", (1, 512)); ``seq=8`` fixes the symbol to 8."""
    from ..frontend.onnx_import import MAX_DIM

    name, sep, bounds = text.partition("=")
    lo_text, colon, hi_text = bounds.partition(":")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if colon else lo
    except ValueError:
        raise UsageError(f"--dynamic {text!r}: expected SYMBOL=LO:HI with integer bounds") from None
    if not sep or not name or lo > hi or lo < 0:
        raise UsageError(f"--dynamic {text!r}: expected SYMBOL=LO:HI with 0 <= LO <= HI")
    if hi > MAX_DIM:
        raise UsageError(f"--dynamic {text!r}: {hi} is past the largest dim there is room for ({MAX_DIM})")
    return name, (lo, hi)


def _seed(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # Here, not at the top: see the module's docstring.
    from ..passes.simplify.engine import STRATEGIES
    from ..runtime.session import BACKENDS
    from ..tune.search import MEASURE_CAP
    from .commands import cmd_compile, cmd_info, cmd_run
    from .simplify_cmd import cmd_simplify
    from .tune_cmd import cmd_tune

    parser = argparse.ArgumentParser(prog="shapeshift", description="A compiler for dynamic-shape neural networks.")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="describe a model: opset, inputs, outputs, op histogram "
                                       "(or, with --machine, this machine's target description)")
    info.add_argument("model", nargs="?")
    info.add_argument("--machine", action="store_true",
                      help="print the target description: ISA, registers, caches, measured FMA peak and "
                           "latency per width (measured once per CPU, cached), default GEMM tile")
    info.add_argument("--dynamic", action="append", default=[], metavar="SYM=LO:HI")
    info.add_argument("--backend", choices=BACKENDS, default="reference",
                      help="native: also count the nodes that would run as C kernels and those left to fallback")
    info.set_defaults(handler=cmd_info)

    run = sub.add_parser("run", help="run a model on given or random inputs")
    run.add_argument("model")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    run.add_argument("--random", action="store_true", help="feed random inputs for any input not given")
    run.add_argument("--dynamic", action="append", default=[], metavar="SYM=LO:HI")
    run.add_argument("--seed", type=_seed, default=0)
    run.add_argument("--save", metavar="DIR", help="write each output as DIR/NAME.npy")
    run.add_argument("--backend", choices=BACKENDS, default=None,
                     help="native (the default): the model lowered to C, built once with the system compiler "
                          "and cached; reference: the NumPy evaluator, no compiler needed")
    run.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="run N times; report the last run's time (and profile all runs but the first)")
    run.add_argument("--profile", action="store_true",
                     help="native: time every step and print where the runs spent their time")
    run.set_defaults(handler=cmd_run)

    simplify = sub.add_parser("simplify", help="fold constants and make dynamic ops static; write OUT")
    simplify.add_argument("input", metavar="IN")
    simplify.add_argument("output", metavar="OUT")
    simplify.add_argument("--dynamic", action="append", default=[], metavar="SYM=LO:HI")
    simplify.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...")
    simplify.add_argument("--check", type=int, default=0, metavar="N",
                          help="compare outputs with onnxruntime on N random inputs")
    simplify.add_argument("--strategy", choices=STRATEGIES, default="incremental")
    simplify.add_argument("--no-merge-matmuls", dest="merge_matmuls", action="store_false",
                          help="keep MatMuls that share their input apart (default: merged into one MatMul "
                               "and a Split, with their bias Adds)")
    simplify.set_defaults(handler=cmd_simplify)

    compile_ = sub.add_parser("compile", help="compile a model for the native backend into one file OUT "
                                              "that `run` and InferenceSession load without a C compiler")
    compile_.add_argument("model")
    compile_.add_argument("-o", "--output", required=True, metavar="OUT")
    compile_.add_argument("--dynamic", action="append", default=[], metavar="SYM=LO:HI")
    compile_.add_argument("--db", default=None, metavar="FILE",
                          help="use the tuned GEMM kernels of this `shapeshift tune` database")
    compile_.add_argument("--threads", type=int, default=None,
                          help="with --db: use the records tuned for this many threads (default: every core)")
    compile_.add_argument("--target", default="native", metavar="native|x86-64-v3|x86-64-v4",
                          help="the CPUs the artifact must run on: native (this machine, every feature it has; "
                               "the default) or a psABI level (x86-64-v3: any AVX2 machine)")
    compile_.set_defaults(handler=cmd_compile)

    tune = sub.add_parser(
        "tune", help="auto-schedule a model's GEMMs (constant weights) and convs for whole ranges of their "
                     "shapes: a few kernels per task and a decision tree that picks one per call",
        description="Tune the dense float32 GEMMs C[M,N] = A[M,K] x B[K,N] (B a constant, prepacked weight) of "
                    "MODEL, one task per weight shape, M ranging over what the --dynamic ranges allow; or one "
                    "GEMM given by --gemm K N. Shape-generic kernel schedules are measured at sampled M values, "
                    "a cost model learns the rest, a few kernels and a decision tree over M are kept (printed as "
                    "C with --show). Convs are tuned too (dense ones, and in a net run in the blocked layout its "
                    "dense and depthwise ones), one task per class (kernel, strides, dilations) over its "
                    "instances; with a dynamic image size (--dynamic h=96:960 --dynamic w=96:960) at sampled "
                    "sizes, the tree dispatching any size. `compile --db` and InferenceSession(..., "
                    "tuning_db=) use the records. "
                    "See docs/tune.md.")
    tune.add_argument("model", nargs="?", default=None, metavar="MODEL", help="an ONNX model")
    tune.add_argument("--gemm", nargs=2, type=int, default=None, metavar=("K", "N"),
                      help="instead of a model: C[M,N] = A[M,K] x B[K,N], B a constant weight (prepacked)")
    tune.add_argument("--dynamic", action="append", default=[], metavar="SYM=LO:HI",
                      help="a dynamic dim's range (with --gemm: the range of M)")
    tune.add_argument("--db", default="shapeshift_tuning.db", metavar="FILE",
                      help="SQLite tuning database; measurements in it are reused (default: %(default)s)")
    tune.add_argument("--trials", type=int, default=32,
                      help="candidates to measure, per task (default: %(default)s)")
    tune.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                      help="wall time for the whole run, shared by the tasks (and, on a cluster of several CPU "
                           "models, by the models in turn)")
    tune.add_argument("--cluster", default=None, metavar="ADDRESS",
                      help="measure on a Ray cluster: a Ray address, 'auto' (RAY_ADDRESS) or local[:N] (an "
                           "in-process Ray with N CPUs); a cluster of several CPU models is tuned once per "
                           "model, on its own nodes, each recorded for its model; needs pip install "
                           "'shapeshift[cluster]'")
    tune.add_argument("--strategy", choices=("dietcode", "per-shape", "pad-max"), default="dietcode")
    tune.add_argument("--threads", type=int, default=1, help="threads the kernels run on (default: %(default)s)")
    tune.add_argument("--max-kernels", type=int, default=8,
                      help="kernels kept per task (a group's: for the whole model; default: %(default)s)")
    grouping = tune.add_mutually_exclusive_group()
    grouping.add_argument("--group", dest="group", action="store_true", default=None,
                          help="tune the model's dense GEMMs (every weight shape, every M) as one task, and each "
                               "class of its convs as one task: at most --max-kernels kernels each, a tree on "
                               "their dims choosing per call (the GEMMs' default when the model has no dynamic "
                               "dim; the convs' always)")
    grouping.add_argument("--no-group", dest="group", action="store_false",
                          help="tune each weight shape and each conv instance alone (the per-instance baseline; "
                               "the GEMMs' default for a model with dynamic dims)")
    tune.add_argument("--measure-cap", type=int, default=MEASURE_CAP, metavar="M",
                      help="dietcode measures no M (or T) above this and dispatches the kernel best there to "
                           "the larger ones, whose speed no longer depends on M; 0: measure the whole range "
                           "(default: %(default)s)")
    tune.add_argument("--measure", choices=("cold", "warm"), default=None,
                      help="measure with B read from DRAM on every call (cold, as a model's weights; the default "
                           "with MODEL; a conv: every call after a flush of the caches) or staying in cache (warm; "
                           "the default with --gemm)")
    tune.add_argument("--shape-weights", default=None, metavar="SYM=FILE",
                      help="how often the dim SYM takes each value (FILE: 'VALUE WEIGHT' lines, e.g. a histogram "
                           "of production sequence lengths): the heaviest values (and both ends of the range) are "
                           "the sampled shapes, and the search and the kernel set weigh each by its weight")
    tune.add_argument("--any-layout", action="store_true",
                      help="let the kernel set mix packed-B layouts (one packed copy of the weight per layout)")
    tune.add_argument("--cache-dir", default=None, help="compiled candidates (default: FILE.cache next to --db)")
    tune.add_argument("--show", action="store_true", help="print the kernels and the dispatch tree as C")
    tune.add_argument("--plot", default=None, metavar="FILE.png",
                      help="plot GFLOPS against M per chosen kernel and for the dispatcher (needs matplotlib)")
    tune.set_defaults(handler=cmd_tune)
    return parser


class _PipeSafeOutput:
    """stdout that drops what it cannot write once its reader has gone (``| head``), so
    that the command goes on and finishes its work (writes its output file) instead of
    dying on a BrokenPipeError."""

    def __init__(self, stream):
        self._stream = stream
        self._closed = False

    def write(self, text: str) -> int:
        if not self._closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._closed = True
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._closed = True

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before a command was known: while importing, say
        print("shapeshift: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    stdout = sys.stdout
    sys.stdout = _PipeSafeOutput(stdout)
    try:
        args.dynamic = dict(parse_range(t) for t in args.dynamic)
        return args.handler(args) or 0
    except ShapeshiftError as exc:
        print(f"shapeshift {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:  # a file that cannot be written or read: its name and the reason
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"shapeshift {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"shapeshift {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout.flush()
        sys.stdout = stdout


def _exit_from_module(code: int) -> None:
    """Exit ``python -m shapeshift.cli.main`` with ``code``. After a Ctrl-C, by os._exit: an
    interrupt that lands while the code of a string runs (the imports' dataclasses and
    namedtuples build their methods so) makes CPython remember it as unhandled even once
    ``main`` has caught it, and under ``-m`` it then exits by SIGINT, not 130 (1 run in 40
    under load, the line already printed). The ``shapeshift`` script is a file CPython runs
    otherwise: it exits 130 either way."""
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit_from_module(main())
