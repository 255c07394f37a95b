#!/bin/sh
# Entrypoint of the bundled PostgreSQL image. On an empty PGDATA: initdb with the superuser
# password from POSTGRES_PASSWORD_FILE (or POSTGRES_PASSWORD), password (SCRAM) logins from any
# address, and POSTGRES_DB created. Then the server runs as PID 1 on every address, with its
# sockets in /var/run/postgresql (the root filesystem is read-only). Extra arguments go to postgres.
set -eu
: "${PGDATA:?PGDATA must name the data directory}"
user=${POSTGRES_USER:-postgres}
sockets=/var/run/postgresql

# One server on the data directory at a time, whatever the pods. A StatefulSet makes its pod
# again as soon as the old one leaves the API, and a forced deletion (--grace-period=0 --force)
# does not wait for the old containers to stop: the new server started on the volume while the
# old one still committed, and the commits only the old one's WAL held were lost (the cluster's
# fault run, docs/faults.md). postmaster.pid cannot tell: the old server lives in another PID
# namespace. So the server holds a lock on a file beside PGDATA, taken here and kept across
# `exec` (fd 9, inherited by every server process), and the next server waits for it: it is
# released when the old server's last process has exited.
lock="$(dirname "$PGDATA")/.postgres-server.lock"
exec 9>>"$lock"
if ! flock --nonblock 9; then
  echo "postgres-entrypoint: another server holds $lock; waiting until it has exited" >&2
  flock 9
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=${POSTGRES_PASSWORD_FILE:-}
  if [ -z "$pwfile" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
      echo "postgres-entrypoint: set POSTGRES_PASSWORD_FILE or POSTGRES_PASSWORD" >&2
      exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  elif [ ! -r "$pwfile" ]; then
    echo "postgres-entrypoint: POSTGRES_PASSWORD_FILE names $pwfile, which cannot be read" >&2
    exit 1
  fi
  initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" --encoding=UTF8 \
    --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 --no-instructions
  [ "$pwfile" = "${POSTGRES_PASSWORD_FILE:-}" ] || rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  db=${POSTGRES_DB:-$user}
  if [ "$db" != postgres ]; then
    # Started on its socket only, so no client can connect before the database exists.
    pg_ctl --pgdata="$PGDATA" --wait --silent \
      --options="-c listen_addresses='' -c unix_socket_directories=$sockets" start
    createdb --host="$sockets" --username="$user" "$db"
    pg_ctl --pgdata="$PGDATA" --wait --silent --mode=fast stop
  fi
fi

exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories="$sockets" "$@"
