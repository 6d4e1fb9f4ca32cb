"""First-fit decreasing onto nodes of memory (and accelerators): hand-made cases with known answers."""

import pytest

from tandem.schedule.packing import NodeShape, PackItem, first_fit_decreasing, nodes_needed

GIB = 2**30


def items(*sizes_gib: float, accelerators: int = 0) -> list[PackItem]:
    return [PackItem(f"r{i}", int(s * GIB), accelerators) for i, s in enumerate(sizes_gib)]


def test_identical_replicas_fill_each_node_before_opening_the_next():
    node = NodeShape(100 * GIB)
    assert nodes_needed(items(*[30] * 7), node) == 3  # 3 per node: 3 + 3 + 1
    assert [len(b) for b in first_fit_decreasing(items(*[30] * 7), node)] == [3, 3, 1]


def test_halving_the_weights_puts_two_replicas_where_one_fitted():
    node = NodeShape(80 * GIB)
    fp16, int8 = items(*[50] * 4), items(*[35] * 4)
    assert nodes_needed(fp16, node) == 4 and nodes_needed(int8, node) == 2


def test_largest_first_packs_tighter_than_arrival_order():
    node = NodeShape(10 * GIB)
    sizes = [2, 5, 4, 7, 1, 3, 8]  # 30 GiB: three nodes at best (8+2, 7+3, 5+4+1)
    packed = first_fit_decreasing(items(*sizes), node)
    assert len(packed) == 3
    assert sorted(sum(i.memory_bytes for i in b) // GIB for b in packed) == [10, 10, 10]


def test_accelerators_bound_a_node_too():
    node = NodeShape(640 * GIB, accelerators=8)
    tp2 = items(*[100] * 6, accelerators=2)  # memory would take 6 per node; 8 accelerators take 4
    assert nodes_needed(tp2, node) == 2
    assert nodes_needed(tp2, NodeShape(640 * GIB)) == 1  # accelerators not counted: memory only


def test_a_replica_larger_than_a_node_is_a_clear_error():
    with pytest.raises(ValueError, match="more than one node has"):
        first_fit_decreasing(items(90), NodeShape(80 * GIB))
    with pytest.raises(ValueError, match="accelerator"):
        first_fit_decreasing(items(10, accelerators=4), NodeShape(80 * GIB, accelerators=2))


def test_no_replicas_need_no_nodes():
    assert nodes_needed([], NodeShape(GIB)) == 0
