#!/usr/bin/env bash
# A real PostgreSQL for the tests of workers sharing one study: initdb and the server as
# the postgres user, in a folder of its own, on a loopback port (trust auth, loopback only).
# Usage: scripts/ci/postgres_local.sh DIR [PORT]   (prints the URL to export as TUNER_TEST_POSTGRES)
set -euo pipefail
dir=${1:?usage: postgres_local.sh DIR [PORT]}
port=${2:-55432}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
user=postgres
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home "$user"
mkdir -p "$dir"
chown "$user" "$dir"
as() { if [ "$(id -un)" = "$user" ]; then "$@"; else runuser -u "$user" -- "$@"; fi; }
if [ ! -s "$dir/data/PG_VERSION" ]; then
  as "$bin/initdb" -D "$dir/data" -U "$user" --auth=trust -E UTF8 >"$dir/initdb.log"
fi
if ! as "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
  as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
     -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200" start >/dev/null
fi
as "$bin/psql" -h 127.0.0.1 -p "$port" -U "$user" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='tuner'" \
  | grep -q 1 || as "$bin/createdb" -h 127.0.0.1 -p "$port" -U "$user" tuner
echo "postgresql://$user@127.0.0.1:$port/tuner"
