"""babel.checksum: CRC values, combination, sampled ranges and their detection probability."""

from __future__ import annotations

import os
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babel.checksum import (
    _CRC32C,
    _CRC64,
    crc32c,
    crc32c_combine,
    crc64ecma,
    crc64ecma_combine,
    detection_probability,
    sample_ranges,
)

CRCS = [(crc32c, crc32c_combine), (crc64ecma, crc64ecma_combine)]
MiB = 1 << 20


def test_check_values() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc64ecma(b"123456789") == 0x995DC9BBDF1939FA
    assert crc32c(b"") == 0 and crc64ecma(b"") == 0
    # RFC 3720 (iSCSI) B.4 vectors for CRC32C
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E


@pytest.mark.parametrize("fn", [crc32c, crc64ecma])
@given(data=st.binary(max_size=4096), cut=st.integers(min_value=0, max_value=4096))
def test_incremental_equals_one_shot(fn, data: bytes, cut: int) -> None:
    cut = min(cut, len(data))
    assert fn(data[cut:], fn(data[:cut])) == fn(data)
    assert fn(memoryview(data)) == fn(bytearray(data)) == fn(data)


@pytest.mark.parametrize("fn,combine", CRCS)
@given(data=st.binary(max_size=8192), cuts=st.lists(st.integers(min_value=0, max_value=8192), max_size=6))
def test_combine_equals_one_shot(fn, combine, data: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    crc = 0
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        crc = combine(crc, fn(data[lo:hi]), hi - lo)
    assert crc == fn(data)


@pytest.mark.parametrize("fn,combine", CRCS)
def test_combine_edge_cases_and_large_parts(fn, combine) -> None:
    a, b = os.urandom(1000), os.urandom(3 * MiB + 17)
    assert combine(fn(a), fn(b), len(b)) == fn(a + b)
    assert combine(fn(a), fn(b""), 0) == fn(a)  # appending nothing
    assert combine(fn(b""), fn(b), len(b)) == fn(b)  # nothing before
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError):
            combine(1, 2, bad)


@pytest.mark.parametrize("space", [_CRC32C, _CRC64], ids=["crc32c", "crc64"])
@given(n1=st.integers(min_value=0, max_value=1 << 62), n2=st.integers(min_value=0, max_value=1 << 62))
def test_shift_operators_compose_for_huge_lengths(space, n1: int, n2: int) -> None:
    # x^(8 n1) * x^(8 n2) == x^(8 (n1 + n2)): the digit tables agree with each other up to 2^63 bytes
    assert space.mul(space.shift_op(n1), space.shift_op(n2)) == space.shift_op(n1 + n2)


@pytest.mark.parametrize("space", [_CRC32C, _CRC64], ids=["crc32c", "crc64"])
def test_shift_operator_matches_appending_zeros(space) -> None:
    fn = crc32c if space is _CRC32C else crc64ecma
    ones = (1 << space.width) - 1
    for n in (1, 255, 256, 65537, 1 << 20):
        # a raw register r followed by n zero bytes becomes r * x^(8n)
        r = 0x12345678
        assert space.mul(space.shift_op(n), r) == fn(bytes(n), r ^ ones) ^ ones


@pytest.mark.parametrize("combine", [crc32c_combine, crc64ecma_combine])
def test_combining_10k_parts_is_fast(combine) -> None:
    rng = random.Random(1)
    sizes = [rng.randrange(1, 5 << 30) for _ in range(10_000)]  # distinct lengths: no operator cache hits
    start = time.perf_counter()
    crc = 0
    for n in sizes:
        crc = combine(crc, 0x1234, n)
    random_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(10_000):
        crc = combine(crc, 0x1234, 8 * MiB)
    equal_s = time.perf_counter() - start
    assert random_s < 1.0 and equal_s < 0.5, (random_s, equal_s)


# ----------------------------------------------------------- sample_ranges --


def check_layout(size: int, ranges: list[tuple[int, int]], samples: int, sample_size: int) -> None:
    if size == 0:
        assert ranges == []
        return
    if samples * sample_size >= size:
        assert ranges == [(0, size)]
        return
    assert len(ranges) == samples
    assert all(n == sample_size for _, n in ranges)
    assert ranges[0][0] == 0 and ranges[-1][0] + ranges[-1][1] == size  # head and tail
    for (o1, n1), (o2, _) in zip(ranges, ranges[1:], strict=False):
        assert o1 + n1 <= o2  # sorted, not overlapping
    middle = size - 2 * sample_size
    stripes = samples - 2
    for i, (offset, length) in enumerate(ranges[1:-1]):  # one in each stripe of the middle
        assert sample_size + i * middle // stripes <= offset
        assert offset + length <= sample_size + (i + 1) * middle // stripes


@given(
    size=st.integers(min_value=0, max_value=1 << 44),
    samples=st.integers(min_value=2, max_value=64),
    sample_size=st.integers(min_value=1, max_value=4 * MiB),
    seed=st.text(max_size=100),
)
def test_sample_ranges_layout(size: int, samples: int, sample_size: int, seed: str) -> None:
    ranges = sample_ranges(size, seed=seed, samples=samples, sample_size=sample_size)
    check_layout(size, ranges, samples, sample_size)
    assert ranges == sample_ranges(size, seed=seed, samples=samples, sample_size=sample_size)


def test_sample_ranges_deterministic_and_seeded() -> None:
    size = 10 << 30
    a = sample_ranges(size, seed="ckpt/step-100/model.pt")
    assert a == sample_ranges(size, seed="ckpt/step-100/model.pt")
    assert a != sample_ranges(size, seed="ckpt/step-100/optim.pt")
    assert a != sample_ranges(size + 1, seed="ckpt/step-100/model.pt")
    assert len(a) == 32 and a[0] == (0, MiB) and a[-1] == (size - MiB, MiB)
    assert sample_ranges(0, seed="k") == []
    assert sample_ranges(32 * MiB, seed="k") == [(0, 32 * MiB)]
    assert sample_ranges(5, seed="k") == [(0, 5)]
    assert len(sample_ranges(32 * MiB + 1, seed="k")) == 32


def test_sample_ranges_spread_over_the_object() -> None:
    # stratified: across many seeds every stripe is used and the offsets inside one stripe vary
    size, samples = 1 << 30, 10
    starts = {sample_ranges(size, seed=f"key-{i}", samples=samples)[3][0] for i in range(50)}
    assert len(starts) == 50


def test_sample_ranges_rejects_bad_arguments() -> None:
    for kwargs in ({"samples": 1}, {"samples": 0}, {"sample_size": 0}):
        with pytest.raises(ValueError):
            sample_ranges(100, seed="k", **kwargs)
    with pytest.raises(ValueError):
        sample_ranges(-1, seed="k")


# --------------------------------------------------- detection_probability --


def brute_force(size: int, ranges: list[tuple[int, int]], region: int) -> float:
    starts = range(max(0, size - region) + 1)
    hit = sum(any(s < o + n and s + region > o for o, n in ranges) for s in starts)
    return hit / len(starts)


@settings(max_examples=300)
@given(
    size=st.integers(min_value=1, max_value=400),
    samples=st.integers(min_value=2, max_value=8),
    sample_size=st.integers(min_value=1, max_value=20),
    region=st.integers(min_value=1, max_value=60),
    seed=st.text(max_size=8),
)
def test_detection_probability_matches_brute_force(
    size: int, samples: int, sample_size: int, region: int, seed: str
) -> None:
    ranges = sample_ranges(size, seed=seed, samples=samples, sample_size=sample_size)
    assert detection_probability(size, ranges, region) == pytest.approx(brute_force(size, ranges, region), abs=1e-12)


@given(
    size=st.integers(min_value=1, max_value=300),
    ranges=st.lists(st.tuples(st.integers(0, 320), st.integers(0, 40)), max_size=6),
    region=st.integers(min_value=1, max_value=50),
)
def test_detection_probability_arbitrary_ranges(size: int, ranges: list[tuple[int, int]], region: int) -> None:
    # overlapping, unsorted, empty and out-of-bounds ranges too
    clipped = [(o, n) for o, n in ranges if o < size and n > 0]
    assert detection_probability(size, ranges, region) == pytest.approx(brute_force(size, clipped, region), abs=1e-12)


def test_detection_probability_values() -> None:
    assert detection_probability(0, [], MiB) == 0.0
    assert detection_probability(100, [(0, 100)], 7) == 1.0
    assert detection_probability(100, [(0, 1)], 100) == 1.0  # the region is the whole object
    size = 10 << 30
    p = detection_probability(size, sample_ranges(size, seed="k"), MiB)
    # head and tail are caught from 1 MiB of start offsets each, the 30 others from 2 MiB - 1 each
    starts = size - MiB + 1
    assert p == pytest.approx((2 * MiB + 30 * (2 * MiB - 1)) / starts)
    with pytest.raises(ValueError):
        detection_probability(10, [(0, 1)], 0)
