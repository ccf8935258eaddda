#!/usr/bin/env bash
# A token of its own for a cloud cluster (Ray's token authentication): written to ~/.ray/augssl.token with mode 0600,
# outside the repository. infra/aws.yaml and gcp.yaml copy it to every node (file_mounts); your shell uses it with
#   export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.ray/augssl.token
# An existing token is kept (a running cluster holds it); pass --rotate to replace it (then `ray up` again).
set -euo pipefail
path=${AUGSSL_TOKEN_PATH:-$HOME/.ray/augssl.token}
if [ -s "$path" ] && [ "${1:-}" != "--rotate" ]; then echo "kept the token in $path (--rotate replaces it)"; exit 0; fi
mkdir -p "$(dirname "$path")"
umask 077
python3 -c 'import secrets; print(secrets.token_hex(32))' > "$path.tmp"
mv "$path.tmp" "$path"
echo "wrote a new token to $path (mode 0600); it is printed nowhere"
