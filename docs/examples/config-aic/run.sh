#!/usr/bin/env bash
# End to end from real data (docs/profiles.md): models given by their config.json, profiles
# synthesized with AIConfigurator's measured kernels on two GPU types, a heterogeneous plan, manifests.
# Needs the extra: pip install 'scepsy[aiconfigurator]'. Run from the repository root; it rewrites
# profiles/, plan.json and manifests/ here (python tests/shipped.py --check --only config-aic compares).
set -euo pipefail
E=docs/examples/config-aic
common=(--requests fixed:1024,256 --fractions 0.5,1.0 --engine-model aiconfigurator --backend vllm --database-version current)
scepsy profiles synthesize --model $E/models/Qwen3-8B --gpu H100 --tp 1 "${common[@]}" --out $E/profiles/qwen3-8b.csv
scepsy profiles synthesize --model $E/models/Qwen3-8B --gpu L40S --tp 1 "${common[@]}" --merge --out $E/profiles/qwen3-8b.csv
scepsy profiles synthesize --model $E/models/Qwen3-30B-A3B --gpu H100 --tp 1 "${common[@]}" --out $E/profiles/qwen3-30b-a3b.csv
scepsy plan $E/instance.yaml --out $E/plan.json
scepsy manifests $E/plan.json --out $E/manifests --engine vllm --gpu-sharing hami
