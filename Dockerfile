# Runsite: one image for web (Daphne) and worker (runagents) processes.
FROM python:3.12-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY requirements.txt .
RUN python -m venv /venv && /venv/bin/pip install -r requirements.txt
COPY . .
RUN DATABASE_URL=sqlite:////tmp/build.sqlite3 /venv/bin/python manage.py collectstatic --noinput

FROM python:3.12-slim
ENV PATH=/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --create-home --uid 10001 runsite
WORKDIR /app
COPY --from=build /venv /venv
COPY --from=build --chown=runsite:runsite /app /app
USER runsite
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD python -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status == 200 else 1)"
# Worker containers run: python manage.py runagents --concurrency 4
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "--proxy-headers", "runsite.asgi:application"]
