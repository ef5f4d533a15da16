#!/bin/sh
# Waits for the Temporal frontend to serve, then makes sure the namespace
# exists. Runs in temporalio/admin-tools as a one-shot job; safe to run
# again: an existing namespace is left as it is (its retention included).
#
#   TEMPORAL_ADDRESS     frontend host:port (required)
#   TEMPORAL_NAMESPACE   namespace to create (default: default)
#   NAMESPACE_RETENTION  retention of closed workflows for a new namespace (default: 72h)
#
# The temporal CLI also reads TEMPORAL_TLS_* and TEMPORAL_API_KEY from the
# environment, so the same script works against a TLS cluster.
set -eu

: "${TEMPORAL_ADDRESS:?set TEMPORAL_ADDRESS}"
NAMESPACE=${TEMPORAL_NAMESPACE:-default}
RETENTION=${NAMESPACE_RETENTION:-72h}
ATTEMPTS=${ATTEMPTS:-60}

n=0
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1; do
	n=$((n + 1))
	if [ "$n" -ge "$ATTEMPTS" ]; then
		echo "temporal-namespace: $TEMPORAL_ADDRESS not serving after $n checks:" >&2
		temporal operator cluster health --address "$TEMPORAL_ADDRESS" >&2 || true
		exit 1
	fi
	sleep 2
done
echo "temporal-namespace: $TEMPORAL_ADDRESS is serving"

if temporal operator namespace describe --address "$TEMPORAL_ADDRESS" --namespace "$NAMESPACE" >/dev/null 2>&1; then
	echo "temporal-namespace: namespace $NAMESPACE already exists; left as it is"
	exit 0
fi
if ! out=$(temporal operator namespace create --address "$TEMPORAL_ADDRESS" \
	--namespace "$NAMESPACE" --retention "$RETENTION" 2>&1); then
	# Another run may have created it between the describe and the create.
	case $out in
	*"already exists"* | *AlreadyExists*) ;;
	*)
		printf '%s\n' "$out" >&2
		exit 1
		;;
	esac
fi
printf '%s\n' "$out"
echo "temporal-namespace: namespace $NAMESPACE ready (retention $RETENTION for a new one)"
