#!/bin/bash
# SeaweedFS with its S3 gateway on :8333 and one identity (S3_ACCESS_KEY, S3_SECRET_KEY).
# `s3-entrypoint healthcheck` answers whether the gateway takes connections.
set -euo pipefail
if [[ "${1:-}" == healthcheck ]]; then
    exec 3<>/dev/tcp/127.0.0.1/8333
    exit 0
fi
: "${S3_ACCESS_KEY:?set S3_ACCESS_KEY}"
: "${S3_SECRET_KEY:?set S3_SECRET_KEY}"
umask 077
config="$(mktemp)"
cat >"$config" <<JSON
{"identities": [{"name": "reprotrain",
  "credentials": [{"accessKey": "$S3_ACCESS_KEY", "secretKey": "$S3_SECRET_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
exec weed server -dir=/data -ip=127.0.0.1 -ip.bind=0.0.0.0 -s3 -s3.port=8333 \
    -s3.port.iceberg=0 -s3.port.lance=0 -s3.config="$config" -metricsPort=0 "$@"
