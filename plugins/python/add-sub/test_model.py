"""The plugin's logic, natively."""
import triton_python_backend_utils as pb_utils
from model import TritonPythonModel
from wisp._api import Request


def test_adds_and_subtracts():
    req = Request("", [pb_utils.Tensor("INPUT0", [[float(i) for i in range(16)]], "FP32"),
                       pb_utils.Tensor("INPUT1", [[1.0] * 16], "FP32")], [], {})
    [r] = TritonPythonModel().execute([req])
    assert pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_list()[3] == 4.0
    assert pb_utils.get_output_tensor_by_name(r, "OUTPUT1").shape() == [1, 16]
    cfg = TritonPythonModel.auto_complete_config(pb_utils.ModelConfig())
    assert cfg.max_batch_size == 8 and len(cfg.inputs) == 2
