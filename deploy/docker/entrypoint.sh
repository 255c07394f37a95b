#!/bin/sh
# Entrypoint of every Event OS image. Secrets arrive as files (mounted Kubernetes Secrets): for
# each VAR below whose VAR_FILE is set, VAR is exported from the file, so no secret is ever
# written into a pod spec. Then the command runs as PID 1.
set -eu
for var in EVENTOS_DATABASE_URL EVENTOS_ADMIN_TOKEN EVENTOS_INTERNAL_TOKEN; do
  eval "file=\${${var}_FILE:-}"
  if [ -n "$file" ]; then
    if [ ! -r "$file" ]; then
      echo "entrypoint: ${var}_FILE names $file, which cannot be read" >&2
      exit 1
    fi
    value=$(cat "$file")
    export "$var=$value"
    unset "${var}_FILE"
  fi
done
exec "$@"
