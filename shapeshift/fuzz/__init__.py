"""A fuzzer for shapeshift: structure-aware mutations of real and built models, each run
on the simplify path and both backends in worker processes with memory and time limits.

* ``seeds.py``: the models mutated, each with a feed;
* ``mutate.py``: the mutations, reproducible from (seed, index);
* ``runner.py``: the workers, the limits and the outcome classes;
* ``campaign.py``: ``python -m shapeshift.fuzz`` (``make fuzz N=10000``) and its report,
  bench/results/fuzz.md; ``--reproduce SEED:INDEX`` replays one mutant.

tests/test_fuzz.py runs a few hundred mutants with a fixed seed.
"""
