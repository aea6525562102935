# One image for every console process (web, controller, ingest) and for the agent.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRAINYARD_HOME=/data

RUN apt-get update \
    && apt-get install -y --no-install-recommends curl procps \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies first, so a code change does not reinstall torch.
COPY pyproject.toml README.md ./
RUN mkdir -p console workers && touch console/__init__.py workers/__init__.py \
    && pip install . && pip uninstall -y trainyard
COPY manage.py ./
COPY console ./console
COPY workers ./workers
COPY templates ./templates
COPY frontend ./frontend
RUN pip install --no-deps -e . \
    && useradd --create-home --uid 1000 trainyard \
    && mkdir -p /data && chown trainyard /data
USER trainyard
EXPOSE 8000
CMD ["python", "-m", "console.webserver", "-b", "0.0.0.0", "-p", "8000", "console.asgi:application"]
