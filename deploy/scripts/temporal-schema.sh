#!/bin/sh
# Creates Temporal's two PostgreSQL databases (persistence and visibility)
# and brings their schemas up to the version shipped in this admin-tools
# image, then exits. Runs in temporalio/admin-tools as a one-shot job.
#
# Safe to run again, which is how an upgrade gets its schema changes (run
# the new admin-tools image before the new server image):
#   * create-database treats "already exists" as success (postgres plugin,
#     common/persistence/sql/sqlplugin/postgresql/admin.go in server v1.32);
#   * setup-schema -v 0.0 only creates the schema_version tables if missing
#     and never lowers a recorded version;
#   * update-schema applies only the versions above the recorded one.
#
# Connection settings come from the environment temporal-sql-tool reads:
# SQL_PLUGIN, SQL_HOST, SQL_PORT, SQL_USER, SQL_PASSWORD.
set -eu

: "${SQL_PLUGIN:=postgres12}"
: "${SQL_HOST:?set SQL_HOST}"
: "${SQL_PORT:=5432}"
: "${SQL_USER:?set SQL_USER}"
: "${SQL_PASSWORD:?set SQL_PASSWORD}"
export SQL_PLUGIN SQL_HOST SQL_PORT SQL_USER SQL_PASSWORD

DB_NAME=${DB_NAME:-temporal}
VISIBILITY_DB_NAME=${VISIBILITY_DB_NAME:-temporal_visibility}
# The versioned schema directories inside the admin-tools image.
SCHEMA_DIR=${SCHEMA_DIR:-/etc/temporal/schema/postgresql/v12}

setup() { # setup DATABASE SCHEMA_SUBDIR
	echo "temporal-schema: database $1 ($2)"
	temporal-sql-tool --db "$1" create-database
	temporal-sql-tool --db "$1" setup-schema -v 0.0
	temporal-sql-tool --db "$1" update-schema -d "$SCHEMA_DIR/$2/versioned"
}

setup "$DB_NAME" temporal
setup "$VISIBILITY_DB_NAME" visibility
echo "temporal-schema: done"
