# syntax=docker/dockerfile:1
# quotad: multi-stage build. The migrations are compiled into the binary (include_str!), so the
# runtime image needs nothing but the binary; migrations/ and cql/ are copied for people who
# apply the schema by hand with cqlsh.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# BuildKit cache mounts keep the registry and target dir between builds; the binary is copied
# out of the cached target dir because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin quotad \
    && cp target/release/quotad /usr/local/bin/quotad

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/quotad --create-home quotad
COPY --from=build /usr/local/bin/quotad /usr/local/bin/quotad
COPY migrations /usr/share/quotad/migrations
COPY cql /usr/share/quotad/cql
USER quotad
WORKDIR /var/lib/quotad
# Listening on every address, `serve` refuses to start with checks open: give it a check token
# (QUOTAD__AUTH__CHECK_TOKEN or QUOTAD__AUTH__CHECK_TOKEN_FILE), docs/operations.md#securing-quotad.
ENV QUOTAD__SERVER__BIND=0.0.0.0:8080 \
    QUOTAD__STORE__PATH=/var/lib/quotad/data
EXPOSE 8080
# SIGTERM drains pending hits to the store before exit (give it time: stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/quotad"]
CMD ["serve"]
