"""A NodeId is the UUID of the same value with its hash stored: both builds, against uuid.UUID."""

import copy
import importlib
import pickle
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS
from honk.config.links import derive_node_id
from honk.config.spec import NodeSpec

values = st.integers(min_value=0, max_value=(1 << 128) - 1)
# hypothesis tests take every build in one test (a missing compiled build fails the import)
BUILDS = [
    importlib.import_module(f"honk._fast.nodeid_{impl}")
    for impl in ("py",) + (() if NO_EXTENSIONS else ("c",))
]


@given(values)
def test_a_node_id_equals_and_hashes_like_the_plain_uuid_of_its_value(value):
    plain = uuid.UUID(int=value)
    for build in BUILDS:
        node = build.NodeId(int=value)
        assert node == plain and plain == node
        assert hash(node) == hash(plain)
        assert str(node) == str(plain) and node.bytes == plain.bytes and node.int == value
        assert isinstance(node, uuid.UUID)
    assert len({build.NodeId(int=value) for build in BUILDS}) == 1  # the builds' ids are one key


@given(values, values)
def test_state_keyed_by_either_form_is_found_by_the_other(value, other):
    for build in BUILDS:
        node = build.NodeId(int=value)
        by_node = {node: "node"}
        by_plain = {uuid.UUID(int=value): "plain"}
        assert by_node[uuid.UUID(int=value)] == "node"
        assert by_plain[node] == "plain"
        assert (build.NodeId(int=other) in by_node) == (other == value)


@given(values, values)
def test_node_ids_compare_as_the_plain_uuids_of_their_values(value, other):
    """Two node ids compare by value (the compiled build in C), and every other comparison
    (with a plain UUID, another type, an order) is UUID's own."""
    a, b = uuid.UUID(int=value), uuid.UUID(int=other)
    for build in BUILDS:
        node, peer = build.NodeId(int=value), build.NodeId(int=other)
        assert (node == peer) == (a == b) and (node != peer) == (a != b)
        assert (node == build.NodeId(int=value)) and not (node != build.NodeId(int=value))
        assert (node == b) == (a == b) and (b == node) == (a == b) and (node != b) == (a != b)
        assert (node < peer) == (a < b) and (node >= b) == (a >= b)
        assert node != value and not node == str(a)
        assert node in [build.NodeId(int=other), build.NodeId(int=value)]
        assert (node in [build.NodeId(int=other)]) == (value == other)


def test_every_uuid_constructor_form_makes_the_same_node_id(nodeid_mod):
    plain = uuid.uuid5(uuid.NAMESPACE_DNS, "node.example")
    forms = [
        nodeid_mod.NodeId(str(plain)),
        nodeid_mod.NodeId(bytes=plain.bytes),
        nodeid_mod.NodeId(int=plain.int),
        nodeid_mod.node_id(plain),
    ]
    assert all(f == plain and hash(f) == hash(plain) for f in forms)
    made = forms[0]
    assert nodeid_mod.node_id(made) is made  # already a NodeId of this build: itself


def test_a_node_id_is_immutable(nodeid_mod):
    node = nodeid_mod.NodeId(int=7)
    with pytest.raises(TypeError):
        node.int = 8
    with pytest.raises(TypeError):
        node._hash = 0
    assert hash(node) == hash(uuid.UUID(int=7))


@given(values)
def test_a_node_id_pickles_and_copies_with_its_hash(value):
    for build in BUILDS:
        node = build.NodeId(int=value)
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(node, protocol))
            assert type(back) is type(node) and back == node and hash(back) == hash(node)
        assert copy.copy(node) is node and copy.deepcopy(node) is node


def test_a_node_id_made_without_a_value_refuses_to_hash(nodeid_mod):
    bare = nodeid_mod.NodeId.__new__(nodeid_mod.NodeId)
    with pytest.raises((TypeError, AttributeError)):
        hash(bare)


def test_derived_node_ids_are_node_ids_of_the_selected_build():
    from honk._fast.nodeid import NodeId

    derived = derive_node_id(NodeSpec("a", "socks5", "127.0.0.1", 1080))
    assert type(derived) is NodeId
    assert derived == uuid.UUID(str(derived)) and hash(derived) == hash(uuid.UUID(str(derived)))
