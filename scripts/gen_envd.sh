#!/usr/bin/env bash
# Regenerate agent_sandbox/surfaces/e2b/envd_pb from the vendored .proto files of E2B's envd
# (agent_sandbox/surfaces/e2b/proto, from spec/envd of github.com/e2b-dev/E2B, Apache-2.0),
# with the generators of the libraries the package uses (protobuf-py, connectrpc).
# Needs protoc (apt-get install protobuf-compiler); the generators go in a throwaway venv.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
e2b="$here/agent_sandbox/surfaces/e2b"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q "protoc-gen-py==0.6.0" "protoc-gen-connectrpc==0.12.1"
rm -rf "$e2b/envd_pb"
mkdir -p "$e2b/envd_pb"
PATH="$venv/bin:$PATH" protoc -I "$e2b/proto" --py_out="$e2b/envd_pb" \
    --connectrpc_out="$e2b/envd_pb" process/process.proto filesystem/filesystem.proto
touch "$e2b/envd_pb/__init__.py"
echo "regenerated $e2b/envd_pb"
