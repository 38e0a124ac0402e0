"""The buckets a dynamic plan is cut into (opgraph.build.buckets): size classes, the int64 cut, the
merge down to max_buckets, explicit upper ends, the bucket of every value, and the typed errors of the
options."""

from __future__ import annotations

import itertools

import pytest

import opgraph as og
from opgraph.build.buckets import choose, hint_of, int64_cut, size_classes
from tests.helpers import check_rule


def graph(*dims: og.Dim, inner: int = 8) -> og.FinalGraph:
    g = og.Graph("b", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[*dims, inner], name="x")
    g.relu(x).set_output(True).set_name("y")
    return g.final


def spans(buckets) -> list[tuple[tuple[str, int, int], ...]]:
    return [b.ranges for b in buckets.buckets]


@pytest.mark.parametrize(
    "lo, hi, want",
    [
        (1, 1, [(1, 1)]),
        (1, 16, [(1, 1), (2, 16)]),
        (1, 37, [(1, 1), (2, 16), (17, 37)]),
        (17, 2048, [(17, 256), (257, 2048)]),
        (3, 5000, [(3, 16), (17, 256), (257, 4096), (4097, 5000)]),
        (300, 300, [(300, 300)]),
    ],
)
def test_size_classes(lo, hi, want):
    assert size_classes(lo, hi) == want


def test_the_serving_example_gives_four_buckets():
    b = choose(graph(og.Dim("batch", 1, 16), og.Dim("seq", 17, 2048)))
    assert spans(b) == [
        (("batch", 1, 1), ("seq", 17, 256)),
        (("batch", 1, 1), ("seq", 257, 2048)),
        (("batch", 2, 16), ("seq", 17, 256)),
        (("batch", 2, 16), ("seq", 257, 2048)),
    ]
    assert [b.hint for b in b.buckets][3] == (("batch", 6), ("seq", 720))


def test_every_value_finds_the_bucket_that_holds_it():
    dims = og.Dim("a", 1, 40), og.Dim("c", 5, 300)
    b = choose(graph(*dims), max_buckets=100)
    for a, c in itertools.product(range(1, 41), range(5, 301, 7)):
        found = b.of((a, c))
        assert found.contains({"a": a, "c": c}), (a, c, found)
    assert sorted(x.index for x in b.buckets) == list(range(len(b)))


def test_max_buckets_merges_the_dim_with_the_most_classes():
    dims = og.Dim("a", 1, 70000), og.Dim("c", 1, 20)
    full = choose(graph(*dims, inner=1), max_buckets=100)
    assert len(full) == 6 * 3
    merged = choose(graph(*dims, inner=1), max_buckets=8)
    assert len(merged) <= 8
    classes = {name: sorted({(lo, hi) for r in spans(merged) for n, lo, hi in r if n == name}) for name in "ac"}
    assert classes["c"] == [(1, 1), (2, 16), (17, 20)]  # the dim with fewer classes is kept
    assert classes["a"][0] == (1, 1)  # {1} is merged last
    for name, lo, hi in ((n, d.min, d.max) for n, d in zip("ac", dims)):  # classes still cover the range
        cover = classes[name]
        assert cover[0][0] == lo and cover[-1][1] == hi
        assert all(x[1] + 1 == y[0] for x, y in zip(cover, cover[1:]))


def test_one_bucket_and_explicit_upper_ends():
    dims = og.Dim("batch", 1, 16), og.Dim("seq", 1, 2048)
    one = choose(graph(*dims), "one")
    assert spans(one) == [(("batch", 1, 16), ("seq", 1, 2048))]
    given = choose(graph(*dims), {"seq": [128, 1024]})
    assert sorted({r[1] for r in spans(given)}) == [("seq", 1, 128), ("seq", 129, 1024), ("seq", 1025, 2048)]
    assert sorted({r[0] for r in spans(given)}) == [("batch", 1, 1), ("batch", 2, 16)]


def test_an_int64_cut_keeps_small_shapes_on_int32():
    batch = og.Dim("batch", 1, 4096)
    g = graph(batch, inner=2**20)  # batch * 2**20 elements: int32 up to batch 2047 (with a block's lanes)
    assert int64_cut(g, batch) == 2047
    b = choose(g, max_buckets=100)
    assert [r[0][1:] for r in spans(b)] == [(1, 1), (2, 16), (17, 256), (257, 2047), (2048, 4096)]
    assert int64_cut(graph(og.Dim("batch", 1, 64)), og.Dim("batch", 1, 64)) is None


def test_hints_are_inside_and_round_where_they_can():
    assert hint_of(1, 1) == 1
    assert hint_of(2, 16) == 6
    assert hint_of(257, 2048) == 720
    for lo, hi in [(3, 5), (17, 37), (1000, 1001), (2, 2)]:
        assert lo <= hint_of(lo, hi) <= hi


@pytest.mark.parametrize(
    "buckets, words",
    [
        ({"sequence": [8]}, ("sequence", "seq")),
        ({"seq": [8, 4]}, ("seq", "increase")),
        ({"seq": [2048]}, ("seq", "2047")),
        ({"seq": "8"}, ("buckets",)),
        ("two", ("buckets",)),
        (3, ("buckets",)),
    ],
)
def test_bad_bucket_options_are_typed(buckets, words):
    g = og.Graph("b", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[og.Dim("batch", 1, 16), og.Dim("seq", 1, 2048), 8], name="x")
    g.relu(x).set_output(True).set_name("y")
    with pytest.raises(og.BuildOptionError) as info:
        g.build(device="cpu", engines=["reference"], buckets=buckets)
    check_rule(info.value, "build.buckets")
    assert all(w in str(info.value) for w in words), str(info.value)


def test_max_buckets_must_be_a_positive_int():
    for bad in (0, -1, 2.5, "8", True):
        with pytest.raises(og.BuildOptionError) as info:
            og.BuildOptions(max_buckets=bad)
        check_rule(info.value, "build.option")
        assert "max_buckets" in str(info.value)
    assert og.BuildOptions(buckets={"seq": [4]}).buckets == (("seq", (4,)),)
