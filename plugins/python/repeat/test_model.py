"""The plugin's logic, natively (no server, no wasm): what its senders sent."""
import triton_python_backend_utils as pb_utils
from model import TritonPythonModel
from wisp import testing
from wisp._api import Request


def test_one_response_per_value_then_the_final_flag():
    testing.clear()
    inp = pb_utils.Tensor("IN", [4, 5, 6], "INT32")
    assert TritonPythonModel().execute([Request("", [inp], [], {})]) is None
    sent = testing.sent()
    assert [(i, final) for i, _, final in sent] == [(0, False)] * 3 + [(0, True)]
    outs = [pb_utils.get_output_tensor_by_name(r, "OUT").as_list() for _, r, _ in sent[:3]]
    idxs = [pb_utils.get_output_tensor_by_name(r, "IDX").as_list() for _, r, _ in sent[:3]]
    assert outs == [[4], [5], [6]] and idxs == [[0], [1], [2]]
    assert sent[3][1] is None


def test_a_send_without_a_response_must_be_final():
    sender = Request("", [], [], {}).get_response_sender()
    try:
        sender.send()
    except pb_utils.TritonError as e:
        assert "TRITONSERVER_RESPONSE_COMPLETE_FINAL" in e.message()
    else:
        raise AssertionError("send() without a response or the final flag was accepted")
