#!/usr/bin/env bash
# Embeddings from Wisp's OpenAI-compatible API with curl.
#
#   ./dev serve &
#   examples/embeddings.sh "some text" ["more text" ...]
set -euo pipefail
url=${WISP_URL:-localhost:8000}
curl -sS "http://$url/v1/models"
echo
input=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:] or ["Wisp serves models."]))' "$@")
curl -sS "http://$url/v1/embeddings" -H "Content-Type: application/json" \
  -d '{"model": "text_embedding", "input": '"$input"'}' |
  python3 -c 'import json, sys
r = json.load(sys.stdin)
if "error" in r:
    sys.exit(r["error"]["message"])
for d in r["data"]:
    print(d["index"], len(d["embedding"]), "dimensions:", d["embedding"][:4], "...")
print("usage:", r["usage"])'
