# HAProxy from Debian bookworm: one port in front of the compose stack's API replicas
# (deploy/compose/haproxy.cfg says how it routes and retries).
#     docker/build.sh --base IMAGE proxy
# Environment: REPRO_PROXY_BIND, REPRO_API_1, REPRO_API_2 (see the configuration).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# Unpinned apt versions on purpose (see docker/Dockerfile): Debian's security updates.
# A fixed system uid (made before the package would make one of its own) for a numeric USER.
# hadolint ignore=DL3008
RUN groupadd --system --gid 990 haproxy \
    && useradd --system --uid 990 --gid haproxy --home-dir /var/lib/haproxy \
        --shell /usr/sbin/nologin haproxy \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy tini \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/compose/haproxy.cfg /etc/haproxy/reprotrain.cfg
# The configuration must parse before the image exists.
RUN REPRO_PROXY_BIND=:8000 REPRO_API_1=127.0.0.1:1 REPRO_API_2=127.0.0.1:2 \
    haproxy -c -q -f /etc/haproxy/reprotrain.cfg
ENV REPRO_PROXY_BIND=:8000
USER 990:990
EXPOSE 8000
STOPSIGNAL SIGUSR1
HEALTHCHECK --interval=2s --timeout=5s --retries=60 \
    CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8000 && printf 'GET /proxy-health HTTP/1.0\\r\\n\\r\\n' >&3 && head -c 12 <&3 | grep -q ' 200'"]
ENTRYPOINT ["/usr/bin/tini", "--", "haproxy", "-W", "-db", "-f", "/etc/haproxy/reprotrain.cfg"]
