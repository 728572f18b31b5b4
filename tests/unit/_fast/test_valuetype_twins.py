"""A value type hashes by its stored hash and compares by its slots: both builds, against the
class's own Python methods (which the twin leaves in place and the compiled build replaces)."""

import importlib
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS
from honk.alive.outcome import Family
from honk.core.net import Network
from honk.group.score.keys import AggregateKey, ExactKey, ScoreTarget

BUILDS = [
    importlib.import_module(f"honk._fast.valuetype_{impl}")
    for impl in ("py",) + (() if NO_EXTENSIONS else ("c",))
]


def _pair_class():
    """A fresh slots class whose Python methods say what a value type means."""

    class Pair:
        __slots__ = ("_hash", "left", "right")

        def __init__(self, left, right):
            self.left = left
            self.right = right
            self._hash = hash((left, right))

        def __hash__(self):
            return self._hash

        def __eq__(self, other):
            if other.__class__ is not self.__class__:
                return NotImplemented
            return self._hash == other._hash and self.left == other.left and self.right == other.right

    return Pair


def _target_class():
    """A fresh frozen slots dataclass with a stored hash, as ScoreTarget is."""

    @dataclass(frozen=True, slots=True)
    class Target:
        host: str
        port: int
        _hash: int = field(init=False, repr=False, compare=False)

        def __post_init__(self):
            object.__setattr__(self, "_hash", hash((self.host, self.port)))

        def __hash__(self):
            return self._hash

    return Target


fields = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(["a", "b", "A"]),
    st.none(),
    st.sampled_from(list(Network)),
    st.sampled_from(list(Family)),
    st.floats(allow_nan=False, width=16),
)


@given(st.lists(st.tuples(fields, fields), min_size=1, max_size=6))
def test_installed_and_python_value_types_agree_on_equality_hash_and_lookup(values):
    reference = _pair_class()
    for build in BUILDS:
        installed = build.install(_pair_class())
        for a_left, a_right in values:
            for b_left, b_right in values:
                ref_a, ref_b = reference(a_left, a_right), reference(b_left, b_right)
                got_a, got_b = installed(a_left, a_right), installed(b_left, b_right)
                assert (got_a == got_b) == (ref_a == ref_b)
                assert (got_a != got_b) == (ref_a != ref_b)
                assert hash(got_a) == hash(ref_a)
        table = {installed(left, right): i for i, (left, right) in enumerate(values)}
        for left, right in values:
            assert (
                table[installed(left, right)]
                == {(lf, rt): i for i, (lf, rt) in enumerate(values)}[(left, right)]
            )


# every width a stored hash can have: none, one, two and three 30-bit digits, either sign
HASH_EDGES = [0, 1, -2, 2**30 - 1, 2**30, -(2**30), 2**60 - 1, 2**60, -(2**60), 2**61 - 2, -(2**61 - 2)]


@given(st.one_of(st.sampled_from(HASH_EDGES), st.integers(-(2**70), 2**70)))
def test_a_stored_hash_of_any_width_and_sign_is_the_hash(value):
    """The compiled hash reads the stored int's digits itself; it must give hash() exactly."""
    for build in BUILDS:
        installed = build.install(_pair_class())
        pair = installed(value, None)
        pair._hash = hash(value)  # the stored hash is any value hash() returns
        assert hash(pair) == hash(value)


@given(st.text(max_size=5), st.integers(0, 65535), st.text(max_size=5), st.integers(0, 65535))
def test_an_installed_dataclass_compares_like_its_generated_equality(host, port, other_host, other_port):
    reference = _target_class()
    for build in BUILDS:
        installed = build.install(_target_class())
        assert (installed(host, port) == installed(other_host, other_port)) == (
            reference(host, port) == reference(other_host, other_port)
        )
        assert hash(installed(host, port)) == hash(reference(host, port))


def test_a_value_type_equals_no_other_class_and_has_no_order(valuetype_mod):
    pair = valuetype_mod.install(_pair_class())
    other = valuetype_mod.install(_pair_class())  # the same slots and values, another class
    assert pair(1, 2) != other(1, 2) and not pair(1, 2) == other(1, 2)
    assert pair(1, 2) != (1, 2) and pair(1, 2) != "x"
    with pytest.raises(TypeError):
        _ = pair(1, 2) < pair(1, 3)


def test_a_subclass_of_a_value_type_still_hashes_and_compares(valuetype_mod):
    pair = valuetype_mod.install(_pair_class())

    class Labelled(pair):
        __slots__ = ()

    assert hash(Labelled(1, 2)) == hash(pair(1, 2)) == hash((1, 2))
    assert Labelled(1, 2) == Labelled(1, 2) and Labelled(1, 2) != Labelled(2, 1)


@pytest.mark.compiled
@pytest.mark.skipif(NO_EXTENSIONS, reason="the compiled build checks the class it is given")
def test_the_compiled_install_refuses_a_class_it_cannot_read():
    build = importlib.import_module("honk._fast.valuetype_c")

    class WithDict:
        def __init__(self):
            self._hash = 0

    class NoStoredHash:
        __slots__ = ("value",)

    with pytest.raises(TypeError):
        build.install(WithDict)
    with pytest.raises(TypeError):
        build.install(NoStoredHash)


def test_score_keys_and_targets_keep_their_value_semantics():
    node, other = uuid.UUID(int=1), uuid.UUID(int=2)
    target = ScoreTarget.of("Example.COM.", 443)
    assert target == ScoreTarget.of("example.com", 443) and hash(target) == hash(
        ScoreTarget.of("example.com", 443)
    )
    assert target != ScoreTarget.of("example.com", 80) and target != ScoreTarget.of("example.org", 443)
    exact = ExactKey("g", Network.TCP, Family.V4, target, node)
    assert exact == ExactKey(
        "g", Network.TCP, Family.V4, ScoreTarget.of("example.com", 443), uuid.UUID(int=1)
    )
    assert exact != ExactKey("g", Network.TCP, Family.V4, target, other)
    assert exact != ExactKey("g", Network.UDP, Family.V4, target, node)
    aggregate = AggregateKey("g", Network.TCP, Family.V4, node)
    assert aggregate == AggregateKey("g", Network.TCP, Family.V4, node)
    assert aggregate != AggregateKey("g", Network.TCP, None, node)
    assert aggregate != exact and exact != aggregate  # one layer's key never finds another's cell
    cells = {exact: "exact", aggregate: "family"}
    assert cells[ExactKey("g", Network.TCP, Family.V4, ScoreTarget.of("example.com", 443), node)] == "exact"
    assert cells[AggregateKey("g", Network.TCP, Family.V4, node)] == "family"
    with pytest.raises(TypeError):
        _ = target < target
