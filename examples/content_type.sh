#!/usr/bin/env bash
# Ask Wisp's content_type ensemble what kind of file FILE is, with curl and the KServe binary
# tensor extension (JSON header, then a 4-byte little-endian length and the file's bytes).
#
#   ./dev serve &
#   examples/content_type.sh FILE
set -euo pipefail
file=${1:?usage: content_type.sh FILE}
url=${WISP_URL:-localhost:8000}
len=$(wc -c < "$file")
header='{"inputs":[{"name":"CONTENT","datatype":"BYTES","shape":[1,1],"parameters":{"binary_data_size":'$((len + 4))'}}],"outputs":[{"name":"LABEL","parameters":{"binary_data":false}},{"name":"SCORE","parameters":{"binary_data":false}}]}'
le32() { printf "\\x$(printf %02x $(($1 & 255)))\\x$(printf %02x $((($1 >> 8) & 255)))\\x$(printf %02x $((($1 >> 16) & 255)))\\x$(printf %02x $((($1 >> 24) & 255)))"; }
{ printf '%s' "$header"; le32 "$len"; cat "$file"; } |
  curl -sS -X POST "http://$url/v2/models/content_type/infer" \
    -H "Content-Type: application/octet-stream" \
    -H "Inference-Header-Content-Length: ${#header}" \
    --data-binary @-
echo
