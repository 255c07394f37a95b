#!/bin/sh
# Entrypoint of every Event OS image. Secrets arrive as files (mounted Kubernetes Secrets): for
# each VAR below whose VAR_FILE is set, VAR is exported from the file, so no secret is ever
# written into a pod spec. EVENTOS_ADMIN_TOKEN_FILE stays set too: ingress re-reads that file
# when the Secret rotates (the kubelet updates the mounted file; docs/security.md, "Rotating
# secrets"). Then the command runs as PID 1.
set -eu
for var in EVENTOS_DATABASE_URL EVENTOS_ADMIN_TOKEN EVENTOS_INTERNAL_TOKEN EVENTOS_OUTBOX_KEYS; do
  eval "file=\${${var}_FILE:-}"
  if [ -n "$file" ]; then
    if [ ! -r "$file" ]; then
      echo "entrypoint: ${var}_FILE names $file, which cannot be read" >&2
      exit 1
    fi
    value=$(cat "$file")
    export "$var=$value"
    [ "$var" = EVENTOS_ADMIN_TOKEN ] || unset "${var}_FILE"
  fi
done
exec "$@"
