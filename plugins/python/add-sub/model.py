"""add-sub in Python: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 on 16 floats. It
describes itself (no config.pbtxt needed). The Python side of the per-request cost benchmark."""

import array
from operator import add, sub

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for name in ("INPUT0", "INPUT1"):
            config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [16]})
        for name in ("OUTPUT0", "OUTPUT1"):
            config.add_output({"name": name, "data_type": "TYPE_FP32", "dims": [16]})
        config.set_max_batch_size(8)
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            x, y = a.as_array(), b.as_array()
            total = array.array("f", map(add, x, y))
            diff = array.array("f", map(sub, x, y))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", total, "FP32", a.shape()),
                pb_utils.Tensor("OUTPUT1", diff, "FP32", a.shape()),
            ]))
        return responses
