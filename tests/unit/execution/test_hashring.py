"""Consistent hashing: even spread, and few keys move when a node is added."""

from __future__ import annotations

from collections import Counter

import pytest

from infermux.execution.hashring import HashRing

KEYS = [f"camera-{i}" for i in range(10_000)]


@pytest.mark.parametrize("nodes", [2, 3, 4, 8])
def test_adding_a_node_moves_about_one_in_n_plus_one_keys(nodes: int):
    before, after = HashRing(list(range(nodes))), HashRing(list(range(nodes + 1)))
    moved = [k for k in KEYS if before.lookup(k) != after.lookup(k)]
    assert len(moved) / len(KEYS) == pytest.approx(1 / (nodes + 1), abs=0.05)
    assert all(after.lookup(k) == nodes for k in moved)  # keys move only to the new node


@pytest.mark.parametrize("nodes", [2, 3, 5])
def test_keys_spread_evenly(nodes: int):
    ring = HashRing([f"v{i}" for i in range(nodes)])
    counts = Counter(ring.lookup(k) for k in KEYS)
    assert len(counts) == nodes
    assert min(counts.values()) / max(counts.values()) > 0.7


def test_removing_a_node_moves_only_its_keys():
    three, two = HashRing(["a", "b", "c"]), HashRing(["a", "b"])
    assert all(two.lookup(k) == three.lookup(k) for k in KEYS if three.lookup(k) != "c")


def test_the_same_key_always_lands_on_the_same_node():
    assert {HashRing(["1", "2"]).lookup("cam-7") for _ in range(5)} == {HashRing(["2", "1"]).lookup("cam-7")}


def test_a_ring_needs_a_node():
    with pytest.raises(ValueError):
        HashRing([])
