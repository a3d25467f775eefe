#!/usr/bin/env bash
# The wheels a lent GPU's image lacks (its package list: the device tool's KINDS.md), fetched here into .whl/ (git-
# ignored) for Python 3.12 on manylinux x86_64, at requirements.lock's pins: papermill and the kernel stack the
# chapters run in, jupytext, and the transformers / peft / huggingface-hub / tokenizers memlab's family terms were
# verified against (the image's transformers is older). About 33 MB, under a device call's 64 MiB carry limit.
# scripts/gpu_session.sh installs them when .whl/ is there; the device call carries it: carry [".whl"].
# bitsandbytes stays out (its CUDA wheel alone is over the limit): the QLoRA GPU checks skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."
NAMES="papermill nbclient nbformat jupytext ipykernel jupyter-client jupyter-core traitlets pyzmq tornado comm debugpy
ipython ipython-pygments-lexers jedi parso matplotlib-inline prompt-toolkit wcwidth stack-data asttokens executing
pure-eval pexpect ptyprocess nest-asyncio2 fastjsonschema jsonschema jsonschema-specifications referencing rpds-py attrs
tenacity entrypoints mdit-py-plugins markdown-it-py mdurl tomlkit transformers peft huggingface-hub tokenizers"
pins=()
for name in $NAMES; do
  pin=$(grep -oiE "^${name}==[^ ;\\]+" requirements.lock | head -1) || { echo "no pin for $name in requirements.lock" >&2; exit 1; }
  pins+=("$pin")
done
rm -rf .whl && mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
echo "fetch_device_wheels: $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
