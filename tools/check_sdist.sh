#!/usr/bin/env bash
# The route a user takes from a source release: build the sdist, build a wheel from it against
# the torch already installed (--no-build-isolation, as README says), install that wheel into a
# fresh venv that sees torch but not this checkout, and run tests against the installed copy,
# the benchmark on a user's model from a folder outside the tree among them.
# Usage: tools/check_sdist.sh [PYTHON]  (default .venv/bin/python: it has torch, build, pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PY" -m build --sdist --no-isolation --outdir "$WORK/dist" . > "$WORK/sdist.log" 2>&1 \
  || { tail -40 "$WORK/sdist.log"; exit 1; }
SDIST="$(ls "$WORK"/dist/fused_amp-*.tar.gz)"
LISTING="$(tar tzf "$SDIST")"
echo "sdist: $(basename "$SDIST") ($(wc -l <<< "$LISTING") files)"
# every file the build and the package need, the CUDA sources among them
for f in $(git ls-files csrc fused_amp setup.py pyproject.toml README.md); do
  grep -q "/$f\$" <<< "$LISTING" || { echo "sdist lacks $f"; exit 1; }
done

# CPU-only, and of the CPU kernels the portable ones and this CPU's: make build has compiled the
# same CUDA sources and the other instruction set's kernels (the listing above says they are all
# there), and this build on CI's two cores took 15 minutes with them
FUSED_AMP_CUDA=0 FUSED_AMP_CPU_KERNELS=native MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  "$PY" -m pip wheel --no-build-isolation --no-deps -w "$WORK/wheel" "$SDIST" \
  > "$WORK/wheel.log" 2>&1 || { grep -E -A5 "error|Error" "$WORK/wheel.log" | tail -60; exit 1; }
WHEEL="$(ls "$WORK"/wheel/fused_amp-*.whl)"
echo "wheel built from the sdist: $(basename "$WHEEL")"

# a venv that sees the build venv's packages (torch, pytest) as a plain path: not its .pth
# files, so this checkout's editable install stays out of it
python3 -m venv "$WORK/venv"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
NEW_SITE="$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SITE" > "$NEW_SITE/build-venv.pth"
"$WORK/venv/bin/python" -m pip install --no-deps --no-index -q "$WHEEL"
cd "$WORK"
"$WORK/venv/bin/python" -c "
import fused_amp, sys
assert fused_amp.__file__.startswith('$WORK/venv'), fused_amp.__file__
print('installed from the wheel:', fused_amp.__file__, fused_amp.build_info())"
# the quick tier: the installed copy works; the whole matrix ran against the build already
FUSED_AMP_TEST_TIER=quick "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$OLDPWD/tests/test_unscale.py" "$OLDPWD/tests/test_clip.py" "$OLDPWD/tests/test_benchmark_cli.py"
