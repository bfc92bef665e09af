"""Three `wisp` replicas behind nginx (deploy/nginx/wisp.conf) under bounded load from
tritonclient (3 HTTP clients, 1 gRPC): one replica is killed (SIGKILL) and restarted, one is
rolled to version 2 of its model, one is stopped (SIGTERM) and restarted. Reports failed
requests and the throughput dip. Run through `./dev bench lb` (release binary); the scenario is
tests/conformance/replicas.py, which CI runs for 15 s with the debug binary.

    python benches/loadbalancer.py [SECONDS] [CLIENTS]
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "conformance"))
import replicas  # noqa: E402

if __name__ == "__main__":
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    result = replicas.run(seconds, clients)
    print(f"binary: {os.environ.get('WISP_BIN')}\n")
    print(replicas.report(result))
    sys.exit(1 if result["failed"] else 0)
