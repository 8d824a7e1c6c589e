# scepsy's image: the workflow entry that `scepsy manifests` emits (scepsy proxy --workflow-priority)
# and the controller (`scepsy manifests --controller`). Build it from the repository's root and push
# it where the cluster pulls from:
#   docker build -t ghcr.io/scepsy/scepsy:0.1.0 .
# (the manifests' default entry image, k8s/entry.py; another name: scepsy manifests --entry-image).
FROM python:3.11-slim
# the tracing extra serves the entry (aiohttp, uvloop), k8s and control the controller
COPY . /src
RUN pip install --no-cache-dir "/src[tracing,k8s,control]" && rm -rf /src
# the user the entry's and the controller's pods run as (runAsUser/runAsGroup 65532, read-only root)
USER 65532:65532
EXPOSE 9000
ENTRYPOINT ["scepsy"]
CMD ["--help"]
