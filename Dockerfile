# syntax=docker/dockerfile:1
#
# The durallm binary (the worker and the client commands: run, start,
# status, cancel, reconcile, list, codec-server) in a small non-root image.
# It is the production build (-tags nodev): no embedded Temporal server, no
# chaos harness, no demo provider (47 MB instead of 176 MB; docs/deploy.md).
#
#   docker build -t durallm:local .
#   docker run --rm durallm:local --help
#
# The fault-injecting demo provider of docker-compose.yml is a development
# tool, so it has an image of its own, built from the full binary:
#
#   docker build --target demo -t durallm-demo:local .
#
# The images are pinned by tag. Distroless publishes no version tags, so for
# an immutable build pin its digests too, e.g.
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot
# and pass --build-arg RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:...
ARG GO_IMAGE=golang:1.26.8-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot
# Only its statically linked busybox is used, for the HTTP health probe.
ARG PROBE_IMAGE=gcr.io/distroless/static-debian12:debug-nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
# CGO_ENABLED=0: a static binary that runs on distroless/static. Nothing in
# the build needs cgo: the embedded Temporal server's SQLite driver is
# modernc.org/sqlite (pure Go), and net and os/user fall back to their Go
# implementations.
ENV CGO_ENABLED=0 \
    GOFLAGS=-trimpath
# Modules first, in their own layer, so a source edit does not download
# them again. The cache mounts keep the module and build caches across
# builds without putting them in any layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -tags nodev -ldflags='-s -w' -o /out/durallm ./cmd/durallm
# The state directory (journal, result store) the compose workers share
# through a volume; distroless has no shell to create it later.
RUN mkdir -p /out/state

# The full binary, for the demo image only.
FROM build AS build-demo
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags='-s -w' -o /out/durallm-demo ./cmd/durallm

FROM ${PROBE_IMAGE} AS probe

# The demo provider (docker-compose.yml's demo-provider service). Not the
# default target: the last stage below is.
FROM ${RUNTIME_IMAGE} AS demo
COPY --from=build-demo /out/durallm-demo /durallm
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/durallm", "demo-provider"]

FROM ${RUNTIME_IMAGE}
# distroless/static carries the CA certificates the worker needs to verify
# providers' TLS, tzdata and a "nonroot" user (65532); no shell.
COPY --from=probe /busybox/busybox /usr/local/bin/busybox
COPY --from=build /out/durallm /durallm
COPY --from=build --chown=65532:65532 /out/state /var/lib/durallm
USER 65532:65532
# The worker's /metrics, /healthz and /readyz, once started with
# --metrics-addr 0.0.0.0:9090 (its default, 127.0.0.1:9090, is unreachable
# from outside the container).
EXPOSE 9090
# No HEALTHCHECK here: the same image runs one-shot client commands
# (run, status, list, ...). docker-compose.yml probes workers with
#   /usr/local/bin/busybox wget -q -O /dev/null http://127.0.0.1:9090/readyz
ENTRYPOINT ["/durallm"]
CMD ["--help"]
