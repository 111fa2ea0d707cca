"""Truncation strategies, sliding windows over a document far beyond 512 tokens, aggregation and stitching."""

from __future__ import annotations

import numpy as np
import pytest

from bertpipe.lib.training import windows as W
from tests.synthetic import FILLER


@pytest.fixture(scope="module")
def tok(zh_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(zh_tokenizer_dir))


@pytest.fixture(scope="module")
def long_doc() -> str:
    # ~3000 pieces: Chinese characters, English words, digits, emoji and full-width letters mixed.
    parts = []
    for i in range(600):
        parts.append(FILLER[i % len(FILLER)] * 3 + f"word{i} ２０{i % 10}😀")
    return "".join(parts)


@pytest.mark.parametrize("n, size, stride", [(0, 10, 5), (1, 10, 5), (10, 10, 5), (11, 10, 5), (3000, 510, 128),
                                             (3000, 510, 510), (100, 7, 50), (37, 8, 3)])
def test_windows_cover_every_piece_in_order(n, size, stride):
    ws = W.windows(n, size, stride)
    covered = set()
    for a, b in ws:
        assert 0 <= a <= b <= n and b - a <= size
        covered.update(range(a, b))
    assert covered == set(range(n))
    assert ws[-1][1] == n and all(x[0] < y[0] for x, y in zip(ws, ws[1:]))


def test_long_document_windows_cover_every_token(tok, long_doc):
    (pc,) = W.encode_pieces(tok, [long_doc])
    assert len(pc.ids) > 2000  # much longer than 512
    budget = 512 - W.n_specials(tok)
    ws = W.windows(len(pc.ids), budget, 128)
    rebuilt = {}
    for a, b in ws:
        window_ids = W.with_specials(tok, pc.ids[a:b])
        assert len(window_ids) <= 512
        assert window_ids[0] == tok.cls_token_id and window_ids[-1] == tok.sep_token_id
        rebuilt.update(zip(range(a, b), window_ids[1:-1]))
    assert [rebuilt[i] for i in range(len(pc.ids))] == pc.ids
    # offsets point back into the original text for every piece
    assert all(0 <= s < e <= len(long_doc) for s, e in pc.offsets)


@pytest.mark.parametrize("strategy", ["head", "tail", "head_tail"])
@pytest.mark.parametrize("n, budget", [(5, 10), (1000, 254), (255, 254)])
def test_truncation_strategies(strategy, n, budget):
    keep = W.truncate(n, budget, strategy, head_tokens=64)
    assert len(keep) == min(n, budget) and keep == sorted(set(keep))
    if n > budget:
        if strategy == "head":
            assert keep == list(range(budget))
        elif strategy == "tail":
            assert keep == list(range(n - budget, n))
        else:
            assert keep[:64] == list(range(64)) and keep[64:] == list(range(n - budget + 64, n))


def test_aggregate_mean_and_vote():
    rows = np.array([[2.0, 0.0, 0.0], [0.0, 0.1, 0.0], [0.0, 0.2, 0.0]])
    assert W.aggregate(rows, "mean").argmax() == 0  # one confident window outweighs two unsure ones
    assert W.aggregate(rows, "vote").argmax() == 1  # but two windows out-vote one
    assert np.allclose(W.aggregate(rows[:1], "vote"), rows[0])


def test_stitch_takes_each_piece_from_its_most_central_window():
    n, ws = 20, W.windows(20, 8, 4)
    rows = [np.full((b - a, 1), float(k)) for k, (a, b) in enumerate(ws)]
    out = W.stitch(n, ws, rows)[:, 0]
    for i in range(n):
        ctx = [(min(i - a, b - 1 - i), -k) for k, (a, b) in enumerate(ws) if a <= i < b]
        assert out[i] == -max(ctx)[1] or min(i - ws[int(out[i])][0], ws[int(out[i])][1] - 1 - i) == max(ctx)[0]
    with pytest.raises(ValueError):
        W.stitch(10, [(0, 5)], [np.zeros((5, 1))])
