#!/usr/bin/env bash
# Build a base image for the Dockerfile from Debian 12's own packages (python3 3.11, its venv module,
# CA certificates), for machines that reach Debian's mirror but no image registry. Needs mmdebstrap and a
# running Docker daemon. Usage: docker/debian-base.sh [TAG] [CA_BUNDLE]
# CA_BUNDLE (optional): a CA certificate bundle that replaces the image's, for networks whose TLS is
# intercepted by a proxy; pip inside the image then trusts it too.
set -euo pipefail
tag="${1:-embedrank-base:bookworm}"
bundle="${2:-}"
hooks=()
changes=()
if [[ -n "$bundle" ]]; then
    hooks=(--customize-hook="upload $bundle /etc/ssl/certs/ca-certificates.crt")
    changes=(--change "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt")
fi
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates "${hooks[@]}" bookworm - \
    | docker import "${changes[@]}" --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "$tag"
