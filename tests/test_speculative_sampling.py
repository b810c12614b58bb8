"""Speculative sampling keeps the model's distribution
(docs/generation.md#speculative-decoding): at a fixed context whose
logits come from a speculative block, the next-token frequencies over
many seeds fit the model's probabilities (chi-square, p = 0.01), and
cannot be told from plain sampling's over other seeds. A rule that kept
drafts too eagerly (or too seldom) fails both."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gemma_cy.api import Model
from gemma_cy.tokenizers.greedy import GreedyTokenizer
from test_speculative import copier

Z_99 = 2.3263478740408408  # the standard normal's 0.99 quantile
RUNS = 1500
MIN_EXPECTED = 5.0  # bins expected fewer times than this are pooled


def chi2_critical(dof: int) -> float:
    """The chi-square distribution's 0.99 quantile (Wilson-Hilferty: within
    0.5% of the exact value from 3 degrees of freedom up)."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + Z_99 * math.sqrt(c)) ** 3


def pooled(expected: np.ndarray) -> np.ndarray:
    """Bin index per id: ids expected at least MIN_EXPECTED times keep
    their own bin, the rest share the last one."""
    big = expected >= MIN_EXPECTED
    bins = np.full(expected.shape, int(big.sum()), dtype=np.int64)
    bins[big] = np.arange(int(big.sum()))
    return bins


def goodness_of_fit(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(statistic, 0.99 critical value) of ``counts`` (per id) against ``probs``."""
    n = counts.sum()
    bins = pooled(probs * n)
    k = int(bins.max()) + 1
    obs = np.bincount(bins, weights=counts, minlength=k)
    exp = np.bincount(bins, weights=probs * n, minlength=k)
    return float(((obs - exp) ** 2 / exp).sum()), chi2_critical(k - 1)


def homogeneity(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(statistic, 0.99 critical value) of two samples' counts (per id) coming from one distribution."""
    total = a + b
    bins = pooled(total * min(a.sum(), b.sum()) / total.sum())
    k = int(bins.max()) + 1
    table = np.stack([np.bincount(bins, weights=x, minlength=k) for x in (a, b)])
    exp = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - exp) ** 2 / exp).sum()), chi2_critical(k - 1)


@pytest.fixture(scope="module")
def model(tiny, tiny_model_path):
    return Model(tiny, GreedyTokenizer.from_file(str(tiny_model_path) + ".tok"), "fast", 256)


def test_speculative_sampling_keeps_the_distribution(model):
    phrase = [11, 23, 35, 47]
    prompt = [model.tokenizer.bos_id] + phrase * 4
    push = copier(phrase, 0.0)  # the phrase's next id ties the best: drafted, kept about half the time
    kw = dict(max_tokens=3, temperature=1.0, min_p=0.0, terminate_on_eos=False, logits_processor=push)
    context = phrase[0]  # position 1 is counted where position 0 sampled this (a fixed context)
    vocab = model.config.vocab_size
    spec, plain = np.zeros(vocab), np.zeros(vocab)
    drafted = kept = 0
    for seed in range(RUNS):
        s = model.complete(prompt, seed=seed, speculative="lookup", **kw)
        p = model.complete(prompt, seed=RUNS + seed, **kw)  # other seeds: an independent sample
        drafted, kept = drafted + s.timing.drafted_tokens, kept + s.timing.accepted_tokens
        if s.ids[0] == context:
            spec[s.ids[1]] += 1
        if p.ids[0] == context:
            plain[p.ids[1]] += 1
    assert drafted > kept > 0 and spec.sum() > 400 and plain.sum() > 400  # drafts both kept and cut, there
    logits = push(prompt + [context], model.logits(prompt + [context]).astype(np.float64).copy())
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    for counts in (spec, plain):
        stat, critical = goodness_of_fit(counts, probs)
        assert stat < critical, (stat, critical)
    stat, critical = homogeneity(spec, plain)
    assert stat < critical, (stat, critical)


def test_seeded_speculative_runs_reproduce(model):
    prompt = [model.tokenizer.bos_id] + [11, 23, 35, 47] * 4
    kw = dict(max_tokens=20, temperature=1.0, min_p=0.0, terminate_on_eos=False, seed=7,
              logits_processor=copier([11, 23, 35, 47], 0.0))
    first = model.complete(prompt, speculative="lookup", **kw)
    assert model.complete(prompt, speculative="lookup", **kw).ids == first.ids == model.complete(prompt, **kw).ids
