"""The fuzzer (shapeshift/fuzz): mutants reproduce from (seed, index), every mutation
applies to every seed model, and a fixed-seed campaign of a few hundred mutants of the
built seeds ends with no crash, no hang and no exception other than a ShapeshiftError
on simplify and both backends. ``make fuzz N=10000`` runs the long campaign."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from shapeshift.fuzz import mutate, runner
from shapeshift.fuzz.campaign import report
from shapeshift.fuzz.seeds import seeds

#: The CI campaign: fixed, so that a failure here reproduces with
#: ``python -m shapeshift.fuzz --no-shared --reproduce 2026:INDEX``.
CI_SEED = 2026
CI_MUTANTS = 500


def test_a_mutant_reproduces_from_its_seed_and_index():
    built = seeds(shared=False)
    for index in range(30):
        a, b = mutate.mutant(7, index, built), mutate.mutant(7, index, built)
        assert a.model.SerializeToString() == b.model.SerializeToString()
        assert a.mutations == b.mutations and a.feed.keys() == b.feed.keys()
        for name in a.feed:
            np.testing.assert_array_equal(a.feed[name], b.feed[name])
    assert len({mutate.mutant(7, i, built).model.SerializeToString() for i in range(30)}) > 25


@pytest.mark.parametrize("mutation", mutate.GRAPH_MUTATIONS + mutate.MODEL_MUTATIONS, ids=lambda f: f.__name__)
def test_every_mutation_applies_to_the_built_seeds(mutation):
    applied = 0
    for seed in seeds(shared=False):
        for k in range(5):
            model = type(seed.model)()
            model.CopyFrom(seed.model)
            text = mutation(model, random.Random(k), "main", model.graph)
            if text:
                applied += 1
                model.SerializeToString()
    assert applied, f"{mutation.__name__} applied to no seed"


def test_mutants_take_their_feed_from_the_declared_inputs():
    m = next(m for m in (mutate.mutant(3, i, seeds(shared=False)) for i in range(200))
             if m.seed_model == "conv_net" and not m.mutations[0].startswith(("dim", "rank", "elem_type", "graph_io")))
    assert set(m.feed) == {"x"} and m.feed["x"].shape == (2, 3, 12, 10)


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
def test_ci_campaign_has_no_crash_hang_or_unexpected_exception(build_cache):
    results = runner.run(CI_SEED, CI_MUTANTS, jobs=2, use_shared=False, time_limit=60.0,
                         cache_dir=build_cache)
    assert sorted(results) == list(range(CI_MUTANTS))
    table = runner.counts(results)
    bad = {(path, cls): n for path, row in table.items() for cls, n in row.items() if cls in runner.BAD and n}
    assert not bad, report(results, CI_SEED, 0.0, 2, False, 60.0, runner.MEMORY_LIMIT, shared=False)
    # The mutants reach every path: not all refused at import.
    for path in runner.PATHS:
        assert table[path]["ok"] > CI_MUTANTS // 5, table
