#!/usr/bin/env bash
# Creates (or reuses) a Python virtual environment with pinned packages, for the JAX side of
# qmesh. Idempotent: a stamp file records the requirements the venv was made from, and
# nothing is installed again while they are unchanged.
# Usage: launch/python_env.sh <venv dir> <requirements file>
set -euo pipefail
if [ $# -ne 2 ] || [ "${1:-}" = "--help" ]; then
  echo "usage: launch/python_env.sh <venv dir> <requirements file>" >&2
  echo "  creates <venv dir> with python3 -m venv and pip-installs the pinned requirements" >&2
  [ "${1:-}" = "--help" ] && exit 0 || exit 2
fi
venv=$1
requirements=$2
[ -f "$requirements" ] || { echo "python_env: no requirements file $requirements" >&2; exit 2; }
stamp="$venv/.qmesh-requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$requirements"; then
  echo "python_env: $venv is up to date ($requirements)"
  exit 0
fi
echo "python_env: installing $requirements into $venv"
python3 -m venv "$venv" ||
  { echo "python_env: python3 -m venv failed: install python3-venv (launch/install_deps.sh)" >&2; exit 1; }
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
cp "$requirements" "$stamp"
