#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster for the tests marked postgres (workers sharing a sweep
# study: tests/test_sweeps_end_to_end.py, test_sweeps_chaos.py, test_sweep_enqueue.py): a
# fresh cluster in a temp dir, listening on 127.0.0.1 only, on a free port, trust auth, one
# database. Prints the SQLAlchemy URL on stdout; the stop command goes to stderr (and to
# <dir>/stop.sh). As root, the server runs as the `postgres` user.
#   scripts/start_postgres.sh [DIR]     (DIR: an empty directory to hold it; default a new temp dir)
#   export ROOKWORLD_PG_URL=$(bash scripts/start_postgres.sh)
set -euo pipefail
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$PGBIN/initdb" ] || { echo "start_postgres: no initdb (apt-get install postgresql)" >&2; exit 1; }
dir=${1:-$(mktemp -d /tmp/rookworld-pg.XXXXXX)}
mkdir -p "$dir"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
if [ "$(id -u)" = 0 ]; then
  chown postgres "$dir"
  as_server() { su postgres -s /bin/sh -c "$1"; }
else
  as_server() { sh -c "$1"; }
fi
as_server "'$PGBIN/initdb' -D '$dir/data' -U rookworld --auth=trust -E UTF8 >'$dir/initdb.log' 2>&1"
as_server "'$PGBIN/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -o \"-h 127.0.0.1 -p $port -k '$dir'\" start >/dev/null"
as_server "'$PGBIN/createdb' -h 127.0.0.1 -p $port -U rookworld rookworld"
stop="$(declare -f as_server); as_server \"'$PGBIN/pg_ctl' -D '$dir/data' -m fast stop\""
echo "$stop" >"$dir/stop.sh"
echo "start_postgres: server in $dir; stop it with: bash $dir/stop.sh" >&2
echo "postgresql+psycopg://rookworld@127.0.0.1:$port/rookworld"
