# A derived worker image: the pinned worker image plus a team's extra packages, for code
# bundles that import what the worker image lacks. docker/build.sh builds it:
#     docker/build.sh user --requirements FILE [--from IMAGE] [--tag NAME:TAG]
# FILE is a hashed lock (every line `name==version --hash=sha256:...`, dependencies
# included), installed like the image's own lock: --require-hashes --no-deps, wheels only,
# so the image holds exactly the locked files or fails to build; `pip check` then fails a
# lock that misses a dependency. The build context holds only the lock.
ARG WORKER_IMAGE
FROM ${WORKER_IMAGE}
USER 0:0
COPY requirements.txt /etc/reprotrain/user-requirements.txt
# The CA bundle is an optional build secret for networks that intercept TLS.
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && chmod 644 /etc/reprotrain/user-requirements.txt \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: -r /etc/reprotrain/user-requirements.txt \
    && /opt/venv/bin/pip check
# The worker image's job user again: jobs never run as root.
USER 10001:10001
ARG WORKER_REFERENCE=unknown
ARG WORKER_ID=unknown
ARG LOCK_DIGEST=unknown
LABEL org.opencontainers.image.description="Reprotrain worker with extra packages from a hashed lock" \
      org.opencontainers.image.base.name="${WORKER_REFERENCE}" \
      org.opencontainers.image.base.digest="${WORKER_ID}" \
      io.reprotrain.requirements.digest="${LOCK_DIGEST}"
