"""Three replicas behind nginx with deploy/nginx/wisp.conf, under load from tritonclient (HTTP
and gRPC): a replica killed and restarted, one rolled to a new version and one stopped
gracefully and restarted must cost no HTTP request (see replicas.py; gRPC below)."""
import pytest

import replicas
from conftest import EMULATED


@pytest.mark.skipif(EMULATED, reason="native binaries only")
def test_replicas_behind_nginx_lose_no_request_when_killed_rolled_and_restarted():
    result = replicas.run(seconds=15, threads=4)
    print(replicas.report(result))
    assert result["failed_http"] == 0, result["errors"]
    # nginx streams a gRPC request's body to the replica instead of buffering it, so it cannot
    # replay a call whose replica died mid-call: that call fails with UNAVAILABLE (one per kill
    # at most, a status gRPC clients retry). docs/operations.md, "Replicas behind a load balancer".
    assert result["failed_grpc"] <= 2, result["errors"]
    assert result["requests"] > 100
    assert result["versions"] == ["1", "2"], "the rolled replica answered with version 2"
    # Serving never stopped: every second of the run answered requests.
    assert all(n > 0 for n in result["per_second"]), result["per_second"]
