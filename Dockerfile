FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# The exact versions and hashes of the lock (`make lock`), then our package without resolving.
COPY requirements-runtime.lock ./
RUN pip install --require-hashes -r requirements-runtime.lock
COPY pyproject.toml README.md ./
COPY monitor monitor
COPY probes probes
COPY simulator simulator
RUN pip install --no-deps . && pip check
COPY . .
RUN SECRET_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(50))") FIELD_ENCRYPTION_KEYS=$(python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())") \
    DATABASE_URL=postgresql://build@localhost/build REDIS_URL=redis://localhost:6379/0 \
    python manage.py collectstatic --noinput
RUN useradd --create-home routewatch
USER routewatch
EXPOSE 8000
# The image's own command is a region worker (RW_REGION, RW_REGION_KEYS, REDIS_URL; see
# docs/remote-regions.md); the server's services set theirs (docker-compose.yml).
# `python -m monitor.region_worker health` is its health command.
CMD ["python", "-m", "monitor.region_worker", "run"]
