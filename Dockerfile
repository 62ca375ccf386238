# One image for every process: worker, scheduler, the reference host, the web console
# (the `web` extra), the PostgreSQL session store (the `postgres` extra) and the one-shot
# commands (session, call, rebuild, health, status).
# Build from the repository root:
#
#     docker build -t dsh-tool-schedule .
#
# deploy/docker-compose.yml builds and runs it; deploy/README.md walks through it.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/dsh-schedule/venv
WORKDIR /src
# The whole context (less .dockerignore): dsh_schedule/ holds every layer as real files
# (the top-level shared, worker and scheduler are links into it), packed by the regular
# (not editable) install below.
COPY . .
# A lock file, when the repository has one, pins every dependency of the install.
RUN set -eu; \
    constraints=""; \
    for file in requirements.lock constraints.txt; do \
        if [ -f "$file" ]; then constraints="$constraints --constraint $file"; fi; \
    done; \
    /opt/dsh-schedule/venv/bin/pip install $constraints ".[web,postgres]" ; \
    /opt/dsh-schedule/venv/bin/dsh-schedule --version ; \
    /opt/dsh-schedule/venv/bin/python -c "import dsh_schedule.web.server"

FROM python:3.11-slim-bookworm
ENV PATH=/opt/dsh-schedule/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DSH_SCHEDULE_SESSIONS=/var/lib/dsh-schedule/sessions
# An unprivileged user that owns the session directory. A new named volume mounted there
# starts as a copy of it, owner included, so the processes can write their logs.
RUN groupadd --system --gid 10001 dsh-schedule \
 && useradd --system --uid 10001 --gid dsh-schedule --no-create-home \
        --home-dir /var/lib/dsh-schedule --shell /usr/sbin/nologin dsh-schedule \
 && mkdir -p /var/lib/dsh-schedule/sessions \
 && chown -R dsh-schedule:dsh-schedule /var/lib/dsh-schedule \
 && chmod 0750 /var/lib/dsh-schedule/sessions
COPY --from=build /opt/dsh-schedule/venv /opt/dsh-schedule/venv
WORKDIR /var/lib/dsh-schedule
VOLUME ["/var/lib/dsh-schedule/sessions"]
USER 10001:10001
CMD ["dsh-schedule", "--help"]
