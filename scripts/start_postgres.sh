#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster in a temporary directory and print its URL on stdout.
#
#   export ATHANOR_TEST_POSTGRES_URL=$(scripts/start_postgres.sh)
#   pytest tests/unit/store
#   scripts/start_postgres.sh --stop "$ATHANOR_TEST_POSTGRES_URL"   # or: pg_ctl -D DIR stop (printed on stderr)
#
# The cluster trusts local connections (it is for tests only), listens on 127.0.0.1 at a free port
# and on a unix socket in its directory. Needs the PostgreSQL server binaries (initdb, pg_ctl):
# `apt-get install -y postgresql` on Debian/Ubuntu. As root it runs the server as the `postgres`
# user, since PostgreSQL refuses to run as root.
set -euo pipefail

find_bin() {
    if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return; fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -z "$found" ]]; then
        echo "start_postgres.sh: $1 not found; install the server (apt-get install -y postgresql)" >&2
        exit 1
    fi
    echo "$found"
}

INITDB=$(find_bin initdb)
PG_CTL=$(find_bin pg_ctl)

if [[ "${1:-}" == "--stop" ]]; then
    dir=$(cat "${TMPDIR:-/tmp}/athanor-pg-last" 2>/dev/null || true)
    [[ -n "$dir" && -d "$dir/data" ]] || { echo "start_postgres.sh: no cluster to stop" >&2; exit 1; }
    as_owner=()
    [[ $(id -u) == 0 ]] && as_owner=(runuser -u postgres --)
    "${as_owner[@]}" "$PG_CTL" -D "$dir/data" -m fast stop >&2
    rm -rf "$dir"
    exit 0
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/athanor-pg.XXXXXX")
as_owner=()
user=$(id -un)
if [[ $(id -u) == 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$dir"
    as_owner=(runuser -u postgres --)
    user=postgres
fi

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

"${as_owner[@]}" "$INITDB" -D "$dir/data" -U "$user" --auth=trust --encoding=UTF8 --no-locale >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
"${as_owner[@]}" "$PG_CTL" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >&2 \
    || { cat "$dir/server.log" >&2; exit 1; }

echo "$dir" >"${TMPDIR:-/tmp}/athanor-pg-last"
echo "start_postgres.sh: cluster in $dir (stop: ${as_owner[*]} $PG_CTL -D $dir/data stop)" >&2
echo "postgresql://$user@127.0.0.1:$port/postgres"
