"""text-normalize: a Python plugin in Triton's Python-backend style. `TEXT` (BYTES, one string
per row) -> `NORMALIZED`: Unicode NFKC, whitespace collapsed, trimmed, and lowercased unless
the config parameter `lowercase` is "false". It describes itself (`auto_complete_config`), so
its model directory needs no config.pbtxt."""

import json
import unicodedata

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input(
            {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.add_output(
            {"name": "NORMALIZED", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        value = params.get("lowercase", {}).get("string_value", "true")
        if value not in ("true", "false"):
            raise pb_utils.TritonError(
                f"parameter 'lowercase' must be true or false, not '{value}'",
                pb_utils.TritonError.INVALID_ARG)
        self.lowercase = value == "true"

    def normalize(self, text):
        text = " ".join(unicodedata.normalize("NFKC", text).split())
        return text.lower() if self.lowercase else text

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            try:
                values = text.as_strings()
            except UnicodeDecodeError:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "TEXT must be UTF-8", pb_utils.TritonError.INVALID_ARG)))
                continue
            out = pb_utils.Tensor("NORMALIZED", [self.normalize(v) for v in values], "BYTES",
                                  text.shape())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
