#!/usr/bin/env bash
# Send a text-line image through Wisp's text_direction ensemble with curl, using the KServe
# binary tensor extension (JSON header, then the raw BYTES element: 4-byte little-endian length
# followed by the file's bytes).
#
#   ./dev serve &
#   examples/text_direction.sh [IMAGE] [MODEL]      # MODEL: text_direction (default) or text_direction_bls
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
img=${1:-$here/../tests/fixtures/images/text_rotated.png}
model=${2:-text_direction}
url=${WISP_URL:-localhost:8000}
len=$(wc -c < "$img")
header='{"inputs":[{"name":"IMAGE","datatype":"BYTES","shape":[1,1],"parameters":{"binary_data_size":'$((len + 4))'}}],"outputs":[{"name":"DIRECTION","parameters":{"binary_data":false}}]}'
le32() { printf "\\x$(printf %02x $(($1 & 255)))\\x$(printf %02x $((($1 >> 8) & 255)))\\x$(printf %02x $((($1 >> 16) & 255)))\\x$(printf %02x $((($1 >> 24) & 255)))"; }
{ printf '%s' "$header"; le32 "$len"; cat "$img"; } |
  curl -sS -X POST "http://$url/v2/models/$model/infer" \
    -H "Content-Type: application/octet-stream" \
    -H "Inference-Header-Content-Length: ${#header}" \
    --data-binary @-
echo
