#!/bin/sh
# Registers durallm's search attributes (Keyword) in a namespace:
# DurallmState, DurallmOutcome, DurallmRoute. Workers started with
# --search-attributes (the default) need them.
#
# Safe to run again. The CLI fails only when a name exists with another
# type; with SQL visibility, server v1.32 skips an alias that already
# exists (service/frontend/operator_handler.go). With Elasticsearch
# visibility, a re-run may report "already exists", which is accepted here.
#
# Runs in the compose stack as a one-shot job (temporalio/admin-tools), or
# by hand against any cluster with the temporal CLI:
#   TEMPORAL_ADDRESS=temporal.internal:7233 TEMPORAL_NAMESPACE=prod \
#     sh deploy/scripts/register-search-attributes.sh
# (TEMPORAL_TLS_* and TEMPORAL_API_KEY are read by the CLI as usual.)
set -eu

: "${TEMPORAL_ADDRESS:?set TEMPORAL_ADDRESS}"
NAMESPACE=${TEMPORAL_NAMESPACE:-default}
ATTEMPTS=${ATTEMPTS:-30}

register() { # register NAME
	n=0
	while :; do
		if out=$(temporal operator search-attribute create --address "$TEMPORAL_ADDRESS" \
			--namespace "$NAMESPACE" --name "$1" --type Keyword 2>&1); then
			echo "register-search-attributes: $1 (Keyword) registered or already present"
			return 0
		fi
		case $out in
		*"different type"*)
			# Never retried: it needs a person to decide.
			printf '%s\n' "$out" >&2
			return 1
			;;
		*"already exists"*)
			echo "register-search-attributes: $1 already exists"
			return 0
			;;
		esac
		# A namespace created a moment ago can still be unknown to the
		# frontend that answers.
		n=$((n + 1))
		if [ "$n" -ge "$ATTEMPTS" ]; then
			printf '%s\n' "$out" >&2
			echo "register-search-attributes: giving up on $1 after $n attempts" >&2
			return 1
		fi
		sleep 2
	done
}

for name in DurallmState DurallmOutcome DurallmRoute; do
	register "$name"
done

# Check what the server now reports, whatever the path above.
list=$(temporal operator search-attribute list --address "$TEMPORAL_ADDRESS" --namespace "$NAMESPACE")
for name in DurallmState DurallmOutcome DurallmRoute; do
	if ! printf '%s\n' "$list" | grep -E "^[[:space:]]*${name}[[:space:]]+Keyword" >/dev/null; then
		echo "register-search-attributes: $name is not listed as Keyword in namespace $NAMESPACE:" >&2
		printf '%s\n' "$list" >&2
		exit 1
	fi
done

# The aliases live in the namespace record; every service refreshes its
# namespace cache every 2s (system.namespaceCacheRefreshInterval), as
# `durallm dev` also waits for before starting its worker.
sleep 3
echo "register-search-attributes: DurallmState, DurallmOutcome, DurallmRoute ready in namespace $NAMESPACE"
