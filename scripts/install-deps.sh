#!/usr/bin/env bash
# Installs the Debian packages offgraph builds with, when any is missing.
# Usage: scripts/install-deps.sh [--fuzz]   (--fuzz adds clang and libFuzzer)
set -euo pipefail
# python3-venv: a venv with pip, which `pip install .` of the Python package (python/) needs (its build
# backend is in the repository: neither setuptools nor wheel)
# python3-jsonschema: the validator constrained outputs are checked with (tests/grammar/validate.py)
pkgs=(cmake make gcc pkg-config libcjson-dev libopenblas-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libedit-dev libxxhash-dev python3
      python3-venv python3-jsonschema)
if [[ "${1:-}" == "--fuzz" ]]; then pkgs+=(clang libclang-rt-dev); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "offgraph: installing Debian packages: ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
