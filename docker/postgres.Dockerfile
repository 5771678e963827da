# PostgreSQL 15 from Debian bookworm, for the one-box compose stack on machines that cannot
# (or should not) pull a registry image; any PostgreSQL 13+ serves equally well.
#     docker/build.sh --base IMAGE postgres
# Environment (as the official image): POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB;
# data in /var/lib/postgresql/data (mount a volume there).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# The package would create and start a default cluster; the entrypoint makes its own.
# Unpinned apt versions on purpose (see docker/Dockerfile).
# A fixed uid (the official image's) so volumes keep their owner across rebuilds.
# hadolint ignore=DL3008
RUN groupadd --system --gid 999 postgres \
    && useradd --system --uid 999 --gid postgres --home-dir /var/lib/postgresql \
        --shell /bin/sh postgres \
    && mkdir -p /etc/postgresql-common/createcluster.d \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/no-main.conf \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        postgresql-15 tini \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data
COPY --chmod=0755 docker/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
USER 999:999
EXPOSE 5432
STOPSIGNAL SIGINT
HEALTHCHECK --interval=2s --timeout=5s --retries=30 CMD ["pg_isready", "-h", "127.0.0.1"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/postgres-entrypoint"]
