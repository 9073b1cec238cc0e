#!/usr/bin/env bash
# One event per transaction, three ways, by pgbench (8 clients, 8 s each, prepared), in the order
# raw, unnest, values, values, unnest, raw, on a scratch database migrated with ordo's migrations
# (each file in one transaction, as sqlx runs them). Figures: docs/performance-history.md, "Publishing a single
# event". Needs psql, pgbench, createdb and dropdb on PATH and a server at PGHOST (127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")"
export PGHOST="${PGHOST:-127.0.0.1}" PGUSER="${PGUSER:-postgres}"
db="ordo_pgbench_$$"
createdb "$db"
trap 'dropdb --if-exists "$db"' EXIT
for f in ../../../migrations/*.sql; do
    psql -q -1 -v ON_ERROR_STOP=1 -d "$db" -f "$f" >/dev/null
done
for s in raw unnest values values unnest raw; do
    printf '%-7s ' "$s"
    pgbench -n -M prepared -c 8 -j 2 -T 8 -f "$s.sql" "$db" 2>&1 | grep 'tps ='
done
