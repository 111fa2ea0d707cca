"""Dedup: exact duplicates (hash of the normalised text) and near duplicates (MinHash LSH over character n-grams).

The MinHash is vectorised numpy rather than a per-document ``datasketch.MinHash`` loop: all documents' n-gram
hashes come from one rolling hash over the concatenated code points, and each batch of n-grams is permuted by
multiply-shift hashing and reduced per document with ``np.minimum.reduceat``. bench/bench_prepare.py measures it
against the datasketch loop. LSH candidates are then checked against the true Jaccard of the n-gram sets, so every
reported pair really is above the threshold.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

_PRIME = np.uint64(0x100000001B3)  # FNV-64 prime: the rolling n-gram polynomial's base
_WS = re.compile(r"\s+")


def normal_form(text: str) -> str:
    """The text without whitespace, case-folded: what exact duplicates and task-text matches compare."""
    return _WS.sub("", text).casefold()


def exact_key(text: str) -> bytes:
    """Texts that differ only in whitespace or letter case share a key."""
    return hashlib.blake2b(normal_form(text).encode("utf-8"), digest_size=16).digest()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place: spreads the polynomial hash over all 64 bits."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def ngram_hashes(texts: Sequence[str], n: int, chunk_chars: int = 1 << 18) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every character n-gram of every text, concatenated, plus per-text offsets (len D+1).
    A text shorter than ``n`` contributes one hash of the whole text; an empty text contributes none.
    Texts are hashed in chunks of about ``chunk_chars`` characters, which bounds the temporary arrays."""
    lens = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    count = np.where(lens >= n, lens - n + 1, np.minimum(lens, 1))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    out = np.empty(offsets[-1], dtype=np.uint64)
    ends = np.cumsum(lens)
    lo = 0
    while lo < len(texts):
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + chunk_chars, side="right")))
        out[offsets[lo] : offsets[hi]] = _chunk_hashes(texts[lo:hi], lens[lo:hi], count[lo:hi], n)
        lo = hi
    return out, offsets


def _chunk_hashes(texts: Sequence[str], lens: np.ndarray, count: np.ndarray, n: int) -> np.ndarray:
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    total = int(starts[-1])
    if total == 0:
        return np.zeros(0, dtype=np.uint64)
    padded = np.zeros(total + n, dtype=np.uint64)
    padded[:total] = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
    padded[:total] += np.uint64(1)  # so that a code point never hashes like the zero padding
    # h[i] after k steps = hash of cps[i : i+k]; positions past the end read zeros and are never selected.
    h = np.zeros(total, dtype=np.uint64)
    short = np.flatnonzero((lens < n) & (lens > 0))
    short_h = np.zeros(len(short), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h *= _PRIME
            h += padded[k : k + total]
            if len(short):
                hit = lens[short] == k + 1
                short_h[hit] = h[starts[short[hit]]]
    # Valid n-gram starts are all positions but the last n-1 of each text (all of a short text's): mark those
    # tails with a difference array rather than building index ranges per text.
    tail = starts[:-1] + np.maximum(lens - n + 1, 0)
    delta = np.bincount(tail, minlength=total + 1) - np.bincount(starts[1:], minlength=total + 1)
    valid = np.cumsum(delta[:total]) == 0
    out = np.empty(int(count.sum()), dtype=np.uint64)
    mask_full = np.repeat(lens >= n, count)
    out[mask_full] = h[valid]
    out[~mask_full] = short_h
    with np.errstate(over="ignore"):
        return _mix(out)


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 1 << 63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd multipliers
    b = rng.integers(0, 1 << 63, size=num_perm, dtype=np.uint64)
    return a, b


def minhash_signatures(
    hashes: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int = 1, batch: int = 4096, progress=None
) -> np.ndarray:
    """(D, num_perm) uint32 MinHash signatures: min over a document's n-grams of ``(a*h + b) >> 32``.

    Work goes in batches of about ``batch`` n-grams (whole documents) laid out permutation-major, (num_perm, batch),
    so ``np.minimum.reduceat`` runs along contiguous rows; the high 32 bits are read through a uint32 view instead
    of a shift pass. The result is a transposed view of a (num_perm, D) array, whose bands are contiguous."""
    a, b = permutations(num_perm, seed)
    a, b = a[:, None], b[:, None]
    d = len(offsets) - 1
    sig = np.full((num_perm, d), np.iinfo(np.uint32).max, dtype=np.uint32)
    counts = np.diff(offsets)
    # Document boundaries that split the n-grams into batches of about `batch`.
    cut = np.searchsorted(offsets, np.arange(0, offsets[-1] + batch, batch), side="left")
    cut = np.unique(np.concatenate([[0], np.clip(cut, 0, d), [d]]))
    buf = np.empty((num_perm, 2 * batch), dtype=np.uint64)
    high = 1 if np.little_endian else 0  # index of the high uint32 half of each uint64
    with np.errstate(over="ignore"):
        for lo, hi in zip(cut[:-1], cut[1:]):
            docs = np.arange(lo, hi)
            docs = docs[counts[lo:hi] > 0]
            if len(docs) == 0:
                continue
            x = hashes[offsets[docs[0]] : offsets[docs[-1] + 1]]
            if len(x) > buf.shape[1]:
                buf = np.empty((num_perm, len(x)), dtype=np.uint64)
            w = buf[:, : len(x)]
            np.multiply(x[None, :], a, out=w)
            w += b
            top = w.view(np.uint32)[:, high::2]
            sig[:, docs] = np.minimum.reduceat(top, offsets[docs] - offsets[docs[0]], axis=1)
            if progress is not None:
                progress(int(hi - lo))
    return sig.T


@functools.lru_cache(maxsize=32)
def lsh_params(threshold: float, num_perm: int, recall_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) minimising the weighted false-positive and false-negative probability mass around
    ``threshold``: datasketch's ``_optimal_param`` criterion (so the baseline in bench/ can use the very same
    banding), computed here because importing datasketch (and scipy.integrate with it) costs every prepare worker
    ~45 MB. The integrands are polynomials of degree ``bands * rows <= num_perm``, which Gauss-Legendre quadrature
    with ``num_perm // 2 + 1`` nodes integrates exactly (tests/test_prepare_dedup.py checks the choice against
    datasketch's)."""
    x, w = np.polynomial.legendre.leggauss(num_perm // 2 + 1)
    lo_s, lo_w = threshold / 2 * (x + 1), w * threshold / 2  # nodes on [0, threshold]
    hi_s, hi_w = threshold + (1 - threshold) / 2 * (x + 1), w * (1 - threshold) / 2  # on [threshold, 1]
    best, opt = float("inf"), (0, 0)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = float(np.dot(lo_w, 1 - (1 - lo_s ** float(r)) ** float(b)))
            fn = float(np.dot(hi_w, (1 - hi_s ** float(r)) ** float(b)))
            err = fp * (1.0 - recall_weight) + fn * recall_weight
            if err < best:
                best, opt = err, (b, r)
    return opt


@functools.lru_cache(maxsize=256)
def _triu(z: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(z, 1)


def band_keys(sig: np.ndarray, bands: int, rows: int) -> Iterator[np.ndarray]:
    """One uint64 key per document for each LSH band: documents sharing a band's rows share its key."""
    rng = np.random.default_rng(12345)
    coef = rng.integers(1, 1 << 63, size=rows, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        for band in range(bands):
            block = sig[:, band * rows : (band + 1) * rows].astype(np.uint64)
            yield _mix((block * coef).sum(axis=1, dtype=np.uint64))


def lsh_candidates(keys: np.ndarray, max_bucket: int = 200) -> np.ndarray:
    """Pairs (i < j) sharing at least one band (``keys``: (bands, D) or an iterable of (D,) rows, see
    ``band_keys``). A bucket larger than ``max_bucket`` links its members to its first member only (a star), which
    keeps connectivity without a quadratic
    number of pairs."""
    found: list[np.ndarray] = []
    for key in keys:  # an array's rows, or any iterable of them (e.g. one band at a time from a memory map)
        d = len(key)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        brk = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        bstart = np.concatenate([[0], brk])
        bsize = np.diff(np.concatenate([bstart, [d]]))
        for s, z in zip(bstart[bsize > 1], bsize[bsize > 1]):
            members = np.sort(order[s : s + z])
            if z <= max_bucket:
                i, j = _triu(int(z))
                found.append(np.stack([members[i], members[j]], axis=1))
            else:
                found.append(np.stack([np.full(z - 1, members[0]), members[1:]], axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    pairs = np.concatenate(found).astype(np.int64)
    return np.unique(pairs, axis=0)


def cross_candidates(keys: np.ndarray, n_a: int) -> np.ndarray:
    """Pairs (i < n_a <= j) sharing at least one band: candidates between two sets only (columns [0, n_a) of
    ``keys`` and the rest), so the first set's own near-duplicates cost nothing."""
    found: list[np.ndarray] = []
    for key in keys:
        ka, kb = key[:n_a], key[n_a:]
        hit = np.flatnonzero(np.isin(ka, kb))
        if not len(hit):
            continue
        order = np.argsort(kb, kind="stable")
        sk = kb[order]
        for i in hit.tolist():
            lo, hi = np.searchsorted(sk, ka[i], "left"), np.searchsorted(sk, ka[i], "right")
            js = order[lo:hi] + n_a
            found.append(np.stack([np.full(len(js), i), js], axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(found).astype(np.int64), axis=0)


def jaccard(hashes: np.ndarray, offsets: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """True Jaccard of the n-gram sets of each pair."""
    sets: dict[int, np.ndarray] = {}

    def get(i: int) -> np.ndarray:
        s = sets.get(i)
        if s is None:
            s = sets[i] = np.unique(hashes[offsets[i] : offsets[i + 1]])
        return s

    out = np.empty(len(pairs), dtype=np.float64)
    for k, (i, j) in enumerate(pairs.tolist()):
        a, b = get(i), get(j)
        inter = len(np.intersect1d(a, b, assume_unique=True))
        union = len(a) + len(b) - inter
        out[k] = inter / union if union else 1.0
    return out


@dataclass
class Sketch:
    """What LSH needs of each document, a function of its text alone (so shards compute it independently and the
    concatenation equals the whole corpus's): ``keys`` (bands, D) band keys, ``sig`` (D, num_perm) signatures when
    candidates are not verified against the true Jaccard (the estimate needs them), else None."""

    keys: np.ndarray
    sig: np.ndarray | None

    def take(self, rows) -> "Sketch":
        return Sketch(self.keys[:, rows], None if self.sig is None else self.sig[rows])

    @staticmethod
    def concat(parts: Sequence["Sketch"]) -> "Sketch":
        sigs = [p.sig for p in parts]
        return Sketch(np.concatenate([p.keys for p in parts], axis=1),
                      None if any(s is None for s in sigs) else np.concatenate(sigs))


SKETCH_CHARS = 1 << 18  # characters hashed at a time: bounds the n-gram hash temporaries (~50 bytes a character)


def sketch(texts: Sequence[str], ngram: int, num_perm: int, threshold: float, seed: int = 1, verify: bool = True,
           batch: int = 4096, recall_weight: float = 0.9, progress=None) -> Sketch:
    """Band keys (and signatures when ``verify`` is off) of ``texts``, a few hundred thousand characters at a time:
    each document's sketch depends on its text alone, so the pieces concatenate to the whole's."""
    bands, rows = lsh_params(threshold, num_perm, recall_weight)
    parts: list[Sketch] = []
    lo = 0
    while lo < len(texts):
        hi, size = lo, 0
        while hi < len(texts) and (hi == lo or size + len(texts[hi]) <= SKETCH_CHARS):
            size += len(texts[hi])
            hi += 1
        hashes, offsets = ngram_hashes(texts[lo:hi], ngram)
        sig = minhash_signatures(hashes, offsets, num_perm, seed, batch, progress)
        del hashes
        parts.append(Sketch(np.stack(list(band_keys(sig, bands, rows))), None if verify else np.ascontiguousarray(sig)))
        lo = hi
    if not parts:
        return Sketch(np.zeros((bands, 0), dtype=np.uint64), None if verify else np.zeros((0, num_perm), np.uint32))
    return Sketch.concat(parts)


@dataclass
class NearDups:
    pairs: np.ndarray  # (k, 2) indices i < j above the threshold
    similarity: np.ndarray  # true Jaccard (or the signature estimate when verify is off)
    candidates: int  # LSH candidate pairs before verification
    bands: int
    rows: int


def near_duplicates(
    texts: Sequence[str],
    ngram: int,
    num_perm: int,
    threshold: float,
    seed: int = 1,
    verify: bool = True,
    batch: int = 4096,
    progress=None,
    recall_weight: float = 0.9,
    cross_at: int | None = None,
    sketched: Sketch | None = None,
) -> NearDups:
    """Near-duplicate pairs among ``texts``; with ``cross_at``, only pairs (i, j) with i < cross_at <= j.
    ``sketched``: the texts' ``sketch`` with the same settings, computed elsewhere (prepare's shards)."""
    if sketched is None:
        sketched = sketch(texts, ngram, num_perm, threshold, seed, verify, batch, recall_weight, progress)
    bands, rows = lsh_params(threshold, num_perm, recall_weight)
    keys = sketched.keys
    cand = lsh_candidates(keys) if cross_at is None else cross_candidates(keys, cross_at)
    empty = np.fromiter((len(t) == 0 for t in texts), dtype=bool, count=len(texts))
    if len(cand):
        cand = cand[~(empty[cand[:, 0]] | empty[cand[:, 1]])]  # two empty texts share the all-max signature
    if verify:
        sim = pair_jaccard(texts, cand, ngram)
    else:
        sig = sketched.sig
        sim = (sig[cand[:, 0]] == sig[cand[:, 1]]).mean(axis=1) if len(cand) else np.zeros(0)
    keep = sim >= threshold
    return NearDups(cand[keep], sim[keep], len(cand), bands, rows)


def pair_jaccard(texts: Sequence[str], pairs: np.ndarray, ngram: int) -> np.ndarray:
    """True Jaccard of each pair's n-gram sets, hashing only the texts that occur in a pair."""
    if not len(pairs):
        return np.zeros(0)
    involved = np.unique(pairs)
    hashes, offsets = ngram_hashes([texts[i] for i in involved.tolist()], ngram)
    return jaccard(hashes, offsets, np.searchsorted(involved, pairs))


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """Connected-component label of each of ``n`` items linked by ``pairs``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if len(pairs) == 0:
        return np.arange(n)
    g = coo_matrix((np.ones(len(pairs), dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    return connected_components(g, directed=False)[1]


_DIGITS = re.compile(r"(\d+)")


def natural_key(value) -> tuple:
    """"law:9" < "law:10"; None sorts last."""
    if value is None:
        return (1,)
    parts = _DIGITS.split(str(value))
    return (0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts))


def keep_rank(docs: Sequence[dict], prefer_status: Sequence[str], keep_order: Sequence[str]) -> list[int]:
    """Indices of ``docs`` best first: preferred status, then each ``keep_order`` field (``-field``: descending)."""
    status_rank = {s: r for r, s in enumerate(prefer_status)}
    idx = list(range(len(docs)))
    # Stable sorts from the least to the most significant key give a lexicographic order with mixed directions.
    for spec in reversed(keep_order):
        field, desc = (spec[1:], True) if spec.startswith("-") else (spec, False)
        present = [i for i in idx if docs[i].get(field) is not None]
        absent = [i for i in idx if docs[i].get(field) is None]  # missing values last either way
        present.sort(key=lambda i: natural_key(docs[i].get(field)), reverse=desc)
        idx = present + absent
    idx.sort(key=lambda i: status_rank.get(docs[i].get("status"), len(status_rank)))
    return idx
