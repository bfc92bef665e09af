"""The plugin's logic, natively (no server, no wasm)."""
import json

import pytest
import triton_python_backend_utils as pb_utils
from model import TritonPythonModel
from wisp._api import Request


def run(model, texts):
    t = pb_utils.Tensor("TEXT", [[s] for s in texts], "BYTES")
    [r] = model.execute([Request("", [t], [], {})])
    return r


def test_normalizes():
    m = TritonPythonModel()
    m.initialize({"model_config": json.dumps({"parameters": {}})})
    r = run(m, ["  Ｈｅｌｌｏ\t\tWORLD  ", "ﬁne"])
    out = pb_utils.get_output_tensor_by_name(r, "NORMALIZED")
    assert out.as_strings() == ["hello world", "fine"]
    assert out.shape() == [2, 1]


def test_keeps_case_when_asked_and_checks_the_parameter():
    m = TritonPythonModel()
    m.initialize({"model_config": json.dumps(
        {"parameters": {"lowercase": {"string_value": "false"}}})})
    out = pb_utils.get_output_tensor_by_name(run(m, ["A  B"]), "NORMALIZED")
    assert out.as_strings() == ["A B"]
    with pytest.raises(pb_utils.TritonError):
        TritonPythonModel().initialize({"model_config": json.dumps(
            {"parameters": {"lowercase": {"string_value": "maybe"}}})})


def test_describes_itself():
    cfg = TritonPythonModel.auto_complete_config(pb_utils.ModelConfig())
    assert cfg.max_batch_size == 8
    assert cfg.inputs[0] == {"name": "TEXT", "datatype": "BYTES", "dims": [1], "optional": False}
