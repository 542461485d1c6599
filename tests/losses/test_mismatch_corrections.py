"""Masking corrections for a sampler/learner mismatch (docs/methods.md, "Mismatch corrections
(MIS, IcePop)"): hand-derived weights and masks, and a NumPy loop reference of the rules."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from rl4agents.losses import mismatch

LN = math.log
NAN = float("nan")


def _inputs():
    # learner - sampler = [ln 1.5, ln 3, -ln 2, NaN (off the mask)] in row 0, [-30] in row 1.
    sampler = np.zeros((2, 4), np.float32)
    learner = np.array([[LN(1.5), LN(3.0), -LN(2.0), NAN], [-30.0, 0, 0, 0]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
    return learner, sampler, mask


def test_mis_token__hand():
    learner, sampler, mask = _inputs()
    w, keep = mismatch.mis_token(learner, sampler, mask)  # band [0, 2]
    # ratio 3 > 2 leaves; e^-20 (clamped from e^-30) stays with no lower bound.
    np.testing.assert_array_equal(keep, [[1, 0, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_allclose(w, [[1.5, 0, 0.5, 0], [math.exp(-20.0), 0, 0, 0]], rtol=1e-6)
    w, keep = mismatch.mis_token(learner, sampler, mask, low=0.6, high=3.0)
    np.testing.assert_array_equal(keep, [[1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(w, [[1.5, 3.0, 0, 0], [0, 0, 0, 0]], rtol=1e-6)


def test_icepop__hand_two_sided_band():
    learner, sampler, mask = _inputs()
    w, keep = mismatch.icepop(learner, sampler, mask)  # [alpha, beta] = [0.5, 5], inclusive
    np.testing.assert_array_equal(keep, [[1, 1, 1, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(w, [[1.5, 3.0, 0.5, 0], [0, 0, 0, 0]], rtol=1e-6)


def test_mis_sequence__hand_keeps_or_drops_whole_rows():
    learner, sampler, mask = _inputs()
    # Row 0's ratio is the product 1.5 * 3 * 0.5 = 2.25 > 2: the whole row leaves.
    w, keep = mismatch.mis_sequence(learner, sampler, mask)
    np.testing.assert_array_equal(keep, [[0, 0, 0, 0], [1, 0, 0, 0]])
    w, keep = mismatch.mis_sequence(learner, sampler, mask, high=3.0)
    np.testing.assert_array_equal(keep, [[1, 1, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_allclose(w[0], [2.25, 2.25, 2.25, 0], rtol=1e-6)
    w, keep = mismatch.mis_sequence(learner, sampler, mask, low=0.5, high=3.0)
    np.testing.assert_array_equal(keep[1], [0, 0, 0, 0])  # e^-20 < 0.5


def _loop(learner, sampler, mask, low, high, sequence):
    w = np.zeros(learner.shape)
    keep = np.zeros(learner.shape, bool)
    for i in range(learner.shape[0]):
        idx = np.nonzero(mask[i])[0]
        row = sum(float(learner[i, t] - sampler[i, t]) for t in idx)
        for t in idx:
            d = row if sequence else float(learner[i, t] - sampler[i, t])
            r = math.exp(min(max(d, -20.0), 20.0))
            if low <= r <= high:
                w[i, t], keep[i, t] = r, True
    return w, keep


@pytest.mark.parametrize(
    "name, band",
    [
        ("mis_token", (0.0, 2.0)),
        ("mis_token", (0.8, 1.2)),
        ("mis_sequence", (0.3, 1.5)),
        ("icepop", (0.5, 5.0)),
    ],
)
def test_corrections__match_loop_reference_and_carry_no_gradient(name, band):
    rng = np.random.default_rng(5)
    sampler = -np.abs(rng.normal(size=(6, 7))).astype(np.float32)
    learner = (sampler + rng.normal(scale=0.9, size=(6, 7))).astype(np.float32)
    mask = rng.random((6, 7)) < 0.6
    fn = mismatch.get(name)
    w, keep = fn(learner, sampler, mask, low=band[0], high=band[1])
    want_w, want_keep = _loop(learner, sampler, mask, *band, sequence=name == "mis_sequence")
    np.testing.assert_array_equal(np.asarray(keep), want_keep)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-7)
    assert 0 < want_keep.sum() < mask.sum()  # the band cuts somewhere: the case is not trivial
    grad = jax.grad(lambda lp: fn(lp, sampler, mask, low=band[0], high=band[1])[0].sum())(learner)
    assert not np.any(np.asarray(grad))


def test_registry__names_defaults_and_bad_bands():
    assert mismatch.names() == ["icepop", "m2po", "mis_sequence", "mis_token"]
    assert mismatch.defaults("icepop") == {"low": 0.5, "high": 5.0}
    assert mismatch.defaults("mis_token") == {"low": 0.0, "high": 2.0}
    with pytest.raises(ValueError, match=r"mismatch\.icepop: low=1\.5; allowed: in \[0, 1\]"):
        mismatch.validate("icepop", {"low": 1.5})
    with pytest.raises(ValueError, match=r"mismatch\.mis_token: high=0\.9; allowed: >= 1"):
        mismatch.validate("mis_token", {"high": 0.9})
    with pytest.raises(ValueError, match=r"\['cap'\].*'mis_token'.*\['low', 'high'\]"):
        mismatch.validate("mis_token", {"cap": 2.0})
    with pytest.raises(KeyError, match="known: \\['icepop'"):
        mismatch.get("tis")


def test_kept_metrics__share_of_action_tokens():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
    keep = np.array([[1, 0, 1, 0], [0, 0, 0, 0]], bool)
    np.testing.assert_allclose(mismatch.kept_metrics(keep, mask)["mismatch/kept_frac"], 0.5)
    assert float(mismatch.kept_metrics(keep, np.zeros_like(mask))["mismatch/kept_frac"]) == 1.0
