"""The `wisp` package's tensors, natively: nested lists checked level by level, arrays taken
as they are when their typecode is the datatype's."""
import array
import struct

import pytest

from wisp import Tensor


def test_nested_lists_fill_their_shape():
    t = Tensor("x", [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], "FP32")
    assert t.shape() == [2, 3]
    assert t.as_bytes() == struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    assert Tensor("s", 2.5, "FP64").shape() == []
    assert Tensor("e", [], "FP32").shape() == [0]
    assert Tensor("e2", [[], []], "INT32").shape() == [2, 0]
    assert Tensor("t", ((1, 2), (3, 4)), "INT32").as_list() == [1, 2, 3, 4]


@pytest.mark.parametrize("values", [
    [[1.0, 2.0], [3.0]],
    [[1.0, 2.0], [3.0, [4.0]]],
    [1.0, [2.0]],
    [[1.0], 2.0],
])
def test_ragged_lists_are_refused(values):
    with pytest.raises(ValueError, match="not rectangular"):
        Tensor("x", values, "FP32")


def test_an_array_of_the_datatypes_typecode_is_taken_as_it_is():
    a = array.array("f", [1.5, -2.0, 3.25])
    t = Tensor("y", a, "FP32", [1, 3])
    assert (t.datatype(), t.shape(), t.as_bytes()) == ("FP32", [1, 3], a.tobytes())
    # No datatype and no shape: both from the array.
    t = Tensor("z", array.array("h", [1, -2]))
    assert (t.datatype(), t.shape(), t.as_list()) == ("INT16", [2], [1, -2])
    with pytest.raises(ValueError, match="do not fit"):
        Tensor("w", a, "FP32", [2, 3])


def test_an_array_of_another_typecode_is_converted():
    t = Tensor("d", array.array("d", [0.5, 1.5]), "FP32")
    assert t.as_bytes() == struct.pack("<2f", 0.5, 1.5)
    t = Tensor("i", array.array("l", [7, 8]), "INT32")
    assert t.as_list() == [7, 8] and len(t.as_bytes()) == 8
    with pytest.raises(TypeError):
        Tensor("f", array.array("f", [0.5]), "INT32")


def test_views_round_trip():
    t = Tensor("v", [[1, 2], [3, 4]], "INT64")
    assert t.as_array().tolist() == [1, 2, 3, 4]
    assert t.as_memoryview().tolist() == [1, 2, 3, 4]
    assert Tensor("b", ["a", "bc"], "BYTES").as_strings() == ["a", "bc"]
    assert Tensor("q", [True, False]).as_list() == [True, False]
