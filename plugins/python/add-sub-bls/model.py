"""add-sub-bls: a Python plugin that calls another model (Triton's "BLS"). It sends its whole
batch to `add_sub` (config parameter `model`) in one batched call, then returns the sum and
difference with `TOTAL`, the sum of each row's sum."""

import json

import triton_python_backend_utils as pb_utils
import wisp


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.model = params.get("model", {}).get("string_value", "add_sub")

    def execute(self, requests):
        calls = [
            pb_utils.InferenceRequest(
                model_name=self.model,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(r, "INPUT1")])
            for r in requests
        ]
        # one call for the whole batch (InferenceRequest.exec() would make one per request)
        answers = wisp.exec_batch(calls)
        responses = []
        for answer in answers:
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            rows, width = total.shape()
            values = total.as_array()
            sums = [sum(values[i * width:(i + 1) * width]) for i in range(rows)]
            out = answer.output_tensors() + [pb_utils.Tensor("TOTAL", [[s] for s in sums], "FP32")]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
