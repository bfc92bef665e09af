"""repeat: a decoupled Python plugin, after Triton's python_backend `repeat` example. One
request carries `IN` (INT32, any number of values); the plugin sends one response per value,
`OUT` (the value) and `IDX` (its index, UINT32), through the request's response sender, then
the final flag. It stops early when the client has gone. Its config (config.pbtxt beside it)
sets `model_transaction_policy { decoupled: true }`."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_list()
            for idx, value in enumerate(values):
                if sender.is_cancelled():
                    break
                out = pb_utils.Tensor("OUT", [value], "INT32")
                index = pb_utils.Tensor("IDX", [idx], "UINT32")
                sender.send(pb_utils.InferenceResponse(output_tensors=[out, index]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        # As in Triton, a decoupled model's execute returns None.
        return None
