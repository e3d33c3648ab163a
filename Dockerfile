# One image for every kube-vgpu process: the admission webhook (`kube-vgpu webhook`), the node
# plugin (`kube-vgpu node`) and the certificate hook Jobs (`kube-vgpu certs`).
#
#   docker build -t <registry>/kube-vgpu:0.1.0 .
#
# HAMi-core (libvgpu.so, the CUDA interposer that enforces hami-core memory and SM limits) is not
# part of this image and not built here. The node plugin only mounts it into GPU containers from
# the host folder config.node.hookPath (default /usr/local/vgpu), so it must already lie there:
# installed by the admin, by HAMi's or Volcano's vGPU device-plugin image, or by the chart's
# optional initContainer (node.hamiCoreInstaller), which copies it from such an image.

# Build stage: install the project and its dependencies into a virtual environment.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# .dockerignore keeps the context to what `pip install .` needs.
COPY . .
RUN python -m venv /opt/kube-vgpu \
 && /opt/kube-vgpu/bin/pip install . \
 && /opt/kube-vgpu/bin/kube-vgpu --help > /dev/null

# Runtime stage: the same Python, the virtual environment, and an unprivileged user.
FROM python:3.11-slim
ENV PATH=/opt/kube-vgpu/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/kube-vgpu /opt/kube-vgpu
# A numeric USER lets the kubelet verify runAsNonRoot; the chart runs the webhook and the
# certificate Jobs as this UID (nonRootUser) and only the node plugin as root.
RUN groupadd --system --gid 10001 kube-vgpu \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kube-vgpu
USER 10001:10001
ENTRYPOINT ["kube-vgpu"]
CMD ["--help"]
