"""The plugin's logic natively, with the called model answered by wisp.testing."""
import json

import triton_python_backend_utils as pb_utils
import wisp.testing
from model import TritonPythonModel
from wisp._api import Request


def fake_add_sub(request):
    a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
    b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
    x, y = a.as_list(), b.as_list()
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("OUTPUT0", [p + q for p, q in zip(x, y)], "FP32", a.shape()),
        pb_utils.Tensor("OUTPUT1", [p - q for p, q in zip(x, y)], "FP32", a.shape()),
    ])


def test_one_call_for_the_batch():
    wisp.testing.clear()
    wisp.testing.serve("add_sub", fake_add_sub)
    m = TritonPythonModel()
    m.initialize({"model_config": json.dumps({"parameters": {}})})
    reqs = [
        Request("", [pb_utils.Tensor("INPUT0", [[float(i)] * 16], "FP32"),
                     pb_utils.Tensor("INPUT1", [[1.0] * 16], "FP32")], [], {})
        for i in range(3)
    ]
    out = m.execute(reqs)
    assert wisp.testing.calls("add_sub") == 1
    total = pb_utils.get_output_tensor_by_name(out[2], "TOTAL")
    assert total.as_list() == [48.0] and total.shape() == [1, 1]
    assert pb_utils.get_output_tensor_by_name(out[0], "OUTPUT1").as_list()[0] == -1.0


def test_a_failed_call_fails_the_requests():
    wisp.testing.clear()
    m = TritonPythonModel()
    m.initialize({"model_config": json.dumps({"parameters": {}})})
    req = Request("", [pb_utils.Tensor("INPUT0", [[0.0] * 16], "FP32"),
                       pb_utils.Tensor("INPUT1", [[0.0] * 16], "FP32")], [], {})
    [r] = m.execute([req])
    assert r.has_error() and "unknown model" in r.error().message()
